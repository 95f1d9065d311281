"""What the writer keeps of each running loop and of each iterator it cannot hold, so that
replay can position them or refuse (restore's ``fastforward``, ``itemcheck``, ``livecheck``).

``record(loop, read)`` gives a loop's manifest fields:

- ``resume``: its fast-forward note, taken when the loop started, JSON (``note_json``);
- ``rng_at``: the global RNG states at the start of its current iteration (loops that enclose
  a step loop: ``loops.EnclosingLoop``), and ``locals_at``: its frame's scalar locals then;
- ``check``: ``{"index": n, "items": [{"at": [..], "digest": hex | null, "why": ...}]}``: for
  each part of the source that fast-forward will consume (``consumed_paths``), the digest of that
  part of the last item the loop handed to its body (item n - 1), read from the loop's
  ``_iterate`` generator.

``describe(obj, read)`` says where a live-only iterator stood (``live_only[].iterator``): a
DataLoader iterator's batch count, base seed, sampler fingerprint and the RNG states ``iter()``
made it from, a generator's state and fingerprint (and, for a generator of instrumented code,
its running loops as ``record`` gives them). Everything here runs in the forked writer: ``read(address, nbytes)`` reads tensor
memory, no torch operator runs.
"""

from __future__ import annotations

import gc
import inspect
import io
import types
import weakref

from gpusnap.capture.pickling import pickler
from gpusnap.graph import rng, workers
from gpusnap.graph.digest import MISSING, digest, fingerprint, generator_place, loader_iter_class, part_of
from gpusnap.graph.iterators import LOADER_ITERS, adapter_for
from gpusnap.instrument import loops

_PROXIES = (weakref.ProxyType, weakref.CallableProxyType)


def note_json(note, read=None):
    """A note with its raw RNG states encoded (already-JSON notes pass through)."""
    if not isinstance(note, dict):
        return note
    out = {}
    for key, value in note.items():
        if key == "rng":
            value = rng.to_json(value, read)
        elif key == "generator_rng" and value is not None and not isinstance(value, str):
            value = rng.to_json((b"", None, None, value, None), read)["torch"]
        elif key == "sampler_rngs":
            value = [[i, name, _sampler_state_json(state, read)] for i, name, state in value]
        elif key == "args":
            value = [note_json(arg, read) for arg in value]
        elif key == "owned":
            value = {name: rng.owned_json(raw, read) for name, raw in value.items()}
        elif key == "inner":
            value = note_json(value, read)
        out[key] = value
    return out


def consumed_paths(note, at: tuple = ()) -> list[tuple]:
    """Where, in a loop's item, the parts that fast-forward consumes sit (tuple indexes)."""
    if not note:
        return []
    kind = note.get("kind")
    if kind == "iter" or (kind == "dataloader" and (note.get("consumed") or note.get("workers"))):
        return [at]
    if kind == "tqdm":
        return consumed_paths(note.get("inner"), at)
    if kind == "call":
        func, args = note.get("func"), note.get("args") or []
        if func == "zip":
            return [p for j, arg in enumerate(args) for p in consumed_paths(arg, at + (j,))]
        if func == "enumerate" and args:
            return consumed_paths(args[0], at + (1,))
        if func == "islice" and args:
            return consumed_paths(args[0], at)
    return []


def record(loop, read=None) -> dict:
    out = {"resume": note_json(loop.resume, read)}
    source = _source(loop)
    states = _worker_states(source) if source is not None and isinstance(out["resume"], dict) else None
    if states is not None:
        out["resume"] = {**out["resume"], "worker_rng": states}
    rng_at = getattr(loop, "rng_at", None)
    if rng_at is not None:
        out["rng_at"] = rng.to_json(rng_at, read)
    locals_at = getattr(loop, "locals_at", None)
    if locals_at and getattr(loop, "locals_for", None) == loop.index:  # (a loop's start: its first iteration's)
        out["locals_at"] = loops.scalars_to_json(locals_at)
    paths = consumed_paths(loop.resume)
    if paths and loop.index > 0:
        ref = getattr(loop, "gen", None)
        gen = ref() if ref is not None else None
        frame = gen.gi_frame if gen is not None else None
        item = frame.f_locals.get(loops.LAST_ITEM, MISSING) if frame is not None else MISSING
        out["check"] = {"index": loop.index, "items": [_digest_entry(part_of(item, at), at, read) for at in paths]}
    return out


def _worker_states(it) -> list[str] | None:
    """A persistent-workers DataLoader iterator's workers' RNG states at the start of the
    running epoch (``graph.workers``): fresh workers would start it elsewhere."""
    if not getattr(it, "_persistent_workers", False) or not getattr(it, "_num_workers", 0):
        return None
    return workers.epoch_states(it._dataset, it._num_workers)


def _source(loop):
    """The iterator a running loop takes its items from (its ``_iterate`` generator's)."""
    ref = getattr(loop, "gen", None)
    gen = ref() if ref is not None else None
    frame = gen.gi_frame if gen is not None else None
    return frame.f_locals.get("it") if frame is not None else None


