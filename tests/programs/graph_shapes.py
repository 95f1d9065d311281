"""Object graphs as real scripts hold them: a top-level argparse parser (its actions and groups
point back at each other), a linked structure 100,000 deep, a list that contains itself, a dict
keyed by tuples, children that point back at their parent, a functools.partial of a local
function, a partial whose closure counts its calls, a defaultdict(lambda: 0), an object created
mid-run that refers to the model. usage: graph_shapes.py OUT STEPS"""
import argparse
import collections
import functools

import torch
from common import finish, progress

parser = argparse.ArgumentParser(description="graph shapes")
parser.add_argument("out")
parser.add_argument("steps", type=int)
parser.add_argument("--lr", type=float, default=0.1)
args = parser.parse_args()


calls_by_parity = collections.defaultdict(lambda: 0)


def make_counted(factor):
    calls = {"n": 0}

    def counted(offset, x):
        calls["n"] += 1
        return x * factor + offset * calls["n"]

    return functools.partial(counted, 0.01)


class Node:
    def __init__(self, value, next_node=None):
        self.value = value
        self.next = next_node


class Tree:
    def __init__(self):
        self.children = []

    def add(self):
        child = Tree()
        child.parent = self
        self.children.append(child)
        return child


class Tracker:
    """Made during training; must keep following the live weights after a restart."""

    def __init__(self, weights):
        self.weights = weights
        self.seen = []


def main():
    torch.manual_seed(3)
    weights = torch.zeros(8)
    chain = None
    for i in range(100_000):
        chain = Node(i, chain)
    selfish = [1, 2]
    selfish.append(selfish)
    by_pair = {(0, "a"): 0, (1, "b"): 1}
    tree = Tree()
    scale = 2.0

    def scaled(x):
        return x * scale

    scaler = functools.partial(scaled)
    counted = make_counted(0.5)
    tracker = None
    for step in range(args.steps):
        weights += args.lr * scaler(torch.randn(8)) + counted(torch.ones(8))
        calls_by_parity[step % 2] += step
        chain.value += step
        selfish[0] += 1
        by_pair[(step % 2, "ab"[step % 2])] += step
        tree.children[-1].add() if tree.children else tree.add()
        if step == 3:
            tracker = Tracker(weights)
        if tracker is not None:
            tracker.seen.append(float(tracker.weights.sum()))
        progress(step + 1)
    depth = 0
    node = chain
    while node is not None:
        depth += 1
        node = node.next
    leaf, levels = tree, 0
    while leaf.children:
        assert leaf.children[0].parent is leaf
        leaf, levels = leaf.children[0], levels + 1
    assert selfish[2] is selfish and tracker.weights is weights
    finish(weights=weights, head=chain.value, depth=depth, selfish=selfish[0], pairs=sorted(by_pair.items()), levels=levels, seen=tracker.seen,
           parity=sorted(calls_by_parity.items()))


main()
