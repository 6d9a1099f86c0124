# The `fragmentation` example's program in PyTorch: an MLP 784-2048-2048-10 on batch
# sizes cycling 256, 512, 256, 1024, then an LSTM cell (64 -> 512) unrolled over lengths cycling
# 16, 64, 32, 128 (batch 32), SGD momentum 0.9; per step reserved, allocated and the largest
# free cached block; at the end peak reserved / peak allocated. Each mode in a fresh process
# (PYTORCH_CUDA_ALLOC_CONF is read at CUDA's start). Run on a CUDA machine:
#   python3 tools/fragmentation_in_torch.py [STEPS]
# The same program means the same tensors: the LSTM cell is written with the ops of kiln's
# `LstmCell::step` (PyTorch's fused cell saves other tensors), and cuBLAS gets no workspace
# (CUBLAS_WORKSPACE_CONFIG=:0:0; its workspaces come from the caching allocator and would add a
# constant kiln does not have).
import os, subprocess, sys

def run(expandable, steps):
    if expandable:
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":0:0")
    os.environ.setdefault("CUBLASLT_WORKSPACE_SIZE", "0")
    import torch
    dev = "cuda"
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(784, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 2048),
                              torch.nn.ReLU(), torch.nn.Linear(2048, 10)).to(dev)
    lstm = torch.nn.LSTMCell(64, 512).to(dev)

    def cell(x, state):
        # kiln's LstmCell::step, op for op.
        h, c = state
        gates = (x @ lstm.weight_ih.t() + lstm.bias_ih) + (h @ lstm.weight_hh.t() + lstm.bias_hh)
        i, f, g, o = gates.chunk(4, 1)
        i, f, g, o = i.sigmoid(), f.sigmoid(), g.tanh(), o.sigmoid()
        c2 = f * c + i * g
        return o * c2.tanh(), c2
    opt = torch.optim.SGD(list(mlp.parameters()) + list(lstm.parameters()), lr=0.01, momentum=0.9)
    torch.cuda.reset_peak_memory_stats()
    def largest_free():
        return max([b["size"] for s in torch.cuda.memory_snapshot() for b in s["blocks"]
                    if b["state"] == "inactive"] or [0])
    def report(what):
        torch.cuda.synchronize()
        print(f"  {what:<14} reserved {torch.cuda.memory_reserved()/2**20:10.2f} MiB  allocated "
              f"{torch.cuda.memory_allocated()/2**20:10.2f} MiB  largest free {largest_free()/2**20:10.2f} MiB")
    for step in range(steps):
        n = [256, 512, 256, 1024][step % 4]
        x = torch.randn(n, 784, device=dev)
        y = torch.arange(n, device=dev) % 10
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(mlp(x), y)
        loss.backward()
        opt.step()
        report(f"mlp {step:>3} b{n}")
    for step in range(steps):
        t = [16, 64, 32, 128][step % 4]
        h = torch.zeros(32, 512, device=dev); c = torch.zeros(32, 512, device=dev)
        opt.zero_grad(set_to_none=True)
        for _ in range(t):
            h, c = cell(torch.randn(32, 64, device=dev), (h, c))
        loss = torch.nn.functional.mse_loss(h, torch.zeros(32, 512, device=dev))
        loss.backward()
        opt.step()
        report(f"lstm {step:>3} t{t}")
    pr, pa = torch.cuda.max_memory_reserved(), torch.cuda.max_memory_allocated()
    label = "expandable" if expandable else "segments"
    print(f"{label:>10}: peak reserved {pr/2**20:.2f} MiB, peak allocated {pa/2**20:.2f} MiB: "
          f"reserved / allocated {pr/pa:.3f}")

if __name__ == "__main__":
    steps = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1] != "--one" else 16
    if "--one" in sys.argv:
        run(sys.argv[-1] == "1", int(sys.argv[-2]))
    else:
        for e in (0, 1):
            print("\nexpandable" if e else "segments")
            sys.stdout.flush()
            subprocess.run([sys.executable, __file__, "--one", str(steps), str(e)], check=True)
