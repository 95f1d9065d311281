"""Lightning (``lightning.pytorch`` and ``pytorch_lightning``; tested with lightning 2.6.6).

``Trainer.fit`` steps the optimizer in ``_TrainingEpochLoop.run``'s ``while not self.done``,
reached through ``trainer.trainer``, ``trainer.call`` and ``FitLoop.run``'s ``while`` over epochs:
those modules are in ``LOOP_MODULES`` (instrumented by default when the program imports them),
so that ``while`` is the step loop and its boundary the safe point. Everything
the trainer holds (its loops' progress counters, callbacks, LR scheduler configs, loggers, the
module and its optimizers) is ordinary state that the snapshot keeps and the merge writes into
the replayed trainer; a few classes whose ``__getstate__`` leaves out what a running trainer
needs are pickled whole (``_WHOLE_STATE``).

What it cannot keep is where the batches come from. The epoch loop calls ``next()`` by hand on a
data fetcher, over a ``CombinedLoader`` whose ``_ModeIterator`` holds one iterator per
DataLoader (and whose ``__getstate__`` writes None for those). So the ``_ModeIterator`` is
live-only, and ``ModeIteratorAdapter`` records its counters and each DataLoader iterator's
position (livecheck's ``dataloader_iter``: batches taken, base seed, index sampler fingerprint),
and at replay puts the running epoch's back there (see ``check``) or refuses.
"""

from __future__ import annotations

import os
import sys

from gpusnap.capture.pickling import pickler
from gpusnap.capture.trainee import children, loopnotes
from gpusnap.frameworks import LOOP_MODULES
from gpusnap.graph import iterators, workers
from gpusnap.graph.digest import fingerprint
from gpusnap.instrument import loops
from gpusnap.onimport import after_import
from gpusnap.restore import fastforward, livecheck

_PACKAGES = ("lightning.pytorch", "pytorch_lightning")
# The launcher's launch() calls fit's function under a distributed strategy (ddp): instrumented,
# so that the path from the script to the step loop is, under torchrun, where it starts no process
_LAUNCHER = "strategies.launchers.subprocess_script"
_LOOPS = ("trainer.trainer", "trainer.call", "loops.fit_loop", "loops.training_epoch_loop", _LAUNCHER)
_MODE_ITERATOR = "utilities.combined_loader._ModeIterator"
# Their __getstate__ drops what the running trainer needs: the module's trainer, the strategy's
# LightningOptimizers (live-only: their class is made at run time, so the replay's are kept),
# the signal connector's original handlers.
_WHOLE_STATE = ("core.module.LightningModule", "strategies.strategy.Strategy", "trainer.connectors.signal_connector._SignalConnector")
# Plain counters of _ModeIterator and its subclasses (_MaxSizeCycle, _MinSize, _MaxSize,
# _Sequential); "iterables" and "iterators" are the replayed program's own.
_COUNTERS = ("_idx", "_consumed", "_iterator_idx")


