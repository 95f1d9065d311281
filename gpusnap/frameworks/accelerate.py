"""Accelerate's DataLoader wrapper, tested with Accelerate 1.15.

``accelerator.prepare(loader)`` returns a ``DataLoaderShard``: no torch DataLoader subclass (it
holds one, ``base_dataloader``, and only claims its ``__class__``), whose ``__iter__`` is a
generator that, at its first ``next()``, synchronises RNG states across processes, registers with
accelerate's ``GradientState``, calls ``set_epoch(self.iteration)`` and iterates the base loader
one batch ahead of what it yields (to flag the last batch).

Both where a loop iterates the shard (fast-forward: an Accelerate loop, ``for batch in loader``)
and where the program advances its generator by hand (livecheck: the transformers Trainer's
``epoch_iterator``), a generator is put where the original stood after yielding n batches:
the base loader's index sampler skips n - 1 batches (no skipped sample is loaded), then one
``next()`` runs the generator's own start, takes batch n - 1 and looks ahead to batch n, as the
original had. Its ``batch_index`` then counts from 0, not n - 1: it is only compared with
``skip_batches``, which must be 0, and gpusnap counts by the base iterator instead. A base loader
with no index sampler to skip by (an iterable-style dataset, workers that draw random numbers) is
consumed: a new generator takes the n batches, and must then hold the batches the original held
(or, with no workers, its dataset's iterator must stand where the original's stood). Anything
else (``skip_batches``, a base that is no torch DataLoader) is refused.

The step loop of an Accelerate program is the program's own: no module needs instrumenting.

``Accelerator._dataloaders`` lists every DataLoader ``prepare`` made, those of evaluations that
ran in iterations the replay skips too (the transformers Trainer prepares one per evaluation):
restore keeps the replay's list (``pickler.REPLAYED_ATTRS``). What it lists are live-only loaders,
and nothing but ``save_state`` reads the list. The same for ``GradientState``'s weak references
to the loaders being iterated (one shared state for every Accelerator of the process): a loader
registers there at each iterator's start and leaves only at an end the transformers Trainer
never reaches, so the list grows by one each epoch, a finished Trainer's epochs included; the
replay, which passes over a finished phase's loops (a first Trainer's), holds fewer. Only the
last is read (``active_dataloader``), and the replay's is the loader it started again.
"""

from __future__ import annotations

import functools
import inspect
import weakref

from gpusnap.capture.pickling import pickler
from gpusnap.capture.trainee import loopnotes
from gpusnap.graph import iterators, rng
from gpusnap.graph.digest import digest, fingerprint
from gpusnap.onimport import after_import
from gpusnap.restore import fastforward, livecheck

SHARD = "accelerate.data_loader.DataLoaderShard"
DISPATCHER = "accelerate.data_loader.DataLoaderDispatcher"
# A shard generator -> the global RNG states when iter() made it: where the original started it,
# which the replay must give a new one (a Trainer in its first epoch has recorded no other).
_made_with: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_CURRENT = object()  # a candidate: the RNG states the replay has
_END = object()


def _note_rng_at_iter(module) -> None:
    for cls in (module.DataLoaderShard, module.DataLoaderDispatcher):
        cls.__iter__ = _noting_rng(cls.__iter__)


def _noting_rng(wrapper_iter):
    @functools.wraps(wrapper_iter)
    def __iter__(self):
        gen = wrapper_iter(self)
        _made_with[gen] = rng.compact()
        return gen

    return __iter__


def _over_dataloader(shard) -> bool:
    from torch.utils.data import DataLoader

    return shard.skip_batches == 0 and isinstance(getattr(shard, "base_dataloader", None), DataLoader)


def _by_sampler(shard) -> bool:
    return _over_dataloader(shard) and fastforward.samples_by_index(shard.base_dataloader)


def _in_a_group() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


