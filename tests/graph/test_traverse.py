"""The one walk of the program's objects (gpusnap.traverse) and the walkers built on it."""

from __future__ import annotations

import torch

from gpusnap.capture.trainee.paths import find_paths, top_modules
from gpusnap.traverse import walk


class Node:
    def __init__(self, name, *links):
        self.name, self.links = name, list(links)


def _links(node, place):
    return [(child, place + [child.name]) for child in node.links]


def test_each_object_once_in_a_cycle_and_depth_first_takes_the_last_child_first():
    a, b, c = Node("a"), Node("b"), Node("c")
    a.links = [b, c]
    b.links = [a, c]
    c.links = [a]
    order = [node.name for node, _ in walk([(a, ["a"])], _links)]
    assert order == ["a", "c", "b"]


def test_breadth_first_gives_shortest_places_and_limit_stops_the_walk():
    d = Node("d")
    a = Node("a", Node("b", Node("c", d)), d)
    places = {node.name: place for node, place in walk([(a, ["a"])], _links, breadth_first=True)}
    assert places["d"] == ["a", "d"]
    assert len(list(walk([(a, ["a"])], _links, breadth_first=True, limit=2))) == 2


def test_pruning_after_the_caller_looked_and_a_chain_deeper_than_the_recursion_limit():
    head = None
    for i in range(100_000):
        head = Node(i, *([head] if head else []))
    stop_at = 50_000
    visited = [node.name for node, _ in walk([(head, 0)], lambda n, depth: [] if n.name == stop_at else [(c, depth + 1) for c in n.links])]
    assert visited == list(range(99_999, stop_at - 1, -1))


def test_paths_name_the_shortest_place_and_modules_inside_modules_are_not_top():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    state = {"model": model, "history": [1, [model]]}
    state["self"] = state  # a cycle
    wanted = model[0].weight
    paths = find_paths([("globals", state)], {id(wanted)}, torch)
    assert paths == {id(wanted): "globals['model'].0.weight"}
    assert top_modules([("globals", state)], torch) == [("globals['model']", model)]
