# PyTorch's figures for `resnet_memory --amp`: the CUDA memory notebook's ResNet-50 scenario
# (batch 1, soft labels, SGD momentum, 5 iterations) under autocast f16 + GradScaler. Run on a
# machine with PyTorch and torchvision: python3 tools/resnet_amp_memory_in_torch.py
import torch, torch.nn as nn, torchvision.models as models
dev = "cuda"; MiB = 2**20
print("torch", torch.__version__, torch.cuda.get_device_name())
for leak in (True, False):
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    model = models.resnet50().to(dev)
    inputs = torch.randn(1, 3, 224, 224, device=dev)
    labels = torch.rand_like(model(inputs))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
    scaler = torch.amp.GradScaler("cuda")
    loss_fn = nn.CrossEntropyLoss()
    row = []
    for i in range(5):
        torch.cuda.reset_peak_memory_stats()
        with torch.autocast("cuda", dtype=torch.float16):
            pred = model(inputs)
            loss = loss_fn(pred, labels)
        scaler.scale(loss).backward()
        scaler.step(optimizer); scaler.update()
        if not leak:
            optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        row.append(((torch.cuda.memory_allocated() - base) / MiB, (torch.cuda.max_memory_allocated() - base) / MiB))
    print(f"resnet50 b1 AMP {'forgot zero_grad' if leak else 'zero_grad(set_to_none)'}: " + ", ".join(f"({a:.1f}, {p:.1f})" for a, p in row))
    del model, optimizer, inputs, labels, pred, loss, scaler
