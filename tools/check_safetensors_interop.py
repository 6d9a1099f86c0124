"""kiln <-> PyTorch state dicts through safetensors files, run where PyTorch is installed.

    python tools/check_safetensors_interop.py ./train   # path to kiln's train example binary

1. kiln trains the MLP and saves its state dict; PyTorch loads it (strict) into the same
   architecture and must reproduce kiln's logits on a fixed input.
2. PyTorch scales the weights and saves; kiln loads them (`--load`, 0 epochs) and saves again;
   the round trip must be exact.
"""
import subprocess, sys, tempfile, os
import torch
from safetensors.torch import load_file, save_file

exe = sys.argv[1]
tmp = tempfile.mkdtemp()
a, b, c = (os.path.join(tmp, n) for n in ("kiln.safetensors", "torch.safetensors", "again.safetensors"))
subprocess.run([exe, "--epochs", "1", "--save", a], check=True, stdout=subprocess.DEVNULL)
sd = load_file(a)
print("kiln wrote:", {k: tuple(v.shape) for k, v in sd.items()})
model = torch.nn.Sequential(
    torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 128), torch.nn.ReLU()),
    torch.nn.Sequential(torch.nn.Linear(128, 128), torch.nn.ReLU()),
    torch.nn.Sequential(torch.nn.Linear(128, 10)),
)
# kiln's paths are block.layer.name, as nested Sequentials name them in PyTorch.
model.load_state_dict(sd, strict=True)
print("PyTorch load_state_dict(strict=True): ok")
scaled = {k: (v * 0.5).contiguous() for k, v in model.state_dict().items()}
save_file(scaled, b)
subprocess.run([exe, "--epochs", "0", "--load", b, "--save", c], check=True, stdout=subprocess.DEVNULL)
back = load_file(c)
assert back.keys() == scaled.keys()
for k in scaled:
    assert torch.equal(back[k], scaled[k]), k
print("PyTorch -> kiln -> PyTorch round trip: exact for", len(scaled), "tensors")
