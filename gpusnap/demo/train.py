"""The demo's training program: an ordinary script that knows nothing of gpusnap.

A small convolutional classifier on synthetic images (no download), a shuffled DataLoader
with two worker processes, AdamW and a cosine schedule. It writes the step it reached to
OUT/progress (so the demo knows when to interrupt it) and its final weights to OUT/final.pt.
usage: train.py OUT [EPOCHS]
"""
import os
import sys
import time

import torch
from torch import nn

out = sys.argv[1]
epochs = int(sys.argv[2]) if len(sys.argv) > 2 else 4
torch.manual_seed(0)

images = torch.randn(2048, 1, 16, 16)
labels = (images.mean(dim=(1, 2, 3)) > 0).long() + 2 * (images[:, :, :8].mean(dim=(1, 2, 3)) > 0).long()
loader = torch.utils.data.DataLoader(
    torch.utils.data.TensorDataset(images, labels), batch_size=32, shuffle=True, num_workers=2
)
model = nn.Sequential(
    nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
    nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
    nn.Flatten(), nn.Linear(32 * 4 * 4, 64), nn.ReLU(), nn.Linear(64, 4),
)
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=epochs * len(loader))

step = 0
for epoch in range(epochs):
    correct = 0
    for x, y in loader:
        logits = model(x)
        loss = nn.functional.cross_entropy(logits, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        correct += (logits.argmax(1) == y).sum().item()
        step += 1
        with open(os.path.join(out, "progress"), "w") as f:
            f.write(str(step))
        time.sleep(0.02)  # stands in for a bigger model: gives the demo time to interrupt
    print(f"epoch {epoch}: loss {loss.item():.4f} accuracy {correct / len(images):.3f}", flush=True)

torch.save(model.state_dict(), os.path.join(out, "final.pt"))
