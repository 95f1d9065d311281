"""Framework iterators that an adapter can put back where they stood (accelerate's
``DataLoaderShard`` generator, Lightning's fetchers): the table both halves read.

Keyed by the name of an iterator's generator function (``module.qualname``) or of a class on
its MRO. An adapter has ``kind`` (the note's), ``describe(obj, read) -> dict | None`` (the writer,
``capture.trainee.loopnotes``; None: the generic description) and ``check(live, info, path, scene) ->
problem | None`` (replay, ``restore.livecheck``). ``gpusnap.frameworks`` fills it.
"""

from __future__ import annotations

import types
import weakref

ADAPTERS: dict = {}

# A torch DataLoader iterator -> (weak reference to its DataLoader, the global RNG states (raw,
# ``rng.compact()``), the loader's own generator state and its samplers' (``sampler_generators``)
# when ``iter()`` made it). The capture
# agent wraps ``DataLoader.__iter__`` to fill it: a program that makes its iterator again inside
# its loop (``it = iter(loader)`` when the last one ran out) holds one that the replay, which
# skips that iteration, never made; restore makes it anew from these (``restore.livecheck``).
LOADER_ITERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def adapter_for(obj):
    if isinstance(obj, types.GeneratorType):
        frame = obj.gi_frame
        names = [f"{frame.f_globals.get('__name__')}.{obj.__qualname__}"] if frame is not None else []
    else:
        names = [f"{cls.__module__}.{cls.__qualname__}" for cls in type(obj).__mro__]
    return next((ADAPTERS[name] for name in names if name in ADAPTERS), None)


def adapter_of_kind(kind):
    return next((adapter for adapter in ADAPTERS.values() if adapter.kind == kind), None)


# -- the generators a DataLoader's samplers hold ----------------------------------------------------
# A sampler given a generator of its own (``SubsetRandomSampler(indices, generator=g)``, a
# ``RandomSampler`` made by the program) draws each epoch's order from it: neither the global
# states nor the loader's generator say where it stood when an epoch started.


def samplers_of(index_sampler) -> list:
    """The index sampler and the samplers it holds, theirs in turn, four levels down at most (a
    BatchSampler's sampler, a wrapper's)."""
    from torch.utils.data import Sampler

    found, level = [], [index_sampler]
    for _ in range(5):
        found += level
        level = [value for sampler in level for value in (getattr(sampler, "__dict__", None) or {}).values()
                 if isinstance(value, Sampler) and not any(value is seen for seen in found)]
    return found


def sampler_generators(loader) -> list:
    """[[i, name, state]]: each torch.Generator at attribute ``name`` of the i-th of the loader's
    samplers (``samplers_of``) other than the loader's own generator, with its state (a tensor).
    Runs in the program's ``iter(loader)``: a loader whose samplers cannot be read gives none."""
    from torch import Generator

    try:
        samplers = samplers_of(loader._index_sampler)
    except Exception:  # noqa: BLE001 - a subclass's property that raises: nothing to put back
        return []
    return [[i, name, value.get_state()] for i, sampler in enumerate(samplers)
            for name, value in sorted((getattr(sampler, "__dict__", None) or {}).items())
            if isinstance(value, Generator) and value is not loader.generator]


def put_sampler_generators(loader, saved: list) -> None:
    """``sampler_generators``'s states (tensors, or base64 as a note holds them) back into the
    generators at the same places of the loader's samplers; a place the replay's samplers lack
    is left (the witness compares the order drawn)."""
    from torch import Generator

    from gpusnap.graph import rng

    if not saved:
        return
    samplers = samplers_of(loader._index_sampler)
    for i, name, state in saved:
        generator = getattr(samplers[i], name, None) if i < len(samplers) else None
        if isinstance(generator, Generator) and generator is not loader.generator:
            generator.set_state(rng.tensor_b64(state) if isinstance(state, str) else state)