class ModeIteratorAdapter:
    """``CombinedLoader``'s iterator (``_ModeIterator``): its counters and its DataLoader iterators."""

    kind = "lightning_mode_iterator"

    def describe(self, it, read=None) -> dict:
        return {
            "kind": self.kind,
            "class": type(it).__qualname__,
            "counters": {name: getattr(it, name) for name in _COUNTERS if name in vars(it)},
            "limits": repr(it.limits),  # batches per loader: inf where a loader has no length
            "iterators": [loopnotes.describe(sub, read) for sub in it.iterators],
            # what each loader's DistributedSampler was set to (the fit loop's epoch count, which
            # reads 0 in the replay until the merge): its order is drawn from it at iter()
            "sampler_epochs": [[sampler.epoch for sampler in _epoch_samplers(loader)] for loader in it.iterables],
        }

    def check(self, live, info: dict, path: str, scene) -> str | None:
        say = scene.say
        if live is None:
            return f"cannot find the combined loader's iterator that the run that took the snapshot held at {path}"
        if type(live).__qualname__ != info["class"]:
            return f"found a {type(live).__qualname__} at {path}, the run that took the snapshot had a {info['class']}"
        saved = info["iterators"]
        if not _advanced_by_step_loop(live):
            # An evaluation loop's (validation during fit): every evaluation run makes its
            # iterators anew (EvaluationLoop.setup_data), and none is on a snapshot's path.
            return None
        if len(live.iterators) != len(saved) or info["limits"] != repr(live.limits):
            return f"found the combined loader at {path} over other data loaders than in the run that took the snapshot"
        if any(not sub or sub.get("kind") != "dataloader_iter" for sub in saved):
            return f"cannot position the combined loader at {path}: it iterates something other than DataLoaders"
        for loader, epochs in zip(live.iterables, info.get("sampler_epochs") or []):
            for sampler, epoch in zip(_epoch_samplers(loader), epochs):
                sampler.set_epoch(epoch)
        import torch  # the program has: it runs Lightning

        before = torch.get_rng_state()
        drawing = _drawing_persistent(live)
        if drawing:
            # Its workers draw random numbers and keep their generators from epoch to epoch: the
            # replay's, fresh, stand where the original's stood before its first epoch. Leave
            # them the states the original's started this epoch with, reset (each takes its
            # states at its next fetch), and take this epoch's batches again.
            missing = [i for i in drawing if not saved[i].get("worker_rng")]
            if missing:
                return (f"cannot put back the persistent DataLoader workers of {path}.iterators[{missing[0]}]: "
                        "the snapshot does not hold where their random number generators stood")
            for i in drawing:
                if not workers.put_back(live.iterables[i], saved[i]["worker_rng"]):
                    return (f"cannot put back the persistent DataLoader workers of {path}.iterators[{i}]: "
                            f"the replay's workers did not start fetching within {workers.START_TIMEOUT_S:.0f} s")
            iter(live)
            say(f"reset the persistent-workers DataLoader iterators of {path} with their workers' random number "
                "generators where the epoch that took the snapshot started them")
            problem = _position_each(live, saved, path, say)
        elif any(_seed_differs(it, sub) for it, sub in zip(live.iterators, saved)):
            # Past its first epoch the original made this epoch's iterators in
            # _TrainingEpochLoop.on_run_start, just before the step loop; the replay, whose epoch
            # counter reads 0 until the merge, kept the first epoch's. Its epoch started from the
            # RNG states the original's had and ran the same code up to here, so iterators made
            # now draw the same base seeds (checked below, with where their samplers stand).
            problem = _make_again(live, saved, path, say)
        else:
            problem = _position_each(live, saved, path, say)
        if problem and not drawing and any(getattr(loader, "persistent_workers", False) for loader in live.iterables):
            # A persistent-workers iterator keeps its base seed across epochs, and reset at this
            # epoch's start, it drew its order then. Its replay, never reset, drew it at setup:
            # reset it now, from the RNG state it had before this attempt, and check again.
            torch.set_rng_state(before)
            iter(live)
            say(f"reset the persistent-workers DataLoader iterators of {path}, as the epoch that took the snapshot did")
            problem = _position_each(live, saved, path, say)
        if problem:
            return problem
        _set_counters(live, info)
        return None


def _epoch_samplers(loader) -> list:
    """The samplers of ``loader`` that draw their order from an epoch set on them (a
    DistributedSampler, which Lightning puts in a distributed run's loaders)."""
    found = []
    for sampler in (getattr(loader, "sampler", None), getattr(getattr(loader, "batch_sampler", None), "sampler", None)):
        if hasattr(sampler, "set_epoch") and type(getattr(sampler, "epoch", None)) is int and all(sampler is not s for s in found):
            found.append(sampler)
    return found


def _drawing_persistent(live) -> list[int]:
    """Which of ``live``'s DataLoaders keep worker processes whose fetches draw random numbers."""
    if not workers.seen():
        return []
    return [i for i, loader in enumerate(live.iterables)
            if getattr(loader, "persistent_workers", False) and getattr(loader, "num_workers", 0) > 0]


def _advanced_by_step_loop(live) -> bool:
    """Is ``live`` the iterator of the data fetcher that the running epoch loop (the innermost
    loop: replay checks at its start) takes its batches from?"""
    running = loops.ACTIVE[-1].frame.f_locals.get("data_fetcher") if loops.ACTIVE else None
    if running is None:
        return True  # not Lightning's epoch loop: position it
    return getattr(getattr(running, "iterator", None), "_iterator", None) is live


