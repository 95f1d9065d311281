"""Objects of the classes torch makes one per object (a parametrized module's, a torch.fx
GraphModule's) are made again from a snapshot: where the run made them in a step the replay
skipped, the merge takes the snapshot's; where the replay's setup made its own, the snapshot's
state merges into it (graph.madeclasses)."""

from __future__ import annotations

import pytest
import torch
import torch.fx
import torch.nn.functional as F
from torch.nn.utils import parametrize
from torch.nn.utils.parametrizations import spectral_norm, weight_norm

from test_graph import merge_into, snapshot_and_load


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, 6)
        self.b = torch.nn.Linear(6, 2)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def to_gelu(model) -> torch.fx.GraphModule:
    gm = torch.fx.symbolic_trace(model)
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is torch.relu:
            node.target = F.gelu
    gm.recompile()
    return gm


def made(seed: int, late: bool):
    """A discriminator and a traced net with their optimizer, parametrized and rewritten
    (``late``: as a step does) or only as a setup does."""
    torch.manual_seed(seed)
    disc = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.LeakyReLU(0.2), torch.nn.Linear(8, 1))
    weight_norm(disc[0])
    net = torch.fx.symbolic_trace(Net())
    if late:
        spectral_norm(disc[2])
        net = to_gelu(net)
    return {"disc": disc, "net": net, "optimizer": torch.optim.Adam([*disc.parameters(), *net.parameters()], lr=0.01)}


def train(run: dict, steps: int = 3) -> None:
    torch.manual_seed(1)
    for _ in range(steps):
        x = torch.randn(5, 4)
        loss = run["disc"](x).mean() + run["net"](x).pow(2).mean()
        run["optimizer"].zero_grad()
        loss.backward()
        run["optimizer"].step()


def outputs(run: dict) -> list:
    x = torch.linspace(-1, 1, 12).view(3, 4)
    run["disc"].eval()
    with torch.no_grad():
        return [run["disc"](x), run["net"](x)]


@pytest.mark.parametrize("replay_late", [False, True], ids=["replay-as-setup", "replay-alike"])
def test_modules_made_with_a_class_of_their_own_restore_from_the_snapshot(tmp_path, replay_late):
    run = made(0, late=True)
    train(run)
    snap, _ = snapshot_and_load(tmp_path, run)
    live = made(7, late=replay_late)
    replayed_disc = live["disc"]
    merged = merge_into(live, snap)
    train(run, 2)
    train(merged, 2)
    for a, b in zip(outputs(run), outputs(merged)):
        assert torch.equal(a, b)
    disc, net = merged["disc"], merged["net"]
    assert parametrize.is_parametrized(disc[2], "weight") and "gelu(" in net.code and "relu(" not in net.code
    assert disc is replayed_disc  # the Sequential the replay made, holding the run's layers
    if replay_late:  # made alike: the replay's own objects, with the run's state
        assert disc[2] is replayed_disc[2] and net is live["net"]
    params = {id(p) for p in merged["optimizer"].param_groups[0]["params"]}
    assert id(disc[2].parametrizations.weight.original) in params and id(net.b.bias) in params
    assert torch.equal(disc[2].parametrizations.weight[0]._u, run["disc"][2].parametrizations.weight[0]._u)
