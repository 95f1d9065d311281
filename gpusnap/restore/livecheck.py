"""Iterators a snapshot cannot hold: where they stood, and whether the replayed ones stand there.

A generator or a DataLoader iterator in the program's locals or globals is live-only: restart
keeps the one the replayed program built. An iterator that the program advances by hand
(``it = iter(loader)`` before a ``for step in range(n)`` loop whose body calls ``next(it)``, as
the transformers Trainer does) would then sit where the replay left it while the loop around it
is fast-forwarded: a silent divergence. So the writer records, for each live-only iterator,
``describe(obj)``, and replay (before the merge) runs ``check``:

- a torch DataLoader iterator: its batch count (``_num_yielded``), the base seed it drew when it
  was made and a fingerprint of its index sampler. The replayed one must have drawn the same
  seed (then the RNG state at its creation was the same); it is advanced to the same count
  (map-style, no workers: through its index sampler, no sample loaded; otherwise by taking
  batches), and its sampler must then have the same fingerprint (the last batch of indices).
- a generator: created or finished, the replayed one must be too; suspended, the replayed one
  must have the same fingerprint (position, and every local digested): else it cannot be
  positioned.
- an iterator whose class has an entry in ``ADAPTERS`` (a framework's, added by
  ``gpusnap.frameworks``): what the adapter's ``describe`` says, checked by its ``check``.
- any other iterator: its position is unknown.

Iterators that fast-forward positioned itself (a loop's source) are left alone. What fails is
reported as phrases; replay refuses (``--force``: warns).
"""

from __future__ import annotations

import ast
import inspect
import io
import re
import sys
import types
import weakref
from array import array

import xxhash

from gpusnap.restore.digest import digest

HINT = (
    "replay cannot put an iterator that the program advances by hand back where it stood; iterate "
    "it with a for loop (fast-forward positions those), restart from another snapshot with "
    "--snapshot ID, or pass --force to continue anyway"
)

_MISSING = object()
_MAX_DEPTH = 8
_ITER_TYPES = (type(iter([])), type(iter(())), type(iter(range(1))), type(iter(range(1 << 64))))
# A proxy's type has every slot, __next__ included, whatever its referent is.
_PROXIES = (weakref.ProxyType, weakref.CallableProxyType)

# Class name ("module.Qualname", looked up along the MRO) -> adapter for a framework's iterator
# that the snapshot keeps live-only: ``KIND`` (the ``kind`` its descriptions carry),
# ``describe(obj, read) -> dict`` (writer) and ``check(live, info, path, say) -> problem | None``
# (replay: put the live one where ``info`` says, or say why not).
ADAPTERS: dict[str, object] = {}


def _loader_iter_class():
    dataloader = sys.modules.get("torch.utils.data.dataloader")
    return getattr(dataloader, "_BaseDataLoaderIter", None)


# -- writer --------------------------------------------------------------------------------------
def describe(obj, read=None) -> dict | None:
    """Where a live-only iterator stands (None: ``obj`` is no iterator)."""
    try:
        return _describe(obj, read)
    except Exception as exc:  # an iterator this cannot read: its position is unknown
        return {"kind": "iterator", "why": f"{type(exc).__name__} while reading it"}


def _describe(obj, read):
    if isinstance(obj, _PROXIES):
        return None
    adapter = adapter_for(type(obj))
    if adapter is not None:
        return {**adapter.describe(obj, read), "kind": adapter.KIND}
    if isinstance(obj, types.GeneratorType):
        return {"kind": "generator", "state": inspect.getgeneratorstate(obj), "fingerprint": fingerprint(obj, read, strict=True)}
    loader_iter = _loader_iter_class()
    if loader_iter is not None and isinstance(obj, loader_iter):
        return {
            "kind": "dataloader_iter",
            "yielded": obj._num_yielded,
            "base_seed": getattr(obj, "_base_seed", None),
            "sampler": fingerprint(obj._sampler_iter, read, strict=False),
        }
    if hasattr(type(obj), "__next__") and not isinstance(obj, io.IOBase):
        return {"kind": "iterator"}
    return None


def adapter_for(cls):
    for klass in cls.__mro__:
        adapter = ADAPTERS.get(f"{klass.__module__}.{klass.__qualname__}")
        if adapter is not None:
            return adapter
    return None


def fingerprint(obj, read=None, strict: bool = True) -> str | None:
    """xxh3-128 of a generator's state: its code position and locals, and what it delegates to
    (generators, list/tuple/range iterators), recursively. ``strict``: every local must be
    digested (else None); otherwise only plain data (numbers, strings, lists of them) counts."""
    h = xxhash.xxh3_128()
    stack = [(obj, 0)]
    while stack:
        x, depth = stack.pop()
        if depth > _MAX_DEPTH:
            return None
        if isinstance(x, _ITER_TYPES):
            _, args, *state = x.__reduce__()
            h.update(repr((type(x).__name__, state)).encode())
            x = args[0]
        if not isinstance(x, types.GeneratorType):
            value, why = (digest(x, read) if strict or _plain(x) else (None, "opaque"))
            if value is None and strict:
                return None
            h.update((value or f"opaque {type(x).__qualname__}").encode())
            continue
        frame = x.gi_frame
        if frame is None:
            h.update(b"finished")
            continue
        h.update(f"{x.gi_code.co_qualname} {frame.f_lasti}".encode())
        for name, value in frame.f_locals.items():
            h.update(name.encode())
            stack.append((value, depth + 1))
        if x.gi_yieldfrom is not None:
            stack.append((x.gi_yieldfrom, depth + 1))
    return h.hexdigest()


