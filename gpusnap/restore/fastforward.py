"""Fast-forward: start a loop's iteration at item ``skip`` without running skipped bodies,
exactly or not at all.

Capture side, at every loop start of the original run: ``part(source)`` says whether the source
is a known pure container (None: ``list``, ``tuple``, ``str``, ``bytes``, dicts and their views,
sets, numpy arrays, torch tensors, ``nn.ModuleList``/``Sequential``/``ModuleDict``/
``ParameterList``/``ParameterDict``, and ``enumerate``/``zip``/``islice``/``tqdm`` of those; a
``range`` notes its bounds, nothing more); for any other source ``with_rng(part)`` adds the
global RNG states (random, numpy, torch, torch.cuda) taken before ``iter()`` runs: the note kept
with the loop.

Replay side, ``iterator_at(source, skip, note, ctx)`` restores those RNG states, then:

- ``range``, ``list``, ``tuple``: their iterators take a position (``__setstate__``). A range
  the replay made from another start than the run's (its setup took another path: it found a
  checkpoint of the program's own) goes on from the run's item instead, to the replay's end (an
  end changed on purpose, a longer training in the config, stays the replay's).
- ``torch.utils.data.DataLoader`` over a map-style dataset: the loader's generator is put back
  too, then the iterator is built with an index sampler that drops the first ``skip`` batches of
  indices. Workers receive only the indices after them: no skipped sample is loaded, shuffling
  and worker seeds come out the same. An iterable-style dataset ignores indices: it is consumed.
  So is a loader with workers when the program's workers drew random numbers while fetching
  (``graph.workers``): their generators must take the skipped batches' draws too.
- ``enumerate``, ``zip``, ``islice`` (deferred by the transform) and ``tqdm`` (a table of
  adapters keyed by class, ``ADAPTERS``): seen through; their sources are positioned and the
  wrapper rebuilt around them (a tqdm's count continues from ``skip``).
- anything else: ``skip`` items are consumed. That is exact only when the original run drew
  nothing, between the items, that the source depends on, which replay cannot know. So every
  consumption of a non-pure source is reported in ``ctx.consumed`` with its last item and
  whether it changed the global RNG states; replay (``itemcheck``) compares the item with the
  digest the writer took of the original's, and refuses what it cannot prove.

A source that ends before ``skip`` items, or that raises, makes restart refuse (``replay``).
"""

from __future__ import annotations

import builtins
import contextlib
import itertools
import types
from collections import deque

from gpusnap.errors import FastForwardError
from gpusnap.graph import rng, workers
from gpusnap.graph.digest import digest
from gpusnap.graph.iterators import generator_states, put_generators, put_state, sampler_generators, samplers_of, state_of
from gpusnap.instrument.loops import _DeferredCall

_POSITIONED = (range, list, tuple)
_PURE_TYPES = frozenset(
    {range, list, tuple, str, bytes, bytearray, dict, set, frozenset, type({}.keys()), type({}.values()), type({}.items())}
)
# Iterated by index or key without drawing anything; exact class names (a subclass may iterate
# differently).
_PURE_NAMES = frozenset(
    {
        "numpy.ndarray",
        "torch.Tensor",
        "torch.nn.parameter.Parameter",
        "torch.nn.modules.container.ModuleList",
        "torch.nn.modules.container.Sequential",
        "torch.nn.modules.container.ModuleDict",
        "torch.nn.modules.container.ParameterList",
        "torch.nn.modules.container.ParameterDict",
    }
)
_END = object()
NO_ITEM = object()  # a Consumed entry with no item to compare


def _class_name(cls) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


# -- capture ---------------------------------------------------------------------------------
def part(source) -> dict | None:
    """None for a pure source but a range; otherwise its structure, with what positioning it
    will need. A range's bounds are kept: a replayed setup that took another path can make
    another one (a script that resumes itself from a checkpoint it finds at start)."""
    cls = type(source)
    if cls is range:
        return {"kind": "range", "range": [source.start, source.stop, source.step]}
    if cls in _PURE_TYPES:
        return None
    if cls is _DeferredCall:
        func = source.func
        sources = source.sources()
        parts = [part(arg) for arg in sources]
        return {"kind": "call", "func": func.__name__, "args": parts} if any(parts) else None
    adapter = _adapter(cls)
    if adapter is _PURE:
        return None
    if adapter is not None:
        return adapter.describe(source)
    note = {"kind": "iter"}
    owned = rng.owned_states(_holders(source))
    if owned:
        note["owned"] = owned
    return note


