"""The one walk of the program's objects: iterative, each object once by identity.

Cycles and deep nesting are the normal case in a training program (argparse namespaces,
nn.Module trees with back references, framework trainers), so no walker recurses and none keeps
its own seen-set loop: the writer's path finding (``capture.trainee.paths``), the restore's remap of
adopted objects (``restore.merge``), the generators a dataset holds (``graph.workers``) and the
unforked buffers a frame's locals hold (``stage.unforked``) all walk through ``walk``. What a
child is stays each caller's own (``graph.walk.children`` for the full graph, a shallow look for
the stall's walks).

The floor of the package (as ``errors`` and ``knobs``): stage walks too, and stage does not
import graph.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator


def walk(roots: Iterable[tuple[object, object]], expand: Callable[[object, object], Iterable[tuple[object, object]]],
         *, breadth_first: bool = False, limit: int | None = None) -> Iterator[tuple[object, object]]:
    """Each object reachable from ``roots`` once (by ``id``), with its place: ``(obj, place)``.

    ``roots`` and what ``expand`` returns are ``(obj, place)`` pairs; a place is whatever the
    caller tracks (a ``graph.walk.Path``, a depth). ``expand(obj, place)`` runs when the caller
    asks for the next object, after it has looked at this one (so what it found there can prune):
    it returns the children to go on with, or nothing to not descend. Depth-first takes the pair
    pushed last first (the children of one object in reverse); breadth-first the pair pushed
    first, so a place is the shortest one. ``limit`` bounds the objects yielded, so a
    pathological graph cannot make a walk run forever. Breaking out of the loop ends the walk.
    """
    seen: set[int] = set()
    todo = deque(roots)
    take = todo.popleft if breadth_first else todo.pop
    visits = 0
    while todo and (limit is None or visits < limit):
        obj, place = take()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        visits += 1
        yield obj, place
        todo.extend(pair for pair in expand(obj, place) if id(pair[0]) not in seen)