def _plain(x) -> bool:
    if x is None or isinstance(x, (bool, int, float, str, bytes)):
        return True
    if isinstance(x, (list, tuple)):
        try:
            array("q", x)  # the common case: indices
            return True
        except (TypeError, OverflowError):
            return len(x) < 1000 and all(_plain(v) for v in x)
    return False


# -- replay --------------------------------------------------------------------------------------
def check(live_only: list, frames: list, modules: dict, positioned: set, say) -> list[str]:
    """Problems with the replayed program's live-only iterators; DataLoader iterators behind
    their saved position are advanced to it first. ``positioned``: ids fast-forward owns."""
    problems = []
    for entry in live_only:
        info = entry.get("iterator")
        if not info:
            continue
        path = entry["path"]
        live = resolve(path, frames, modules)
        if live is not _MISSING and id(live) in positioned:
            continue
        kind = info.get("kind")
        adapter = next((a for a in ADAPTERS.values() if a.KIND == kind), None)
        if kind == "dataloader_iter":
            problem = position_loader_iter(live, info, path, say)
        elif kind == "generator":
            problem = _generator(live, info, path)
        elif adapter is not None and live is _MISSING:
            problem = f"cannot find the {entry.get('type')} that the run that took the snapshot held at {path}"
        elif adapter is not None:
            problem = adapter.check(live, info, path, say)
        else:
            problem = f"cannot position the iterator at {path} ({entry.get('type')}): a snapshot cannot record where it stood"
        if problem:
            problems.append(problem)
    return problems


def position_loader_iter(live, info: dict, path: str, say) -> str | None:
    """Advance the DataLoader iterator ``live`` to where ``info`` says; a problem, or None."""
    loader_iter = _loader_iter_class()
    if live is _MISSING or loader_iter is None or not isinstance(live, loader_iter):
        return f"cannot find the DataLoader iterator that the run that took the snapshot held at {path}"
    if info.get("base_seed") is not None and getattr(live, "_base_seed", None) != info["base_seed"]:
        return f"found the DataLoader iterator at {path} made from other random numbers than in the run that took the snapshot"
    behind = info["yielded"] - live._num_yielded
    if behind < 0:
        return f"found the DataLoader iterator at {path} {-behind} batches ahead of the run that took the snapshot"
    if behind:
        from torch.utils.data.dataloader import _DatasetKind

        try:
            if live._dataset_kind == _DatasetKind.Map and live._num_workers == 0:
                for _ in range(behind):
                    live._next_index()  # indices only: no sample is loaded
                live._num_yielded += behind
                how = "through its index sampler"
            else:
                for _ in range(behind):
                    next(live)
                how = "by taking batches"
        except StopIteration:
            return f"found the DataLoader iterator at {path} ending before batch {info['yielded']}"
        say(f"advanced the DataLoader iterator at {path} by {behind} batches {how}")
    saved = info.get("sampler")
    if saved and fingerprint(live._sampler_iter, strict=False) != saved:
        return f"found the DataLoader iterator at {path} with its sampler elsewhere than in the run that took the snapshot"
    return None


def _generator(live, info: dict, path: str) -> str | None:
    if live is _MISSING or not isinstance(live, types.GeneratorType):
        return f"cannot find the generator that the run that took the snapshot held at {path}"
    state = inspect.getgeneratorstate(live)
    if info["state"] != "GEN_SUSPENDED":
        if state == info["state"]:
            return None
        return f"found the generator at {path} {state.lower()[4:]}, it was {info['state'].lower()[4:]}"
    if info.get("fingerprint") and fingerprint(live, strict=True) == info["fingerprint"]:
        return None
    return f"cannot position the generator at {path}: the run that took the snapshot had advanced it by hand"


# -- object paths (capture.paths writes them) ------------------------------------------------------
_ROOT = re.compile(r"frame\[(\d+)\]\.locals\.(\w+)|globals\[([^\]]+)\]\.(\w+)")
_STEP = re.compile(r"\.(\w+)|\[('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|[^\]]*)\]")


def resolve(path: str, frames: list, modules: dict):
    """The live object at ``path`` (``frame[1].locals.self.it``, ``globals[m].x[0]``), or _MISSING."""
    match = _ROOT.match(path)
    if match is None:
        return _MISSING
    try:
        if match.group(1) is not None:
            obj = frames[int(match.group(1))].f_locals[match.group(2)]
        else:
            obj = modules[match.group(3)][match.group(4)]
        pos = match.end()
        while pos < len(path):
            step = _STEP.match(path, pos)
            if step is None:
                return _MISSING
            pos = step.end()
            obj = getattr(obj, step.group(1)) if step.group(1) is not None else obj[ast.literal_eval(step.group(2))]
    except Exception:  # a name the replay does not have, a key that is not a literal
        return _MISSING
    return obj