class ShardLoop:
    """A loop over a ``DataLoaderShard`` (``fastforward.ADAPTERS``); with ``by_sampler`` False,
    over a ``DataLoaderDispatcher``, always consumed. The wrapper is live-only, and its epoch
    count (``iteration``, which its ``__iter__`` hands to ``set_epoch``) is put back to what the
    original had when the loop started, whatever the replay skipped, consumed or not."""

    def __init__(self, by_sampler: bool = True):
        self.by_sampler = by_sampler

    def describe(self, shard) -> dict:
        if not (self.by_sampler and _by_sampler(shard)):
            return {"kind": "iter", "iteration": shard.iteration}
        inner = fastforward.DataLoaderAdapter().describe(shard.base_dataloader)
        return {"kind": "dataloader_shard", "iteration": shard.iteration, "inner": inner}

    def position(self, shard, skip, note, ctx, at):
        if note and "iteration" in note:  # (notes before 2026-12-02 named it for the shard's sampler only)
            shard.iteration = note["iteration"]
        if not (note and note.get("kind") == "dataloader_shard" and self.by_sampler and _by_sampler(shard)):
            return fastforward.consume(shard, skip, ctx, at, pure=False)
        return fastforward.wrapper_at(iter(shard), shard.base_dataloader, skip, note["inner"], ctx, at), "by batch sampler"


class ShardIterator:
    """A ``DataLoaderShard``'s generator that the program advances itself (``graph.iterators.ADAPTERS``);
    with ``DISPATCHER``'s names, a ``DataLoaderDispatcher``'s (what ``prepare`` makes of a loader over
    an iterable-style dataset: one process iterates the base loader, and broadcasts).

    The replay made its own in the same place, and may have advanced it from the wrong start
    already (the body of the loop whose iteration the snapshot was in took batches again, with
    the RNG states of that iteration). A generator cannot go back, so a new one takes its place,
    started at the saved count (as above) with the global RNG states the original had when it
    started: those recorded when ``iter()`` made it (gpusnap wraps ``__iter__`` to note them), the
    replay's own at this point, or one of those the snapshot recorded where loops and iterations
    started. The right one is the one whose base iterator draws the base seed the original drew;
    then its sampler must stand at the same indices, or, consumed, it must hold what the
    original held (``_place_when_consumed``). Otherwise restart refuses."""

    def __init__(self, kind: str, cls: str, base: str, held: tuple[str, ...], by_sampler: bool = True):
        self.kind, self.cls, self.by_sampler = kind, cls, by_sampler  # by_sampler: as ShardLoop's
        self.base, self.held = base, held  # its locals: the base iterator, the batches it holds

    def describe(self, gen, read) -> dict | None:
        if inspect.getgeneratorstate(gen) != inspect.GEN_SUSPENDED:
            return None  # created or finished: the generic check compares states
        local = gen.gi_frame.f_locals
        wrapper = local["self"]
        if not _over_dataloader(wrapper):
            return {"kind": "iterator", "why": f"a {self.cls} that skips batches or is over no torch DataLoader"}
        info = {
            "kind": self.kind,
            "yielded": self._yielded(gen),
            "iteration": wrapper.iteration,
            "ended": bool(wrapper.end_of_dataloader),
            "inner": loopnotes.describe(local[self.base], read),
            "rng": rng.to_json(_made_with[gen], read) if gen in _made_with else None,
        }
        if not (self.by_sampler and _by_sampler(wrapper)):
            info["consume"] = self._place_when_consumed(gen, read)
        return info

    def check(self, live, info: dict, path: str, scene) -> str | None:
        if not (inspect.isgenerator(live) and live.__qualname__ == f"{self.cls}.__iter__" and live.gi_frame is not None):
            return f"cannot find the running {self.cls} iterator that the run that took the snapshot held at {path}"
        wrapper = live.gi_frame.f_locals["self"]
        if wrapper.iteration != info["iteration"]:
            return (
                f"found the {self.cls} iterator at {path} made for epoch {wrapper.iteration}, "
                f"the run that took the snapshot's for epoch {info['iteration']}"
            )
        consume = info.get("consume")
        if not (_over_dataloader(wrapper) and (consume is not None or (self.by_sampler and _by_sampler(wrapper)))):
            return f"cannot position the {self.cls} iterator at {path}: its loader skips batches or has no index sampler"
        if consume is not None and _in_a_group():
            return (f"cannot position the {self.cls} iterator at {path}: its loader has no index sampler, and taking its "
                    "batches again would need every process of the job in step")
        taken, inner = info["yielded"], info["inner"] or {}
        for state in (info.get("rng"), _CURRENT, *scene.rng_states):
            if state is None:
                continue
            if state is not _CURRENT:
                rng.restore_json(state)
            gen = iter(wrapper)
            if consume is None:
                fastforward.wrapper_at(gen, wrapper.base_dataloader, taken, {})
            elif next(gen, _END) is _END:
                return f"cannot position the {self.cls} iterator at {path}: its loader yielded nothing"
            if gen.gi_frame.f_locals[self.base]._base_seed == inner.get("base_seed"):
                break
        else:
            return f"cannot position the {self.cls} iterator at {path}: no RNG state in the snapshot makes it draw its seed"
        if consume is not None:
            problem = self._consume_to(gen, taken, consume, path)
            if problem:
                return problem
        problem = scene.replace(live, gen)
        if problem:
            return problem
        how = "by batch sampler" if consume is None else "by taking batches"
        scene.say(f"started the {self.cls} iterator at {path} again at batch {taken} {how}")
        if bool(wrapper.end_of_dataloader) != info["ended"]:
            where = "at" if wrapper.end_of_dataloader else "before"
            return f"found the {self.cls} iterator at {path} {where} its end, unlike the run that took the snapshot"
        if consume is not None:
            return None  # (its base iterator took the batches itself: nothing left to skip)
        return livecheck.position_loader_iter(gen.gi_frame.f_locals[self.base], inner, f"{path} (its DataLoader's)", scene.say)

    def _yielded(self, gen) -> int:
        """Batches a started generator has yielded: its base iterator is one ahead, except at
        the end (reading ``batch_index`` would not do: it counts from 0 after a positioning)."""
        local = gen.gi_frame.f_locals
        return local[self.base]._num_yielded - (0 if local["self"].end_of_dataloader else 1)

    def _place_when_consumed(self, gen, read) -> dict:
        """What proves that a generator run again by taking batches stands where ``gen`` stood:
        the digest of the batches it holds (the one it yielded, the one it looked ahead to), or,
        with no workers, the fingerprint of its dataset's iterator (a batch drawn at random in
        collation differs when run again; the dataset's place does not)."""
        local = gen.gi_frame.f_locals
        dataset_iter = getattr(getattr(local[self.base], "_dataset_fetcher", None), "dataset_iter", None)
        return {
            "batches": digest(tuple(local.get(name) for name in self.held), read)[0],
            "dataset_iter": fingerprint(dataset_iter, read, strict=True) if dataset_iter is not None else None,
        }

    def _consume_to(self, gen, taken: int, saved: dict, path: str) -> str | None:
        """Take batches from ``gen``, a new generator that yielded one, until it has yielded
        ``taken``; a problem unless it then stands where the saved one stood."""
        for count in range(1, taken):
            if next(gen, _END) is _END:
                return f"made the {self.cls} iterator at {path} again, and it ended after {count} of the {taken} batches the run had taken"
        now = self._place_when_consumed(gen, None)
        if any(saved.get(key) is not None and now[key] == saved[key] for key in ("batches", "dataset_iter")):
            return None
        return (f"made the {self.cls} iterator at {path} again by taking {taken} batches, and neither the batches it "
                "holds nor its dataset's iterator stand as the run's did")