def _set_counters(live, info: dict) -> None:
    for name, value in info["counters"].items():
        setattr(live, name, value)


def _position_each(live, saved: list, path: str, say) -> str | None:
    for i, (it, sub) in enumerate(zip(live.iterators, saved)):
        problem = livecheck.position_loader_iter(it, sub, f"{path}.iterators[{i}]", say)
        if problem:
            return problem
    return None


def _make_again(live, saved: list, path: str, say) -> str | None:
    if not all(map(fastforward.skips_by_sampler, live.iterables)):  # iterable-style: take batches
        iter(live)
        say(f"made the DataLoader iterators of {path} again, as the epoch that took the snapshot did")
        return _position_each(live, saved, path, say)
    # As the original: every iter() (base seeds), then each sampler's first draw, in order.
    made = [fastforward.loader_iterator_at(loader, sub["yielded"]) for loader, sub in zip(live.iterables, saved)]
    samplers = [fastforward.start(it) for it in made]
    live.iterators = made
    for i, (it, sampler, sub) in enumerate(zip(made, samplers, saved)):
        where = f"{path}.iterators[{i}]"
        if _seed_differs(it, sub):
            return f"found the DataLoader iterator at {where} made from other random numbers than in the run that took the snapshot"
        if sub.get("sampler") and fingerprint(sampler, strict=False) != sub["sampler"]:
            return f"found the DataLoader iterator at {where} with its sampler elsewhere than in the run that took the snapshot"
    say(f"made the DataLoader iterators of {path} again at their saved batches (by batch sampler), as the epoch that took the snapshot made them")
    return None


def _seed_differs(it, info: dict) -> bool:
    return info.get("base_seed") is not None and getattr(it, "_base_seed", None) != info["base_seed"]


def _note_launched_ranks(module) -> None:
    """Without torchrun, Lightning's launcher starts a job's other ranks itself, as ``subprocess``es
    running the script: gpusnap runs none of them, so a snapshot of this rank alone is refused
    while they run (``children``), and the launch says so once."""
    launcher = module._SubprocessScriptLauncher
    call_children = launcher._call_children_scripts

    def _call_children_scripts(self):
        call_children(self)
        site = os.path.relpath(sys.argv[0]) if sys.argv and sys.argv[0] else "?"  # (what the launcher runs again)
        line = (f"gpusnap: Lightning started this job's other ranks as processes of its own ({len(self.procs)}, by its "
                f"subprocess launcher for devices={self.num_processes}): while they run, no snapshot can be taken, since a "
                "snapshot of this process cannot hold their work; launch the job with `gpusnap run --nproc-per-node "
                f"{self.num_processes}` instead, and Lightning takes torchrun's ranks, each snapshotted")
        children.note_launched(list(self.procs), site, "Lightning's subprocess launcher", line)

    launcher._call_children_scripts = _call_children_scripts


def _register() -> None:
    """The loop modules, and what the pickler and the iterator checks must know of Lightning's
    objects: names only, so a program that does not use Lightning pays nothing for it."""
    adapter = ModeIteratorAdapter()
    for package in _PACKAGES:
        # Trainer.fit -> call._call_and_handle_interrupt (-> the launcher's launch, under a
        # distributed strategy) -> Trainer._run_stage -> FitLoop.run (epochs) ->
        # _TrainingEpochLoop.run, whose `while not self.done` steps the optimizer.
        LOOP_MODULES[package] = tuple(f"{package}.{m}" for m in _LOOPS)
        name = f"{package}.{_MODE_ITERATOR}"
        pickler.LIVE_NAMES.add(name)
        iterators.ADAPTERS[name] = adapter
        pickler.WHOLE_STATE.update(f"{package}.{cls}" for cls in _WHOLE_STATE)
    for package in (*_PACKAGES, "lightning.fabric", "lightning_fabric"):  # (Fabric's launcher is the same)
        after_import(f"{package}.{_LAUNCHER}", _note_launched_ranks)


_register()
