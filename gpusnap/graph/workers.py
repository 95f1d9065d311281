"""Whether the program's DataLoader workers draw random numbers: one byte of anonymous shared
memory that the trainee maps at start and its forked workers inherit.

Fast-forward skips a DataLoader's batches by its index sampler, so no skipped sample is loaded.
With worker processes that is exact only if the workers draw nothing from their global random
generators (torch's, seeded per worker by the loader; ``random``; numpy's) while they fetch: a
skipped batch's draws are never made, and the workers' generators stand elsewhere for the
batches after it (a random flip drawn per sample in ``__getitem__``). The capture agent wraps
torch's dataset fetchers; in a worker each fetch compares the global RNG states before and
after it, and the states of the generators the dataset holds itself (``held_states``: one
made in ``worker_init_fn`` and kept on the dataset or a transform, or a generator among the
globals of the dataset's module), and ``mark``s a change here. The writer records ``seen()``
in the manifest (``workers_draw``), and restore then takes a worker loader's skipped batches
for real. A generator held anywhere else (a closure, another module) is not seen. Workers
started otherwise than by fork (``multiprocessing_context`` spawn or forkserver) run no wrapped
fetch and share no byte: a loader that uses them counts as drawing.
"""

from __future__ import annotations

import mmap
import pickle
import sys

from gpusnap.graph import rng

_page = None


def install() -> None:
    """Map the shared byte (the trainee, before any worker forks)."""
    global _page
    if _page is None:
        _page = mmap.mmap(-1, 1)  # anonymous and MAP_SHARED: a forked worker writes the parent's byte


def mark() -> None:
    """Note that workers drew (a worker's fetch; restore, for a snapshot that says so)."""
    install()
    _page[0] = 1


def seen() -> bool | None:
    """Did a worker's fetch draw random numbers (None: not watched in this process)?"""
    return None if _page is None else bool(_page[0])


# How far from the dataset generators are looked for: the dataset's attributes, theirs (a
# transform's), and theirs; containers and objects with more entries than this are passed over.
_DEPTH = 3
_ENTRIES = 64
_PLAIN = (str, bytes, int, float, bool, type(None))


def held_states(dataset) -> list[bytes]:
    """The states of the random generators ``dataset`` holds, in a fixed order (a generator
    made or dropped changes the list too)."""
    found = []
    seen: set[int] = set()
    module = sys.modules.get(type(dataset).__module__)
    todo = [(value, _DEPTH) for value in (vars(module).values() if module is not None else ())]
    todo.append((dataset, 0))
    while todo:
        obj, depth = todo.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        cls = type(obj)
        generator = _GENERATOR_TYPES.get(cls)
        if generator is None:
            generator = _GENERATOR_TYPES[cls] = _is_generator_type(cls)
        if generator:
            state = rng.owned_state(obj)
            if state is not None:
                found.append(_comparable(state))
                continue
        if depth >= _DEPTH:
            continue
        if isinstance(obj, (list, tuple)):
            entries = obj
        elif isinstance(obj, dict):
            entries = obj.values()
        else:
            entries = getattr(obj, "__dict__", None)
            entries = entries.values() if isinstance(entries, dict) else ()
        if len(entries) <= _ENTRIES:
            todo.extend((value, depth + 1) for value in entries if not isinstance(value, _PLAIN))
    return found


# type -> whether its instances can be generators: a fetch looks at dozens of objects, and
# torch.Generator's isinstance check runs Python code.
_GENERATOR_TYPES: dict[type, bool] = {}


def _is_generator_type(cls: type) -> bool:
    import random

    kinds = [random.Random]
    np, torch = sys.modules.get("numpy"), sys.modules.get("torch")
    if np is not None:
        kinds += [np.random.Generator, np.random.RandomState]
    if torch is not None:
        kinds.append(torch.Generator)
    return any(issubclass(cls, kind) for kind in kinds)


def _comparable(state: tuple) -> bytes:
    kind, raw = state
    if kind == "torch.Generator":
        return raw.numpy().tobytes()
    return pickle.dumps(raw, protocol=pickle.HIGHEST_PROTOCOL)
