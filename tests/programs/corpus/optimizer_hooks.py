"""Work hung on the optimizer's step hooks once warmup is over, as scripts that bolt an EMA or a
constraint onto a finished recipe do: after --warmup epochs, `optimizer.register_step_post_hook`
gets an exponential moving average of the weights (the averaged copy is not trained, so nothing
but the hook touches it), and `register_step_pre_hook` a counter of the steps it saw. An MLP with
AdamW and a shuffled DataLoader; the average, the count and the model are the output.
usage: optimizer_hooks.py OUT [--epochs N] [--warmup E] [--hook ema|clip]

--hook clip instead clamps the weights to [-0.25, 0.25] after each step (a weight constraint as
WGAN critics keep), so the hook changes what the optimizer trains."""
import argparse
import copy

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from common import finish, progress


class StepCounter:
    def __init__(self):
        self.steps = 0

    def __call__(self, optimizer, args, kwargs):
        self.steps += 1


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--hook", choices=["ema", "clip"], default="ema")
    args = parser.parse_args()

    torch.manual_seed(23)
    xs = torch.randn(160, 12)
    ys = (xs[:, :3].sum(1, keepdim=True) > 0).float()
    loader = DataLoader(TensorDataset(xs, ys), batch_size=16, shuffle=True)
    model = nn.Sequential(nn.Linear(12, 24), nn.Tanh(), nn.Linear(24, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    ema = copy.deepcopy(model).requires_grad_(False)
    counter = StepCounter()

    def update_ema(opt, args, kwargs):
        with torch.no_grad():
            for avg, p in zip(ema.parameters(), model.parameters()):
                avg.lerp_(p, 0.1)

    def clip_weights(opt, args, kwargs):
        with torch.no_grad():
            for group in opt.param_groups:
                for p in group["params"]:
                    p.clamp_(-0.25, 0.25)

    step, losses = 0, []
    for epoch in range(args.epochs):
        if epoch == args.warmup:
            optimizer.register_step_post_hook(update_ema if args.hook == "ema" else clip_weights)
            optimizer.register_step_pre_hook(counter)
        for xb, yb in loader:
            loss = F.binary_cross_entropy_with_logits(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            step += 1
            progress(step)
    finish(model=model.state_dict(), ema=ema.state_dict(), hooked_steps=counter.steps, losses=losses)


if __name__ == "__main__":
    main()
