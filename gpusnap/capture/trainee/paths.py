"""Object paths: where in the roots each interesting object sits.

Pickle does not say where it found an object, so after pickling the writer walks the roots
breadth-first once and names, by the shortest path from a root, what a user needs to see: the
live-only objects, the first holder of every buffer, and the nn.Modules (their state_dict names
are what ``gpusnap export`` writes). Paths read like Python (``graph.walk.Path``):
``frame[2].locals.model.fc.weight``, ``globals[__main__].history[3]``, ``...state[<Parameter>]``.
"""

from __future__ import annotations

import types

from gpusnap.graph.walk import ATOMS as _ATOMS
from gpusnap.graph.walk import Path, children
from gpusnap.traverse import walk

# Bound on objects visited, so a pathological graph cannot make the writer walk forever.
_MAX_VISITS = 500_000


def find_paths(roots: list[tuple[str, object]], wanted_ids: set[int], torch_module=None) -> dict[int, str]:
    """Shortest path of each object whose id is in ``wanted_ids``. Tensors are leaves."""
    leaf_types = _ATOMS if torch_module is None else _ATOMS + (torch_module.Tensor,)

    def expand(obj, path: Path):
        if isinstance(obj, leaf_types) or isinstance(obj, (type, types.ModuleType)):
            return  # (a module's namespace holds no state of the program's that pickle kept)
        try:
            for suffix, child in children(obj, torch_module):
                if not isinstance(child, _ATOMS):
                    yield child, path + suffix
        except Exception:  # a __dict__ property that raises, a dict mutated by a thread
            return

    found: dict[int, str] = {}
    for obj, path in walk(_places(roots), expand, breadth_first=True, limit=_MAX_VISITS):
        if id(obj) in wanted_ids:
            found[id(obj)] = str(path)
            if len(found) == len(wanted_ids):
                break
    return found


def top_modules(roots: list[tuple[str, object]], torch_module) -> list[tuple[str, object]]:
    """nn.Modules reachable from the roots that no other found module contains."""
    if torch_module is None:
        return []
    Module = torch_module.nn.Module

    def expand(obj, path: Path):
        if isinstance(obj, Module):
            return
        if isinstance(obj, _ATOMS) or isinstance(obj, (type, types.ModuleType, torch_module.Tensor)):
            return
        if not isinstance(obj, (dict, list, tuple)) and not hasattr(obj, "__dict__"):
            return
        if type(obj).__module__.startswith(("torch.utils.data", "threading", "socket", "io")):
            return
        try:
            for suffix, child in children(obj, torch_module):
                yield child, path + suffix
        except Exception:
            return

    result: list[tuple[str, object]] = []
    inside: set[int] = set()
    for obj, path in walk(_places(roots), expand, breadth_first=True, limit=_MAX_VISITS):
        if isinstance(obj, Module) and id(obj) not in inside:
            result.append((str(path), obj))
            for sub in obj.modules():
                inside.add(id(sub))
    return result


def _places(roots: list[tuple[str, object]]):
    return [(obj, Path(path)) for path, obj in roots]


def module_tensors(module, storage_names: dict, key_of, storage_offsets: dict | None = None) -> dict[str, dict]:
    """state_dict-style entries of one module's parameters and buffers, pointing into buffers
    (``byte_offset``: where the storage starts in its buffer, when not at 0)."""
    entries: dict[str, dict] = {}
    for name, tensor in _named_state(module):
        tensor = getattr(tensor, "_local_tensor", tensor)  # a DTensor: this rank's shard
        key = key_of(tensor.untyped_storage())
        buffer = storage_names.get(key)
        if buffer is None:
            continue
        entries[name] = {
            "buffer": buffer,
            "dtype": str(tensor.dtype).removeprefix("torch."),
            "shape": list(tensor.shape),
            "stride": list(tensor.stride()),
            "offset": tensor.storage_offset(),
        }
        if storage_offsets and storage_offsets.get(key):
            entries[name]["byte_offset"] = storage_offsets[key]
    return entries


def _named_state(module):
    # named_parameters/named_buffers walk Python dicts only: safe in the forked writer.
    yield from module.named_parameters(remove_duplicate=False)
    for name, buffer in module.named_buffers(remove_duplicate=False):
        if buffer is not None:
            yield name, buffer
