"""Magnitude pruning in the middle of training, as torch's pruning tutorial does it: after a
warm-up, `prune.global_unstructured` takes 40% of the conv and linear weights (each weight
becomes `weight_orig` times a `weight_mask` buffer, recomputed by a forward pre-hook), training
goes on with the masks, and near the end `prune.remove` makes the pruning permanent. A small
CNN fed channels-last images, Adamax, gradient clipping by norm.
usage: prune_midrun.py OUT [--steps N]"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.nn.utils.prune as prune

from common import finish, progress


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 3, padding=1)
        self.conv2 = nn.Conv2d(6, 8, 3, padding=1)
        self.fc = nn.Linear(8 * 4 * 4, 5)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(x.flatten(1))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, default=80)
    args = parser.parse_args()

    torch.manual_seed(8)
    images = torch.randn(320, 1, 16, 16).contiguous(memory_format=torch.channels_last)
    targets = torch.randint(5, (320,))
    model = SmallCNN()
    optimizer = torch.optim.Adamax(model.parameters(), lr=2e-3)
    prunable = [(model.conv1, "weight"), (model.conv2, "weight"), (model.fc, "weight")]
    prune_at, remove_at = args.steps // 4, args.steps - args.steps // 5
    losses, sparsity = [], []
    for step in range(args.steps):
        if step == prune_at:
            prune.global_unstructured(prunable, pruning_method=prune.L1Unstructured, amount=0.4)
        if step == remove_at:
            for module, name in prunable:
                prune.remove(module, name)
        rows = torch.arange(step * 16, step * 16 + 16) % len(images)
        loss = F.cross_entropy(model(images[rows]), targets[rows])
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
        sparsity.append(float((model.fc.weight == 0).float().mean()))
        progress(step + 1)
    finish(model=model.state_dict(), optimizer=optimizer.state_dict(), losses=losses, sparsity=sparsity)


if __name__ == "__main__":
    main()