after_import("accelerate.data_loader", _note_rng_at_iter)
# A suspended shard generator holds the batch it yielded and the next one, collated already (with
# whatever random numbers its collate function drew then): the snapshot keeps both. A dispatcher
# holds them too, with the first batch's head, which completes a short last batch.
pickler.FETCHED_AHEAD[f"{SHARD}.__iter__"] = SHARD_HELD = ("current_batch", "next_batch")
pickler.FETCHED_AHEAD[f"{DISPATCHER}.__iter__"] = DISPATCHER_HELD = ("batch", "next_batch", "next_batch_info", "first_batch")
pickler.REPLAYED_ATTRS["accelerate.accelerator.Accelerator"] = frozenset({"_dataloaders"})
pickler.REPLAYED_ATTRS["accelerate.state.GradientState"] = frozenset({"_dataloader_references_ref"})
fastforward.ADAPTERS[SHARD] = ShardLoop()
fastforward.ADAPTERS[DISPATCHER] = ShardLoop(by_sampler=False)
iterators.ADAPTERS[f"{SHARD}.__iter__"] = ShardIterator("dataloader_shard_iter", "DataLoaderShard", "dataloader_iter", SHARD_HELD)
iterators.ADAPTERS[f"{DISPATCHER}.__iter__"] = ShardIterator(
    "dataloader_dispatcher_iter", "DataLoaderDispatcher", "main_iterator", DISPATCHER_HELD, by_sampler=False
)