def _holders(source) -> dict:
    """Where a source keeps generators of its own: a generator's locals (its arguments, before
    it starts), or an iterable's attributes (its ``__iter__`` reads them)."""
    if isinstance(source, types.GeneratorType):
        return source.gi_frame.f_locals if source.gi_frame is not None else {}
    return getattr(source, "__dict__", None) or {}


def with_rng(note: dict) -> dict:
    return {**note, "rng": rng.compact()}


def may_draw(note: dict | None) -> bool:
    """Whether taking items from a source of this ``part`` may draw random numbers: not a pure
    source, nor a range, nor enumerate, zip, islice or tqdm of those."""
    if note is None or note.get("kind") == "range":
        return False
    if note.get("kind") == "call":
        return any(may_draw(arg) for arg in note.get("args") or ())
    if note.get("kind") == "tqdm":
        return may_draw(note.get("inner"))
    return True


def describe(source) -> dict | None:
    """The note of a loop over ``source`` (raw: ``itemcheck.note_json`` makes it JSON): its
    ``part``, with the global RNG states where it may draw."""
    note = part(source)
    return with_rng(note) if may_draw(note) else note


# -- replay ----------------------------------------------------------------------------------
class Consumed:
    """One non-pure source that fast-forward consumed: where its items sit in the loop's item
    (``at``: tuple indexes), its last consumed item, and whether consuming drew random numbers."""

    __slots__ = ("at", "last", "draws")

    def __init__(self, at: tuple, last, draws: bool):
        self.at, self.last, self.draws = at, last, draws


class Context:
    """What one fast-forward did: ``consumed`` sources, and every source and iterator it
    ``touched`` (the replay leaves those out of its check of live iterators)."""

    __slots__ = ("consumed", "touched", "remakes")

    def __init__(self):
        self.consumed: list[Consumed] = []
        self.touched: list = []
        self.remakes: list[Remake] = []  # orders to draw again after the merge


def iterator_at(source, skip: int, note: dict | None, ctx: Context | None = None) -> tuple[object, str]:
    """An iterator over ``source`` positioned at item ``skip``, and how it got there."""
    ctx = ctx if ctx is not None else Context()
    if note and isinstance(note.get("rng"), dict):
        rng.restore_json(note["rng"])  # the states the original run had when the loop started
    return _position(source, skip, note, ctx, ())


def _position(source, skip: int, note: dict | None, ctx: Context, at: tuple):
    ctx.touched.append(source)
    if isinstance(source, _DeferredCall):
        return _call_at(source, skip, note, ctx, at)
    if type(source) is range and note and note.get("kind") == "range":
        start, _, step = note["range"]
        if source.start != start and source.step == step:
            # The replay's setup took another path (it found a checkpoint of the program's own):
            # the loop goes on from the run's item, to the replay's end (the merge puts back what
            # that path changed; the witness checks).
            value = start + skip * step
            return iter(range(value, source.stop, step)), f"by value, from the run's item {value} (the replay made {source})"
    if type(source) in _POSITIONED:
        if skip > len(source):
            raise FastForwardError(f"its source has {len(source)} items, the run that took the snapshot had taken {skip}")
        it = iter(source)
        it.__setstate__(skip)
        return it, "by index"
    adapter = _adapter(type(source))
    if adapter is not None and adapter is not _PURE:
        return adapter.position(source, skip, note, ctx, at)
    return consume(source, skip, ctx, at, pure=adapter is _PURE or type(source) in _PURE_TYPES, note=note)


