"""Training written in a functional style: the whole training state is a frozen dataclass
(parameters as a dict, Adam's moments as a NamedTuple, the step count and a generator for the
data), and each step builds the next state with `dataclasses.replace` from gradients that
torch.func computes; nothing is updated in place.
usage: functional_state.py OUT [--steps N]"""
import argparse
import dataclasses
from typing import NamedTuple

import torch
import torch.nn as nn
from torch.func import functional_call, grad_and_value

from common import finish, progress


class AdamState(NamedTuple):
    m: dict
    v: dict


@dataclasses.dataclass(frozen=True)
class TrainState:
    step: int
    params: dict
    opt: AdamState
    losses: tuple


def adam(params, grads, opt: AdamState, step: int, lr=3e-3, b1=0.9, b2=0.999, eps=1e-8):
    m = {k: b1 * opt.m[k] + (1 - b1) * grads[k] for k in params}
    v = {k: b2 * opt.v[k] + (1 - b2) * grads[k] ** 2 for k in params}
    new = {k: params[k] - lr * (m[k] / (1 - b1 ** step)) / ((v[k] / (1 - b2 ** step)).sqrt() + eps) for k in params}
    return new, AdamState(m, v)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()

    torch.manual_seed(47)
    net = nn.Sequential(nn.Linear(4, 32), nn.Tanh(), nn.Linear(32, 1))
    params = {k: v.detach().clone() for k, v in net.named_parameters()}
    state = TrainState(0, params, AdamState({k: torch.zeros_like(v) for k, v in params.items()},
                                            {k: torch.zeros_like(v) for k, v in params.items()}), ())
    data_gen = torch.Generator().manual_seed(47)

    def loss_fn(p, x, y):
        return ((functional_call(net, p, (x,)) - y) ** 2).mean()

    step_fn = grad_and_value(loss_fn)
    while state.step < args.steps:
        x = torch.randn(32, 4, generator=data_gen)
        y = x.sum(dim=1, keepdim=True).sin()
        grads, loss = step_fn(state.params, x, y)
        new_params, new_opt = adam(state.params, grads, state.opt, state.step + 1)
        state = dataclasses.replace(state, step=state.step + 1, params=new_params, opt=new_opt,
                                    losses=state.losses + (loss.item(),))
        progress(state.step)
    finish(params=state.params, m=state.opt.m, v=state.opt.v, losses=list(state.losses))


if __name__ == "__main__":
    main()
