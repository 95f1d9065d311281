"""The optimizer step fused into the backward pass, as torch's tutorial on saving memory does it:
one Adam per parameter, held in a dict keyed by the parameter, each stepped (and its gradient
dropped) by a post-accumulate-grad hook as soon as that parameter's gradient is ready. The loop
itself calls no optimizer. A StepLR per optimizer, stepped each epoch; a shuffled DataLoader.
usage: optim_in_backward.py OUT [--epochs N]"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from common import finish, progress


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=4)
    args = parser.parse_args()

    torch.manual_seed(21)
    x = torch.randn(384, 16)
    y = (x[:, :4].sum(dim=1) > 0).long()
    loader = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.LayerNorm(32), nn.Linear(32, 2))

    optimizer_dict = {p: torch.optim.Adam([p], lr=3e-3, weight_decay=1e-4) for p in model.parameters()}
    schedulers = [torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.7) for opt in optimizer_dict.values()]

    def optimizer_hook(parameter) -> None:
        optimizer_dict[parameter].step()
        optimizer_dict[parameter].zero_grad()

    for p in model.parameters():
        p.register_post_accumulate_grad_hook(optimizer_hook)

    step, losses = 0, []
    for epoch in range(args.epochs):
        for xb, yb in loader:
            loss = F.cross_entropy(model(xb), yb)
            loss.backward()
            losses.append(loss.item())
            step += 1
            progress(step)
        for scheduler in schedulers:
            scheduler.step()
    finish(model=model.state_dict(), optimizers=[opt.state_dict() for opt in optimizer_dict.values()],
           losses=losses)


if __name__ == "__main__":
    main()
