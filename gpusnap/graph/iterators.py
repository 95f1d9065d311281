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
# when ``iter()`` made it, and a list holding the same states when it took its first index, or
# None before). The capture
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


# -- the DataLoaders a loop iterates -----------------------------------------------------------------
# A loop's source can be chosen by state that the iterations a replay skips changed (federated
# averaging: ``for xb, yb in loaders[c]`` for a client ``c`` drawn each round): the replay then
# positions another DataLoader than the run's. The run's loop keeps the DataLoaders its source
# iterates (``ActiveLoop.loaders``), the snapshot holds them with the loop, and the merge tells
# whether the replay's are their counterparts (``restore.fastforward.Remake.rebase``).

_LOADER = "torch.utils.data.dataloader.DataLoader"
_TQDM = "tqdm.std.tqdm"


def loaders_in(source) -> list:
    """The DataLoaders a loop over ``source`` iterates, in the order fast-forward positions them:
    the source itself, the sources of an ``enumerate``/``zip``/``islice`` the loop statement calls
    (the first argument but for zip's), or a tqdm bar's iterable."""
    from gpusnap.instrument.loops import _DeferredCall

    if isinstance(source, _DeferredCall):
        return [loader for arg in source.sources() for loader in loaders_in(arg)]
    names = {f"{cls.__module__}.{cls.__qualname__}" for cls in type(source).__mro__}
    if _LOADER in names:
        return [source]
    if _TQDM in names:
        return loaders_in(getattr(source, "iterable", None))
    return []


# -- the generators a DataLoader's samplers hold ----------------------------------------------------
# A sampler given a generator of its own (``SubsetRandomSampler(indices, generator=g)``, a
# ``RandomSampler`` made by the program, a batch sampler of the script's own that shuffles with a
# ``random.Random`` or NumPy generator it keeps) draws each epoch's order from it: neither the
# global states nor the loader's generator say where it stood when an epoch started. A
# torch.Generator's state is its tensor (base64 in a note), any other's ``rng.owned_state``'s
# ``(kind, state)`` (``rng.owned_json``'s dict in a note).


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


def _generators_in(index_sampler) -> list:
    """(i, name, generator): each generator (``rng.owned_state``'s kinds) at attribute ``name`` of
    the i-th of ``samplers_of(index_sampler)``."""
    from gpusnap.graph import rng

    return [(i, name, value) for i, sampler in enumerate(samplers_of(index_sampler))
            for name, value in sorted((getattr(sampler, "__dict__", None) or {}).items()) if rng.owned_state(value) is not None]


def state_of(generator):
    """A sampler generator's state: a torch.Generator's tensor, another's ``(kind, state)``."""
    from gpusnap.graph import rng

    kind, state = rng.owned_state(generator)
    return state if kind == "torch.Generator" else (kind, state)


def put_state(generator, state) -> None:
    """``state_of``'s, or a note's (base64 for a torch.Generator, ``rng.owned_json``'s dict)."""
    from gpusnap.graph import rng

    if isinstance(state, str):
        generator.set_state(rng.tensor_b64(state))
    elif isinstance(state, dict):
        rng.restore_owned(generator, state)
    elif isinstance(state, tuple):
        rng.restore_owned_raw(generator, state)
    else:
        generator.set_state(state)


def generator_states(index_sampler) -> dict:
    """{generator: state} of every generator the samplers of ``samplers_of`` hold."""
    return {generator: state_of(generator) for _, _, generator in _generators_in(index_sampler)}


def sampler_generators(loader) -> list:
    """[[i, name, state]]: each generator of ``_generators_in`` other than the loader's own, with
    its state (a tensor). Runs in the program's ``iter(loader)``: a loader whose samplers cannot
    be read gives none."""
    try:
        found = _generators_in(loader._index_sampler)
    except Exception:  # noqa: BLE001 - a subclass's property that raises: nothing to put back
        return []
    return [[i, name, state_of(generator)] for i, name, generator in found if generator is not loader.generator]


def put_generators(loader, own, samplers: list) -> None:
    """The loader's own generator back to state ``own`` and its samplers' to ``samplers``
    (``sampler_generators``'s); states raw, or as notes hold them (``put_state``). None, or a
    place the replay's samplers lack, is left (the witness compares the order drawn)."""
    if own is not None and loader.generator is not None:
        put_state(loader.generator, own)
    if samplers:
        places = {(i, name): generator for i, name, generator in _generators_in(loader._index_sampler)}
        for i, name, state in samplers:
            generator = places.get((i, name))
            if generator is not None and generator is not loader.generator:
                put_state(generator, state)
