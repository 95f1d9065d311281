"""Fast-forward: start a loop's iteration at item ``skip`` without running skipped bodies.

Cheap where the source allows it, always correct otherwise:

- ``range``, ``list``, ``tuple``: their iterators take a position (``__setstate__``).
- ``torch.utils.data.DataLoader`` over a map-style dataset: the torch RNG (and the loader's
  generator) are put back to their state at the moment the original run called ``iter()``, then
  the iterator is built with an index sampler that drops the first ``skip`` batches of indices.
  Workers receive only the indices after them: no skipped sample is loaded, shuffling and worker
  seeds come out the same. (An iterable-style dataset ignores the indices: it is consumed.)
- ``enumerate(x, start)`` / ``zip(a, b)``: the sources are fast-forwarded and the call rebuilt;
  the DataLoaders of a ``zip`` draw from the RNG in the order the original ``zip`` made them draw.
- a tqdm progress bar around a DataLoader: the loader's RNG state at ``iter()`` is restored, then
  ``skip`` items are consumed through the bar (its count continues).
- anything else: ``skip`` items are consumed. That is exact only where making and iterating the
  source draws no random numbers; the tests hold generators that do to it, not all of them.

``describe(source)`` runs at every loop start of the original run (capture side) and returns what
a later fast-forward needs, JSON-ready, or None.
"""

from __future__ import annotations

import base64
import builtins
import itertools
import sys
from collections import deque

from gpusnap.instrument.loops import _DeferredCall

_POSITIONED = (range, list, tuple)


def _dataloader_class():
    data = sys.modules.get("torch.utils.data")
    return getattr(data, "DataLoader", None) if data is not None else None


def _b64(tensor) -> str:
    return base64.b64encode(tensor.numpy().tobytes()).decode()


def _byte_tensor(text: str):
    import torch

    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8).clone()


def describe(source) -> dict | None:
    if isinstance(source, _DeferredCall):
        parts = [describe(arg) for arg in source.args]
        return {"kind": "call", "args": parts} if any(parts) else None
    inner = _wrapped(source)
    if inner is not None:
        return describe(inner)
    loader_class = _dataloader_class()
    if loader_class is None or not isinstance(source, loader_class):
        return None
    import torch

    generator = source.generator
    note = {
        "kind": "dataloader",
        "torch_rng": _b64(torch.get_rng_state()),
        "generator_rng": _b64(generator.get_state()) if generator is not None else None,
    }
    if source.persistent_workers and source.num_workers > 0 and source._iterator is not None:
        note["reuses_workers"] = True  # this iter() draws no base seed: it only resets the iterator
    return note


def iterator_at(source, skip: int, note: dict | None) -> tuple[object, str]:
    """An iterator over ``source`` positioned at item ``skip``, and how it got there."""
    if isinstance(source, _DeferredCall):
        return _call_at(source, skip, note)
    if type(source) in _POSITIONED:
        it = iter(source)
        it.__setstate__(skip)
        return it, "by index"
    if _by_sampler(source, note):
        return _dataloader_at(source, skip, note), "by batch sampler"
    loader = _wrapped(source) or source
    if _is_loader(loader) and note and note.get("kind") == "dataloader":
        _restore_rng(loader, note)  # the wrapper's first item makes the loader's iterator
    it = iter(source)
    deque(itertools.islice(it, skip), maxlen=0)
    return it, f"by consuming {skip} items"


def _wrapped(source):
    """The DataLoader (or other source) inside a progress-bar wrapper such as tqdm, else None."""
    if type(source).__module__.split(".")[0] == "tqdm":
        return getattr(source, "iterable", None)
    return None


def _is_loader(source) -> bool:
    loader_class = _dataloader_class()
    return loader_class is not None and isinstance(source, loader_class)


def _by_sampler(source, note: dict | None) -> bool:
    if not (_is_loader(source) and note and note.get("kind") == "dataloader"):
        return False
    from torch.utils.data import IterableDataset

    return not isinstance(source.dataset, IterableDataset)


def _call_at(call: _DeferredCall, skip: int, note: dict | None):
    args = call.args[:1] if call.func is builtins.enumerate else call.args
    notes = (note or {}).get("args") or [None] * len(args)
    sources = []
    how = []
    # zip(a, b) ran iter(a), iter(b), then next(a), next(b): every note holds the RNG state from
    # before iter(a), and the samplers' first draws come after all the iter() calls.
    restored = False
    loaders = []
    for arg, arg_note in zip(args, notes):
        if _by_sampler(arg, arg_note):
            it, method = _dataloader_at(arg, skip, arg_note, restore_rng=not restored, start=False), "by batch sampler"
            restored = True
            loaders.append(it)
        else:
            it, method = iterator_at(arg, skip, arg_note)
        sources.append(it)
        how.append(method)
    for it in loaders:
        _start(it)
    if call.func is builtins.enumerate:
        start = call.args[1] if len(call.args) > 1 else call.kwargs.get("start", 0)
        return enumerate(sources[0], start + skip), how[0]
    return zip(*sources, **call.kwargs), ", ".join(how)


class _SkippingSampler:
    """An index sampler whose iteration starts ``skip`` batches in."""

    def __init__(self, sampler, skip: int, rng_at_iter=None):
        self.sampler, self.skip, self.rng_at_iter = sampler, skip, rng_at_iter

    def __iter__(self):
        return _SkipIter(self.sampler, self.skip, self.rng_at_iter)

    def __len__(self):
        return len(self.sampler)

    def __getattr__(self, name):
        return getattr(self.sampler, name)


class _SkipIter:
    """Skips on ``start()``: the original run's first next() (RandomSampler's seed draw)
    happened right after iter(), before anything else touched the RNG, and so must this."""

    def __init__(self, sampler, skip: int, rng_at_iter=None):
        self._sampler, self._skip, self._it, self._rng = sampler, skip, None, rng_at_iter

    def start(self) -> "_SkipIter":
        if self._it is None:
            if self._rng is not None:
                import torch

                torch.set_rng_state(self._rng)  # undo the base-seed draw a reused iterator never made
            self._it = iter(self._sampler)
            deque(itertools.islice(self._it, self._skip), maxlen=0)
        return self

    def __iter__(self):
        return self

    def __next__(self):
        return next(self.start()._it)


def _restore_rng(loader, note: dict) -> None:
    import torch

    torch.set_rng_state(_byte_tensor(note["torch_rng"]))
    if note.get("generator_rng") and loader.generator is not None:
        loader.generator.set_state(_byte_tensor(note["generator_rng"]))


def _dataloader_at(loader, skip: int, note: dict, restore_rng: bool = True, start: bool = True):
    import torch

    if restore_rng:
        _restore_rng(loader, note)
    rng_at_iter = torch.get_rng_state() if note.get("reuses_workers") else None
    original = type(loader)

    class Skipping(original):  # only while iter() builds the iterator
        @property
        def _index_sampler(self):
            return _SkippingSampler(original._index_sampler.fget(self), skip, rng_at_iter)

    loader.__class__ = Skipping
    try:
        it = iter(loader)
    finally:
        loader.__class__ = original
    # A persistent_workers iterator is reset for the next epoch from this attribute: no skipping.
    it._index_sampler = original._index_sampler.fget(loader)
    it._num_yielded = skip
    if start:
        _start(it)
    return it


def _start(it) -> None:
    sampler_iter = getattr(it, "_sampler_iter", None)
    if isinstance(sampler_iter, _SkipIter):
        sampler_iter.start()
