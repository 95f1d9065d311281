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
# ``rng.compact()``) and the loader's own generator state when ``iter()`` made it). The capture
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