def consume(source, skip: int, ctx: Context, at: tuple, pure: bool, note: dict | None = None, it=None):
    """``skip`` items of ``source`` (or of ``it``, an iterator made of it already) taken."""
    owned = (note or {}).get("owned")
    if owned:
        _restore_owned(source, owned)
    it = iter(source) if it is None else it
    ctx.touched.append(it)
    if skip:
        before = None if pure else rng.compact()
        deque(itertools.islice(it, skip - 1), maxlen=0)
        last = next(it, _END)
        if last is _END:
            raise FastForwardError(f"its source ended before item {skip - 1}, which the run that took the snapshot had reached")
        if not pure:
            ctx.consumed.append(Consumed(at, last, not rng.same(before, rng.compact())))
    return it, f"by consuming {skip} items"


def _call_at(call: _DeferredCall, skip: int, note: dict | None, ctx: Context, at: tuple):
    func = call.func
    if func is itertools.islice:
        return _islice_at(call, skip, note, ctx, at)
    args = call.args[:1] if func is builtins.enumerate else call.args
    notes = (note or {}).get("args") or [None] * len(args)
    sources, how, loaders = [], [], []
    # zip(a, b) ran iter(a), iter(b), then next(a), next(b): the samplers' first draws come after
    # all the iter() calls. Old notes hold the torch state per loader, each from before iter(a).
    restored = False
    for j, (arg, arg_note) in enumerate(zip(args, notes)):
        ctx.touched.append(arg)
        sub = at + ((1,) if func is builtins.enumerate else (j,))
        if _by_sampler(arg, arg_note):  # (any other loader is checked by its adapter's ``position``)
            _check_workers_copy(arg, arg_note)
            remake = _remake_of(arg, arg_note, rng.capture())
            it = _dataloader_at(arg, skip, arg_note, restore_torch=not restored, start=False)
            restored = True
            loaders.append((it, sub, remake))
            method = "by batch sampler"
        else:
            it, method = _position(arg, skip, arg_note, ctx, sub)
        sources.append(it)
        how.append(method)
    for it, sub, remake in loaders:
        start_skipping(it, ctx, sub, remake)
    if func is builtins.enumerate:
        start = call.args[1] if len(call.args) > 1 else call.kwargs.get("start", 0)
        return enumerate(sources[0], start + skip), how[0]
    return zip(*sources, **call.kwargs), ", ".join(how)


def _islice_at(call: _DeferredCall, skip: int, note: dict | None, ctx: Context, at: tuple):
    source, *bounds = call.args
    span = slice(*bounds)  # islice(s, stop) or islice(s, start, stop[, step]), as slice() reads them
    start, stop, step = span.start or 0, span.stop, span.step or 1
    inner = ((note or {}).get("args") or [None])[0]
    if not skip:
        it, how = _position(source, 0, inner, ctx, at)
        return itertools.islice(it, *bounds), how
    # Position the source just after the last item handed to the body (item skip - 1 of the
    # islice), as the original had consumed it; the islice goes on from there.
    last = start + (skip - 1) * step
    if stop is not None and last >= stop:
        raise FastForwardError(f"its islice yields fewer than the {skip} items the run that took the snapshot had taken")
    it, how = _position(source, last + 1, inner, ctx, at)
    return itertools.islice(it, step - 1, None if stop is None else max(stop - last - 1, 0), step), how


def _restore_owned(source, owned: dict) -> None:
    """The source's own generators, back to their states when the original loop started."""
    holders = _holders(source)
    for name, saved in owned.items():
        if not rng.restore_owned(holders.get(name), saved):
            raise FastForwardError(f"its source's generator {name!r} is not the {saved.get('kind')} the run that took the snapshot had")


# -- adapters: sources seen through, keyed by class --------------------------------------------
class _Pure:
    """Marks a class whose iteration is pure (``_PURE_NAMES``)."""


_PURE = _Pure()


