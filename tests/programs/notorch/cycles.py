"""An object graph with cycles, all in module globals: an ArgumentParser and its parsed args,
nodes that point back at their parent, a list that contains itself: OUT --steps N."""

import argparse

from pace import finish, progress

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("--steps", type=int, default=40)
args = parser.parse_args()


class Node:
    def __init__(self, name, parent=None):
        self.name, self.parent, self.children, self.value = name, parent, [], 0.0
        if parent is not None:
            parent.children.append(self)

    def path(self):
        return self.name if self.parent is None else f"{self.parent.path()}/{self.name}"


root = Node("root")
for i in range(3):
    child = Node(f"c{i}", root)
    Node("leaf", child)
ring = ["ring"]
ring.append(ring)

for step in range(args.steps):
    node = root.children[step % 3]
    node.value += step * 0.5
    node.children[0].value -= step * 0.25
    ring.append(step)
    progress(step + 1)

nodes = [root, *root.children, *(c.children[0] for c in root.children)]
finish(
    values={n.path(): n.value for n in nodes},
    ring=[x for x in ring if x is not ring],
    ring_holds_itself=ring[1] is ring,
    parents_hold=all(c.parent is root for c in root.children),
    steps=args.steps,
)
