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
``skip_batches``, which must be 0, and gpusnap counts by the base iterator instead. Anything
else (``skip_batches``, a stateful or iterable-style base loader) is consumed and checked by
digest, or refused.

The step loop of an Accelerate program is the program's own: no module needs instrumenting.

``Accelerator._dataloaders`` lists every DataLoader ``prepare`` made, those of evaluations that
ran in iterations the replay skips too (the transformers Trainer prepares one per evaluation):
restore keeps the replay's list (``pickler.REPLAYED_ATTRS``). What it lists are live-only loaders,
and nothing but ``save_state`` reads the list.
"""

from __future__ import annotations

import functools
import inspect
import weakref

from gpusnap.capture.pickling import pickler
from gpusnap.capture.trainee import loopnotes
from gpusnap.graph import iterators, rng
from gpusnap.onimport import after_import
from gpusnap.restore import fastforward, livecheck

SHARD = "accelerate.data_loader.DataLoaderShard"
# A shard generator -> the global RNG states when iter() made it: where the original started it,
# which the replay must give a new one (a Trainer in its first epoch has recorded no other).
_made_with: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_CURRENT = object()  # a candidate: the RNG states the replay has


def _note_rng_at_iter(module) -> None:
    shard_iter = module.DataLoaderShard.__iter__

    @functools.wraps(shard_iter)
    def __iter__(self):
        gen = shard_iter(self)
        _made_with[gen] = rng.compact()
        return gen

    module.DataLoaderShard.__iter__ = __iter__


def _by_sampler(shard) -> bool:
    from torch.utils.data import DataLoader

    base = getattr(shard, "base_dataloader", None)
    return shard.skip_batches == 0 and isinstance(base, DataLoader) and fastforward.samples_by_index(base)


class ShardLoop:
    """A loop over a ``DataLoaderShard`` (``fastforward.ADAPTERS``). The shard is live-only, and
    its epoch count (``iteration``, which its ``__iter__`` hands to ``set_epoch``) is what the
    original had when the loop started, whatever the replay skipped."""

    def describe(self, shard) -> dict:
        if not _by_sampler(shard):
            return {"kind": "iter"}
        inner = fastforward.DataLoaderAdapter().describe(shard.base_dataloader)
        return {"kind": "dataloader_shard", "iteration": shard.iteration, "inner": inner}

    def position(self, shard, skip, note, ctx, at):
        if not (note and note.get("kind") == "dataloader_shard" and _by_sampler(shard)):
            return fastforward.consume(shard, skip, ctx, at, pure=False)
        shard.iteration = note["iteration"]
        return fastforward.wrapper_at(iter(shard), shard.base_dataloader, skip, note["inner"], ctx, at), "by batch sampler"


class ShardIterator:
    """A ``DataLoaderShard``'s generator that the program advances itself (``graph.iterators.ADAPTERS``).

    The replay made its own in the same place, and may have advanced it from the wrong start
    already (the body of the loop whose iteration the snapshot was in took batches again, with
    the RNG states of that iteration). A generator cannot go back, so a new one takes its place,
    started at the saved count (as above) with the global RNG states the original had when it
    started: those recorded when ``iter()`` made it (gpusnap wraps ``DataLoaderShard.__iter__``
    to note them), the replay's own at this point, or one of those the snapshot recorded where
    loops and iterations started. The right one is the one whose base iterator draws the base
    seed the original drew; then its sampler must stand at the same indices. Otherwise restart
    refuses."""

    kind = "dataloader_shard_iter"

    def describe(self, gen, read) -> dict | None:
        if inspect.getgeneratorstate(gen) != inspect.GEN_SUSPENDED:
            return None  # created or finished: the generic check compares states
        local = gen.gi_frame.f_locals
        shard = local["self"]
        if not _by_sampler(shard):
            return {"kind": "iterator", "why": "a DataLoaderShard that skips batches or has no index sampler"}
        return {
            "kind": self.kind,
            "yielded": _yielded(gen),
            "iteration": shard.iteration,
            "ended": bool(shard.end_of_dataloader),
            "inner": loopnotes.describe(local["dataloader_iter"], read),
            "rng": rng.to_json(_made_with[gen], read) if gen in _made_with else None,
        }

    def check(self, live, info: dict, path: str, scene) -> str | None:
        if not (inspect.isgenerator(live) and live.__qualname__ == "DataLoaderShard.__iter__" and live.gi_frame is not None):
            return f"cannot find the running DataLoaderShard iterator that the run that took the snapshot held at {path}"
        shard = live.gi_frame.f_locals["self"]
        if shard.iteration != info["iteration"]:
            return (
                f"found the DataLoaderShard iterator at {path} made for epoch {shard.iteration}, "
                f"the run that took the snapshot's for epoch {info['iteration']}"
            )
        if not _by_sampler(shard):
            return f"cannot position the DataLoaderShard iterator at {path}: its loader skips batches or has no index sampler"
        taken, inner = info["yielded"], info["inner"] or {}
        for state in (info.get("rng"), _CURRENT, *scene.rng_states):
            if state is None:
                continue
            if state is not _CURRENT:
                rng.restore_json(state)
            gen = fastforward.wrapper_at(iter(shard), shard.base_dataloader, taken, {})
            if _base(gen)._base_seed == inner.get("base_seed"):
                break
        else:
            return f"cannot position the DataLoaderShard iterator at {path}: no RNG state in the snapshot makes it draw its seed"
        problem = scene.replace(live, gen)
        if problem:
            return problem
        scene.say(f"started the DataLoaderShard iterator at {path} again at batch {taken} by batch sampler")
        if bool(shard.end_of_dataloader) != info["ended"]:
            where = "at" if shard.end_of_dataloader else "before"
            return f"found the DataLoaderShard iterator at {path} {where} its end, unlike the run that took the snapshot"
        return livecheck.position_loader_iter(_base(gen), inner, f"{path} (its DataLoader's)", scene.say)


def _base(gen):
    return gen.gi_frame.f_locals["dataloader_iter"]


def _yielded(gen) -> int:
    """Batches a started shard generator has yielded: its base iterator is one ahead, except at
    the end (reading ``batch_index`` would not do: it counts from 0 after a positioning)."""
    return _base(gen)._num_yielded - (0 if gen.gi_frame.f_locals["self"].end_of_dataloader else 1)


after_import("accelerate.data_loader", _note_rng_at_iter)
# A suspended shard generator holds the batch it yielded and the next one, collated already (with
# whatever random numbers its collate function drew then): the snapshot keeps both.
pickler.FETCHED_AHEAD[f"{SHARD}.__iter__"] = ("current_batch", "next_batch")
pickler.REPLAYED_ATTRS["accelerate.accelerator.Accelerator"] = frozenset({"_dataloaders"})
fastforward.ADAPTERS[SHARD] = ShardLoop()
iterators.ADAPTERS[f"{SHARD}.__iter__"] = ShardIterator()