class DataLoaderAdapter:
    """``torch.utils.data.DataLoader`` (and subclasses that keep its ``__iter__``)."""

    def describe(self, loader) -> dict:
        generator = loader.generator
        note = {"kind": "dataloader", "generator_rng": generator.get_state() if generator is not None else None}
        if not samples_by_index(loader):
            note["consumed"] = True
        else:
            sampler, _ = sampler_digest(loader)
            if sampler is not None:
                note["sampler"] = sampler  # replay: is its sampler the run's when the loop starts?
                note["sampler_plain"] = sampler_plain_attrs(loader)  # what it may have changed since (``as_its_loop_started``)
            own = sampler_generators(loader)
            if own:
                note["sampler_rngs"] = own  # a sampler's generator of its own: put back with the loader's
        if loader.num_workers > 0:
            note["workers"] = loader.num_workers  # the writer digests the last batch: replay may take the skipped ones
        if loader.persistent_workers and loader.num_workers > 0 and loader._iterator is not None:
            note["reuses_workers"] = True  # this iter() draws no base seed: it only resets the iterator
        elif loader.num_workers > 0:
            dataset, _ = digest(loader.dataset, by_name=True)
            if dataset is not None:
                note["dataset"] = dataset  # what the workers copy as the loop starts (``_check_workers_copy``)
        return note

    def position(self, loader, skip, note, ctx, at):
        _check_workers_copy(loader, note)
        if _by_sampler(loader, note):
            remake = _remake_of(loader, note, rng.capture())
            it = _dataloader_at(loader, skip, note, start=False)
            start_skipping(it, ctx, at, remake)
            return it, "by batch sampler"
        if note and note.get("kind") == "dataloader":
            _restore_rng(loader, note)
            if loader.persistent_workers and loader.num_workers > 0 and workers.seen():
                return _persistent_at(loader, skip, note, ctx, at)
        it, how = consume(loader, skip, ctx, at, pure=False)
        if loader.num_workers > 0 and workers.seen():
            how += " (its workers draw random numbers)"
        return it, how


def _check_workers_copy(loader, note: dict) -> None:
    """A loader's workers copy its dataset when its iterator is made, here before the merge: a
    dataset the replay made otherwise than the run (a self-training script relabels it at each
    epoch's end, and the replay skipped those ends) would be loaded from the replay's copy while
    the main process holds the run's after the merge. A restart said "verified" over the one
    iteration its witness held, and ended with other bytes. Refused, where the run's digest of
    the dataset as the loop started differs from the replay's; without a digest (too large, a
    set), or for persistent workers the run made in an earlier epoch, the witness judges."""
    want = note.get("dataset")
    if not want or loader.num_workers == 0 or note.get("reuses_workers"):
        return  # persistent workers made in an earlier epoch hold that epoch's copy (the run notes none now)
    have, _ = digest(loader.dataset, by_name=True)
    if have is not None and have != want:
        raise FastForwardError(
            f"its DataLoader's {loader.num_workers} workers would load from a dataset other than the run's as the loop "
            "started (state that iterations the replay skips changed), copied before the merge",
            "a dataset that each epoch changes restarts exactly with num_workers=0, or from a snapshot in its first "
            "epoch: restart from another snapshot with --snapshot ID, or start fresh with --resume never",
        )


def _persistent_at(loader, skip: int, note: dict, ctx: Context, at: tuple):
    """A loader whose persistent workers draw random numbers: the replay's workers, fresh, are
    given the states the original's started this epoch with (``graph.workers``), and the
    epoch's batches up to ``skip`` are taken from them, as the original's workers drew them."""
    states = note.get("worker_rng")
    if states:
        if not workers.put_back(loader, states):
            raise FastForwardError("its persistent DataLoader workers, which the replay started already, did not "
                                   f"start fetching within {workers.START_TIMEOUT_S:.0f} s")
    elif note.get("reuses_workers"):
        raise FastForwardError("its persistent DataLoader workers draw random numbers and served earlier epochs, "
                               "and the snapshot does not hold where their generators stood")
    # The original's iter() only reset its workers; the replay's makes them and draws a base
    # seed first: the index sampler starts from the states the original's did (``skipping``).
    with skipping(loader, 0, note) as built:
        it = iter(loader)
    for made in built:
        start_skipping(made)
    it, how = consume(loader, skip, ctx, at, pure=False, it=it)
    return it, how + " (its persistent workers' generators put back)" if states else how