def held_by_sources(active_loops) -> set[int]:
    """ids of the iterators that the running loops' sources hold, transitively: the generators a
    pipeline of generators keeps in its suspended frames (``batched(decode(shuffle(read())))``),
    the iterators an islice, zip, map or chain wraps. Fast-forward moves them with the source it
    consumes, whose last item it checks; one that no path reaches otherwise has no other place
    to be put back from (the writer describes it for no check)."""
    found: set[int] = set()
    stack = [source for loop in active_loops if (source := _source(loop)) is not None]
    while stack:
        obj = stack.pop()
        if id(obj) in found:
            continue
        found.add(id(obj))
        if isinstance(obj, types.GeneratorType):
            held = list(obj.gi_frame.f_locals.values()) if obj.gi_frame is not None else []
        else:
            held = gc.get_referents(obj)  # a C iterator's: what it wraps
        stack += [value for value in held if _is_iterator(value)]
    return found


def _is_iterator(value) -> bool:
    return hasattr(type(value), "__next__") and not isinstance(value, (io.IOBase, *_PROXIES))


def fetched_ahead(loop):
    """The loop's source when it is a library generator that fetches ahead of what it yielded
    (``pickler.FETCHED_AHEAD``): the snapshot keeps what it fetched; None otherwise."""
    source = _source(loop)
    if not isinstance(source, types.GeneratorType) or source.gi_frame is None or not pickler.FETCHED_AHEAD:
        return None
    name = f"{source.gi_frame.f_globals.get('__name__')}.{source.__qualname__}"
    return source if name in pickler.FETCHED_AHEAD else None


def _last_item(loop):
    ref = getattr(loop, "gen", None)
    gen = ref() if ref is not None else None
    frame = gen.gi_frame if gen is not None else None
    return frame.f_locals.get(loops.LAST_ITEM, MISSING) if frame is not None else MISSING


def _digest_entry(value, at: tuple, read) -> dict:
    if value is MISSING:
        return {"at": list(at), "digest": None, "why": "the item was not found"}
    hexdigest, why = digest(value, read)
    return {"at": list(at), "digest": hexdigest, "why": why}


def _sampler_state_json(state, read):
    """A sampler generator's state (``iterators.state_of``'s) as a note holds it."""
    if isinstance(state, (str, dict)):
        return state
    return rng.owned_json(state, read) if isinstance(state, tuple) else rng.tensor_json(state, read)


def _states_json(states: tuple, read) -> dict:
    """``LOADER_ITERS``' states as a note holds them."""
    global_states, generator, samplers = states
    return {
        "rng": rng.to_json(global_states, read),
        "generator": rng.tensor_json(generator, read) if generator is not None else None,
        "samplers": [[i, name, _sampler_state_json(state, read)] for i, name, state in samplers],
    }


def describe(obj, read=None, active_loops=(), contexts=frozenset()) -> dict | None:
    """Where a live-only iterator stands (None: ``obj`` is no iterator). ``active_loops``: the
    loops that were running (a suspended generator's among them); ``contexts``: the ids of the
    generators of entered ``contextmanager``s (``GraphPickler.context_generators``)."""
    try:
        return _describe(obj, read, active_loops, contexts)
    except Exception as exc:  # an iterator this cannot read: its position is unknown
        return {"kind": "iterator", "why": f"{type(exc).__name__} while reading it"}


def _describe(obj, read, active_loops=(), contexts=frozenset()):
    if isinstance(obj, _PROXIES):
        return None  # a weak proxy's type has every slot, __next__ included, whatever it refers to
    adapter = adapter_for(obj)
    info = adapter.describe(obj, read) if adapter is not None else None
    if info is not None:
        return info
    if isinstance(obj, types.GeneratorType) and id(obj) in contexts and obj.gi_frame is not None:
        # The replay entered the same `with`: its generator waits at the same yield, and the
        # merge gives it this one's locals. Its place is its code and position, not its locals.
        return {"kind": "generator", "state": inspect.getgeneratorstate(obj), "context": generator_place(obj)}
    if isinstance(obj, types.GeneratorType):
        info = {"kind": "generator", "state": inspect.getgeneratorstate(obj), "fingerprint": fingerprint(obj, read, strict=True)}
        running = [loop for loop in active_loops if obj.gi_frame is not None and loop.frame is obj.gi_frame]
        if running:  # instrumented code: replay can run it to the same place
            info["function"] = obj.gi_code.co_qualname
            info["loops"] = [{"loop_id": loop.loop_id, "index": loop.index, "kind": loop.kind, **record(loop, read)} for loop in running]
            info["item"] = _digest_entry(_last_item(running[-1]), (), read)  # what replay must take again
        return info
    iter_class = loader_iter_class()
    if iter_class is not None and isinstance(obj, iter_class):
        info = {
            "kind": "dataloader_iter",
            "yielded": obj._num_yielded,
            "base_seed": getattr(obj, "_base_seed", None),
            "sampler": fingerprint(obj._sampler_iter, read, strict=False),
        }
        states = _worker_states(obj)
        if states is not None:
            info["worker_rng"] = states
        made = LOADER_ITERS.get(obj)
        if made is not None:
            info["made_with"] = _states_json(made[1], read)
            if made[2][0] is not None:
                info["first_draw"] = _states_json(made[2][0], read)
        return info
    if _is_iterator(obj):
        return {"kind": "iterator"}
    return None
