"""Changes to the model made at a phase change, in the ways scripts add them late: from
--phase-epoch on, a manual decay through a NumPy view of a weight (`numpy`), a shrink of a slice
of the head's rows through a view held since (`slice`), gradient clamps registered on every
parameter (`grad_hook`), or a forward hook that scales a layer's output (`forward_hook`); or the
other way round, a warmup's hook registered in setup and taken away with its handle then
(`remove_hook`).
With --dead-units, each epoch ends with an evaluation that counts the hidden layer's dead units
through a forward hook it registers on that layer and removes after, as feature probes do.
usage: late_hooks.py OUT MODE [--epochs N] [--phase-epoch N] [--dead-units]"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from common import finish, progress


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("mode", choices=["numpy", "slice", "grad_hook", "forward_hook", "remove_hook"])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--phase-epoch", type=int, default=2)
    parser.add_argument("--dead-units", action="store_true")
    args = parser.parse_args()

    torch.manual_seed(11)
    x = torch.randn(192, 10)
    y = (x[:, :3].sum(1) > 0).long()
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)
    model = nn.Sequential(nn.Linear(10, 24), nn.Tanh(), nn.Linear(24, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    decay_view = head_rows = None
    scale = 1.0
    warmup = None
    if args.mode == "remove_hook":
        warmup = model[1].register_forward_hook(damp_output)
    step, losses, dead = 0, [], []
    for epoch in range(args.epochs):
        if epoch == args.phase_epoch:
            if args.mode == "numpy":
                decay_view = model[0].weight.detach().numpy()
            elif args.mode == "slice":
                head_rows = model[2].weight.data[:1]
            elif args.mode == "grad_hook":
                for p in model.parameters():
                    p.register_hook(lambda g: g.clamp(-0.02, 0.02))
            elif args.mode == "remove_hook":
                warmup.remove()
            else:
                model[1].register_forward_hook(lambda module, inputs, output: output * scale)
        for xb, yb in loader:
            loss = F.cross_entropy(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if decay_view is not None:
                decay_view *= 0.98
            if head_rows is not None:
                head_rows.mul_(0.97)
            scale = 0.5 + 0.5 * ((step % 7) / 7)
            losses.append(loss.item())
            step += 1
            progress(step)
        if args.dead_units:
            dead.append(count_dead_units(model, x))
    finish(model=model.state_dict(), optimizer=optimizer.state_dict(), losses=losses, dead=dead)


def damp_output(module, inputs, output):
    return output * 0.5


def count_dead_units(model, x):
    """How many hidden units saturate on every input: read by a hook while it lasts."""
    seen = []
    handle = model[1].register_forward_hook(lambda module, inputs, output: seen.append(output.detach()))
    with torch.no_grad():
        model(x)
    handle.remove()
    return int((seen[0].abs() > 0.99).all(0).sum())


if __name__ == "__main__":
    main()