class TqdmAdapter:
    """``tqdm(iterable)``: the iterable is positioned, the bar's count goes on from ``skip``."""

    def describe(self, bar) -> dict | None:
        inner = part(bar.iterable)
        return {"kind": "tqdm", "inner": inner} if inner is not None else None

    def position(self, bar, skip, note, ctx, at):
        inner = note.get("inner") if note and note.get("kind") == "tqdm" else None
        it, how = _position(bar.iterable, skip, inner, ctx, at)
        return _tqdm_resumed(bar, it, bar.n + skip), how


def _tqdm_resumed(bar, inner, n):
    # Runs from the loop's first next(), after a merge that may have written the bar's fields.
    source = bar.iterable
    bar.iterable, bar.n, bar.last_print_n = inner, n, n
    for item in bar:  # tqdm.__iter__ has read bar.iterable and bar.n before the first item
        if bar.iterable is inner:
            bar.iterable = source
        yield item


# Class name -> adapter; looked up along the source's MRO. Add a framework's DataLoader wrapper
# here (an adapter with ``describe(source) -> note`` and ``position(source, skip, note, ctx, at)
# -> (iterator, how)``).
ADAPTERS = {
    "torch.utils.data.dataloader.DataLoader": DataLoaderAdapter(),
    "tqdm.std.tqdm": TqdmAdapter(),
}
_by_class: dict = {}


def _adapter(cls):
    found = _by_class.get(cls, _END)
    if found is _END:
        found = _PURE if _class_name(cls) in _PURE_NAMES else None
        if found is None:
            found = next((ADAPTERS[n] for n in map(_class_name, cls.__mro__) if n in ADAPTERS), None)
        _by_class[cls] = found
    return found


# -- DataLoader by batch sampler -----------------------------------------------------------------
def samples_by_index(loader) -> bool:
    """Can the loader's batches be skipped by its index sampler, exactly?"""
    from torch.utils.data import DataLoader, IterableDataset

    if loader.num_workers > 0 and workers.seen():
        return False  # workers that draw random numbers must draw the skipped batches' too
    return not isinstance(loader.dataset, IterableDataset) and type(loader).__iter__ is DataLoader.__iter__


def _by_sampler(source, note: dict | None) -> bool:
    if not (note and note.get("kind") == "dataloader" and not note.get("consumed")):
        return False
    return isinstance(_adapter(type(source)), DataLoaderAdapter) and samples_by_index(source)


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
    happened right after iter(), before anything else touched the RNG, and so must this.

    A sampler that draws from the global RNGs for every batch drew, in the original run, between
    loop bodies that may have drawn too: skipping cannot prove its order (``draws``)."""

    def __init__(self, sampler, skip: int, rng_at_iter=None):
        self._sampler, self._skip, self._it, self._rng = sampler, skip, None, rng_at_iter
        self.draws = False
        self.drawn_from = None  # the random states before the order was drawn (``Remake``)

    def start(self) -> "_SkipIter":
        if self._it is None:
            if self._rng is not None:
                import torch

                torch.set_rng_state(self._rng)  # undo the base-seed draw a reused iterator never made
            self.drawn_from = (rng.capture(), generator_states(self._sampler))
            self._it = iter(self._sampler)
            skipped = sum(1 for _ in itertools.islice(self._it, min(self._skip, 1)))
            before = rng.compact()
            skipped += sum(1 for _ in itertools.islice(self._it, self._skip - skipped))
            if skipped < self._skip:
                raise FastForwardError(f"its DataLoader has {skipped} batches, the run that took the snapshot had taken {self._skip}")
            self.draws = not rng.same(before, rng.compact())
        return self

    def __iter__(self):
        return self

    def __next__(self):
        return next(self.start()._it)


def _restore_rng(loader, note: dict, restore_torch: bool = True) -> None:
    import torch

    if restore_torch and note.get("torch_rng"):  # notes written before "rng" existed
        torch.set_rng_state(rng.tensor_b64(note["torch_rng"]))
    put_generators(loader, note.get("generator_rng"), note.get("sampler_rngs") or [])


def _dataloader_at(loader, skip: int, note: dict, restore_torch: bool = True, start: bool = True):
    """The loader's iterator at batch ``skip``; ``start=False``: the skipping waits for
    ``start_skipping`` (a zip makes every iterator before the first draws)."""
    with skipping(loader, skip, note, restore_torch):
        it = iter(loader)
    if start:
        start_skipping(it)
    return it


@contextlib.contextmanager
def skipping(loader, skip: int, note: dict, restore_torch: bool = True):
    """While open, ``iter(loader)`` (called by the program or by a wrapper's ``__iter__``) builds
    an iterator whose index sampler starts ``skip`` batches in: no skipped sample is loaded. The
    loader's generator is put back first (``note``, as ``DataLoaderAdapter.describe`` wrote it).
    Yields the list of the iterators built (``start_skipping`` each)."""
    import torch

    _restore_rng(loader, note, restore_torch)
    rng_at_iter = torch.get_rng_state() if note.get("reuses_workers") else None
    original = type(loader)
    built = []

    class Skipping(original):  # only while open
        @property
        def _index_sampler(self):
            return _SkippingSampler(original._index_sampler.fget(self), skip, rng_at_iter)

        def __iter__(self):
            built.append(original.__iter__(self))
            return built[-1]

    loader.__class__ = Skipping
    try:
        yield built
    finally:
        loader.__class__ = original
        for it in built:
            # A persistent_workers iterator is reset for the next epoch from this attribute: no skipping.
            it._index_sampler = original._index_sampler.fget(loader)
            it._num_yielded += skip


def wrapper_at(gen, loader, taken: int, note: dict, ctx: Context | None = None, at: tuple = ()):
    """``gen``, the generator of a wrapper over ``loader`` (Accelerate's shard, Fabric's loader),
    not started, after yielding ``taken`` batches: the loader's index sampler skips ``taken - 1``
    (no skipped sample is loaded), and one ``next()`` runs the wrapper's own start (its
    ``set_epoch``, a look-ahead) and takes batch ``taken - 1``."""
    if taken:
        with skipping(loader, taken - 1, note) as built:
            next(gen)
        for it in built:
            start_skipping(it, ctx, at)
    return gen


def skips_by_sampler(loader) -> bool:
    """Can ``loader_iterator_at`` make ``loader``'s iterator?"""
    return isinstance(_adapter(type(loader)), DataLoaderAdapter) and samples_by_index(loader)


def loader_iterator_at(loader, skip: int):
    """``iter(loader)`` (``skips_by_sampler``), made now from the RNG states as they are, whose
    index sampler skips ``skip`` batches once ``start``ed: no skipped sample is loaded, by
    workers either."""
    return _dataloader_at(loader, skip, {}, restore_torch=False, start=False)


def start(it):
    """Skip what ``loader_iterator_at`` made it skip; the underlying index sampler iterator."""
    start_skipping(it)
    return it._sampler_iter


def start_skipping(it, ctx: Context | None = None, at: tuple = (), remake_of: tuple | None = None) -> None:
    """``remake_of``: ``_remake_of``'s, for the merge to settle (``Context.remakes``). A loader
    shorter than the batches to skip is then the merge's to judge too: the run's loop may have
    iterated another (``Remake.short``)."""
    sampler_iter = getattr(it, "_sampler_iter", None)
    if isinstance(sampler_iter, _SkipIter):
        short = None
        try:
            sampler_iter.start()
        except FastForwardError as exc:
            if remake_of is None or ctx is None:
                raise
            short = exc.message
        it._sampler_iter = sampler_iter._it  # positioned: the iterator is as if it had taken those batches
        if sampler_iter.draws and ctx is not None:
            ctx.consumed.append(Consumed(at, NO_ITEM, True))
        if remake_of is not None and ctx is not None:
            ctx.remakes.append(Remake(*remake_of, it, sampler_iter._skip, sampler_iter.drawn_from, short))


# -- a sampler the replay made from other state ----------------------------------------------------
# A program that makes its sampler inside the epoch loop from what earlier epochs computed (hard
# example mining: a WeightedRandomSampler over last epoch's per-sample losses) gets, in the
# replay, a sampler made from setup's values: the replay skipped those epochs. The merge writes
# the run's values into it, but the iterator fast-forward made has drawn its order already. The
# note of the run's loop holds a digest of its sampler as the loop started; where the replay's
# differs, the order is drawn again after the merge, from the same random states, and only
# where the merged sampler then has the run's digest: what changed since the loop started
# (a sampler the program changes mid-epoch) would make the new order another guess. A sampler's
# plain attributes (numbers, strings) as the loop started are in the note too: a sampler whose
# own ``__iter__`` counts its epochs had counted one more as it drew, and the merge gives it that
# count; the order is drawn with the noted ones put back for the while.


def sampler_digest(loader) -> tuple[str | None, str | None]:
    """(digest, None) of what the loader's index sampler draws its order from, other than its
    random number generators: the attributes of each sampler in ``samplers_of`` (a
    WeightedRandomSampler's weights, a DistributedSampler's epoch), each dataset by its type and
    length only; or (None, why)."""
    try:
        state = [_sampler_state(sampler) for sampler in samplers_of(loader._index_sampler)]
    except Exception as exc:  # noqa: BLE001 - a property that raises: nothing proven
        return None, f"{type(exc).__name__} while reading its sampler"
    return digest(state)


_DATA_ATTRS = ("data_source", "dataset")


def _sampler_state(sampler) -> list:
    import torch
    from torch.utils.data import Dataset, Sampler

    state: list = [f"{type(sampler).__module__}.{type(sampler).__qualname__}"]
    for name, value in sorted((getattr(sampler, "__dict__", None) or {}).items()):
        if isinstance(value, torch.Generator):
            value = "a torch.Generator"  # its state is the draws' business: restored, or compared by the witness
        elif (owned := rng.owned_state(value)) is not None:
            value = f"a {owned[0]}"  # (a random.Random, a NumPy generator: the same)
        elif isinstance(value, Dataset) or name in _DATA_ATTRS:
            value = [f"{type(value).__module__}.{type(value).__qualname__}", _length(value)]
        elif isinstance(value, Sampler):
            value = f"the sampler {type(value).__qualname__}"  # its own state is its entry in ``samplers_of``
        state.append([name, value])
    return state


_PLAIN = (int, float, str, bool, type(None))


def sampler_plain_attrs(loader) -> list[dict]:
    """Each sampler's attributes (``samplers_of``'s order) that hold a number, a string or None:
    what a sampler that counts its own epochs in ``__iter__`` changes after its loop started."""
    return [{name: value for name, value in (getattr(sampler, "__dict__", None) or {}).items() if type(value) in _PLAIN}
            for sampler in samplers_of(loader._index_sampler)]


_CHANGED = "the sampler of the run that took the snapshot changed after its loop started"


@contextlib.contextmanager
def as_its_loop_started(loader, note: dict, want: str, skip: int):
    """Yields None where the loader's sampler has the digest ``want`` the run's had as its loop
    started, or has it with the plain attributes the loop's note kept put back for the while
    (``sampler_plain_attrs``: a sampler whose ``__iter__`` counts its epochs had counted one
    more by the snapshot, and the merge gave it that count); else why not. On exit the sampler's
    attributes are what they were on entry: the skipping of ``skip`` batches inside has run its
    ``__iter__`` by then, which none does with no batch to skip."""
    now, why = sampler_digest(loader)
    noted = note.get("sampler_plain")
    samplers = samplers_of(loader._index_sampler)
    if now == want or not skip or not noted or len(noted) != len(samplers):
        yield None if now == want else (why or _CHANGED)
        return
    missing = object()
    kept = [{name: vars(sampler).get(name, missing) for name in attrs} for sampler, attrs in zip(samplers, noted)]
    try:
        for sampler, attrs in zip(samplers, noted):
            vars(sampler).update(attrs)
        back, why = sampler_digest(loader)
        yield None if back == want else (why or _CHANGED)
    finally:
        for sampler, attrs in zip(samplers, kept):
            for name, value in attrs.items():
                if value is missing:
                    vars(sampler).pop(name, None)
                else:
                    vars(sampler)[name] = value


def _length(data) -> int | None:
    try:
        return len(data)
    except TypeError:
        return None


def _remake_of(loader, note: dict, before_iter) -> tuple:
    """``Remake``'s first fields: the run's sampler digest where the replay's sampler, as its
    loop starts, has another; else None."""
    want = note.get("sampler")
    return loader, (want if want and sampler_digest(loader)[0] != want else None), note, before_iter


class Remake:
    """A DataLoader iterator that fast-forward positioned by its batch sampler, settled after the
    merge (``restore.replay``): its loader, the run's sampler digest where the replay's sampler
    differed as the loop started (None: the same), the loop's note of the loader, the global
    random states before ``iter()``, the iterator, the batches it skipped, the random states
    before its order was drawn (global, and the samplers' generators), and why it could not
    skip them (None: it did; else a refusal, unless the run's loop iterated another loader)."""

    __slots__ = ("loader", "want", "note", "before_iter", "it", "skip", "drawn_from", "short")

    def __init__(self, loader, want: str | None, note: dict, before_iter, it, skip: int, drawn_from: tuple,
                 short: str | None = None):
        self.loader, self.want, self.note, self.before_iter = loader, want, note, before_iter
        self.it, self.skip, self.drawn_from, self.short = it, skip, drawn_from, short

    def redraw(self) -> str | None:
        """After the merge: the order drawn again, from the merged sampler and the same states,
        into the iterator the loop holds (its batch count and base seed stay); or why not (the
        iterator then stays as fast-forward made it, and the witness judges it)."""
        if self.it._num_workers:
            return "its workers hold the order drawn before the merge"
        global_states, generators = self.drawn_from
        with as_its_loop_started(self.loader, self.note, self.want, self.skip) as why, _states_kept(generators):
            if why is not None:
                return why
            rng.restore(global_states)
            for gen, state in generators.items():
                put_state(gen, state)
            redrawn = _SkipIter(self.loader._index_sampler, self.skip).start()
        self.it._index_sampler = self.loader._index_sampler
        self.it._sampler_iter = redrawn._it
        return None

    def rebase(self, loader) -> str | None:
        """After the merge, where the run's loop iterated ``loader`` (the merged counterpart of
        the run's) and the replay's another, chosen by state that the iterations the replay
        skipped changed (a client's loader drawn each round): the iterator made again from
        ``loader`` as the replay's was made (the same random states, the run's generators as
        its loop started), into the object the loop holds; or why not (it stays, and the
        witness judges it)."""
        if self.it._num_workers or loader.num_workers:
            return "workers load its batches"
        if not skips_by_sampler(loader):
            return "the run's cannot be positioned by its batch sampler"
        want = self.note.get("sampler")
        with (as_its_loop_started(loader, self.note, want, self.skip) if want else contextlib.nullcontext()) as why, \
                _states_kept(_generators_of(loader)):
            if why is not None:
                return "the sampler of the run's changed after its loop started"
            rng.restore(self.before_iter)
            try:
                new = _dataloader_at(loader, 0, self.note, start=False)
                rng.restore(self.drawn_from[0])  # zip(a, b) drew a's order after iter(b)
                skipper = _SkipIter(new._index_sampler, self.skip).start()
            except FastForwardError as exc:
                return exc.message
        if type(new) is not type(self.it):
            return f"the run's makes a {type(new).__qualname__}, the replay's a {type(self.it).__qualname__}"
        new._sampler_iter = skipper._it
        new._num_yielded = self.it._num_yielded
        vars(self.it).clear()
        vars(self.it).update(vars(new))
        return None


def _generators_of(loader) -> dict:
    found = dict.fromkeys(generator_states(loader._index_sampler))
    if loader.generator is not None:
        found[loader.generator] = None
    return found


@contextlib.contextmanager
def _states_kept(generators):
    """The global random states and ``generators``' as they were on entry, again on exit."""
    kept = rng.capture(), {gen: state_of(gen) for gen in generators}
    try:
        yield
    finally:
        rng.restore(kept[0])
        for gen, state in kept[1].items():
            put_state(gen, state)
