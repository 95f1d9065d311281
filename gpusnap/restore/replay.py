"""Restart: replay the program, fast-forward the saved loop path, merge at the resume point.

``install`` runs before the program's first line (from the agent). Setup code then runs for
real. Each loop that starts is compared with the next loop of the saved path (same file,
function and LINE:COL); a match is fast-forwarded: an enclosing loop to its current iteration
(whose body prefix then runs once, from the RNG states that iteration started with), the
innermost loop to the saved boundary, where the snapshot is merged into the live objects and
training continues. Until then no snapshot is taken. Fast-forward is exact or refuses: the items
it consumed are compared with the snapshot's digests (``itemcheck``), and iterators the program
holds and advances by hand are put at their saved position or refused (``livecheck``).

Refusals (``RestoreError``) are printed as one line with a hint and end the trainee with the
error's exit code: a program that reaches an optimizer step or its end before the saved
position, frames that differ from the snapshot's, a changed source file, a state mismatch.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import importlib
import inspect
import os
import sys
import time
import types

from gpusnap import files, knobs, moved
from gpusnap.console import Console
from gpusnap.errors import FastForwardError, GpusnapError, ProgramChanged, ReplayDiverged, RestoreError, StateMismatch
from gpusnap.graph import exits, iterators, rng, roots, settings, witness, workers
from gpusnap.graph.load import DEVICE_BASES, LiveFunction, LiveObject, LiveOnly, NotCaptured
from gpusnap.instrument import loops
from gpusnap.restore import devices, fastforward, itemcheck, livecheck, load
from gpusnap.restore.frames import write_locals
from gpusnap.restore.merge import Merger
from gpusnap.store import reader
from gpusnap.store.fetch import Prefetch

active = None  # the Replay in progress, until its merge is done


class Replay:
    def __init__(self, rundir, snap_id: str, config: dict, emit, on_merged):
        self.rundir = rundir
        self.manifest = rundir.manifest(snap_id)
        self.snap_id = self.manifest["id"]
        self.force = bool(config.get("force"))
        self.verify_only = bool(config.get("verify_replay"))  # `gpusnap verify --replay`: stop once compared
        self.config = config
        self.emit = emit
        self.on_merged = on_merged  # the agent counts steps and iterations on from the snapshot's
        frames = self.manifest["roots"]["frames"]
        self.expected = [dict(loop, **frames[loop["frame"]]) for loop in self.manifest["loops"]]
        self.cursor = 0
        # Loops that stepped an optimizer and ran their course before the snapshot (a teacher's
        # training, a learning-rate range test): passed over in this order, zero iterations each.
        self.finished = list(self.manifest.get("finished") or ())
        self.passed_over = 0
        self.merged = False
        self.merged_at = None  # (loop, its index) at the merge
        self.started_s = time.perf_counter()
        self.fastforward_s = 0.0
        self.fastforwards: list[dict] = []
        self._positioned: set[int] = set()  # ids of what fast-forward positioned (livecheck)
        self._sources: dict[int, object] = {}  # loop index -> the iterator fast-forward made for it
        self._remakes: list[tuple[dict, fastforward.Remake]] = []  # DataLoader iterators settled after the merge
        self._loop_loaders: dict[int, list] = {}  # loop index -> the DataLoaders its source iterates here
        self._run_loaders: dict[int, object] = {}  # id(one of those) -> what stands for the run's after the merge
        self._boundary_hook = None
        self.write_device = None  # install's: how the merge fills device memory (cuda.core Buffers)

    # -- replay ----------------------------------------------------------------------------
    def on_loop_start(self, loop, iterable):
        if self.passed_over < len(self.finished) and _is(loop, self.finished[self.passed_over]):
            done = self.finished[self.passed_over]
            self.passed_over += 1
            _say(f"passed over {_short(loop.where())}: it ran its course ({done['ran']} iterations) before the snapshot", level=1)
            # Finished here too, as it ran in the run: a snapshot this process takes names it.
            loop.index, loop.stepped = done["ran"], True
            return loops.SKIP
        if self.cursor >= len(self.expected):
            return None
        want = self.expected[self.cursor]
        if not _is(loop, want):
            return None
        self.cursor += 1
        innermost = self.cursor == len(self.expected)
        skip = want["index"] if innermost else max(want["index"] - 1, 0)
        loop.resume = want.get("resume")
        started = time.perf_counter()
        # Whatever goes wrong while positioning (user code in __iter__, a sampler, a source that
        # ends early, an item that differs) is a refusal naming the loop, never an exception
        # inside the program's loop.
        try:
            it, how = self._fast_forward(loop, iterable, skip, want, innermost)
        except GpusnapError as exc:
            fail(FastForwardError(f"fast-forward of loop {self.name(want)}: {exc.message}", exc.hint if exc.hint != exc.default_hint else None))
        except Exception as exc:
            self._raised(want, exc)
        spent = time.perf_counter() - started
        self.fastforward_s += spent
        self.fastforwards.append({"loop": loop.where(), "to": skip, "how": how, "s": spent})
        _say(f"fast-forward {_short(loop.where())} to iteration {skip} {how} ({spent:.3f} s)", level=1)
        return it

    def _fast_forward(self, loop, iterable, skip: int, want: dict, innermost: bool):
        rng_at = want.get("rng_at") if not innermost else None
        if loop.kind == "while":
            loop.index = skip
            if innermost:
                self._check_live_iterators(loop)
                self._boundary_hook = loops.on_boundary
                loops.on_boundary = self._while_boundary
                loops.pending = True
            else:  # nothing runs between here and the iteration's start
                if rng_at is not None:
                    self._restore_rng_at(loop, rng_at)
                _restore_locals_at(loop, want)
            return None, "by skipping bodies"
        ctx = fastforward.Context()
        it, how = fastforward.iterator_at(iterable, skip, loop.resume, ctx)
        self._positioned.update(id(obj) for obj in ctx.touched + [it])
        self._sources[self.cursor - 1] = it
        self._loop_loaders[self.cursor - 1] = iterators.loaders_in(iterable)
        self._remakes += [(want, remake) for remake in ctx.remakes]
        short = next((remake.short for remake in ctx.remakes if remake.short), None)
        if short and not innermost:  # its body would run on an ended iterator before any merge
            raise FastForwardError(short)
        loop.index = skip
        if innermost:
            self._judge(want, itemcheck.verify(ctx.consumed, want.get("check")))
            self._check_live_iterators(loop)
            return self._merge_first(it, loop), how
        if ctx.consumed or rng_at is not None or want.get("locals_at"):
            it = self._enclosing_first(it, loop, want, ctx, rng_at)
        return it, how

    def _enclosing_first(self, it, loop, want: dict, ctx, rng_at):
        """An enclosing loop's first item (the one its saved iteration was running) is checked
        against the snapshot's digest, then its iteration starts with the RNG states it had."""
        try:
            item = next(it)
        except StopIteration:
            return
        except Exception as exc:
            self._raised(want, exc)
        self._judge(want, itemcheck.verify(ctx.consumed, want.get("check"), item))
        if rng_at is not None:
            self._restore_rng_at(loop, rng_at)
        _restore_locals_at(loop, want)
        yield item
        yield from it

    def _restore_rng_at(self, loop, rng_at: dict) -> None:
        rng.restore_json(rng_at)
        loop.rng_at = rng_at  # a snapshot taken in this iteration keeps it

    def _check_live_iterators(self, loop) -> None:
        """Iterators in the program's state that no loop positioned (``it = iter(loader)``, then
        ``next(it)`` in the loop): advanced to their saved position, or refused (livecheck)."""
        live_only = self.manifest.get("live_only") or []
        if not any(entry.get("iterator") for entry in live_only):
            return
        frames = roots.frames_on_path(loop.frame)
        # Where the original may have started such an iterator: the RNG states at the starts of
        # the loops and of their current iterations, innermost first.
        rng_states = [
            state for want in reversed(self.expected) for state in (want.get("rng_at"), (want.get("resume") or {}).get("rng")) if state
        ]
        problems = livecheck.check(live_only, frames, roots.instrumented_modules(), self._positioned, _say, rng_states)
        self._judge(self.expected[-1], problems, livecheck.HINT)

    def _judge(self, want: dict, problems: list[str], hint: str | None = None) -> None:
        """Refuse on the first problem; with --force, warn about each and go on."""
        if not problems:
            return
        where = self.name(want)
        if not self.force:
            fail(FastForwardError(f"fast-forward of loop {where} {problems[0]}", hint))
        for problem in problems:
            _say(f"warning: fast-forward of loop {where} {problem}; restoring anyway (--force)")

    def _raised(self, want: dict, exc: Exception) -> None:
        detail = (str(exc).strip().splitlines() or [""])[0]
        fail(FastForwardError(
            f"fast-forward of loop {self.name(want)} failed: {type(exc).__name__}: {detail}",
            "the program raised while the loop's source was re-created and positioned; restart from "
            "another snapshot with --snapshot ID, or start fresh with --resume never",
        ))

    def name(self, want: dict) -> str:
        return f"{_short(want['file'])}:{want['loop_id'].split(':')[0]} (in {want['function']})"

    def _merge_first(self, it, loop):
        self.merge(loop)
        yield from it

    def _while_boundary(self, loop) -> None:
        loops.on_boundary = self._boundary_hook
        loops.pending = False
        self.merge(loop)

    # -- merge -----------------------------------------------------------------------------
    def merge(self, loop) -> None:
        global active
        self._stage = f"loading snapshot {self.snap_id}"
        collecting = gc.isenabled()
        gc.disable()  # loading and merging allocate one object per snapshot object: no rescans
        try:
            self._merge(loop)
        except GpusnapError as exc:
            fail(exc)
        except Exception as exc:  # noqa: BLE001 - never into the user's loop, never half-merged
            fail(RestoreError(f"{self._doing()} failed: {_one_line(exc)}", _BUG_HINT))
        finally:
            if collecting:
                gc.enable()
        self.merged = True
        self.merged_at = (loop, loop.index)
        active = None
        loops.on_loop_start = loops.replaying = None

    def _merge(self, loop) -> None:
        replay_s = time.perf_counter() - self.started_s - self.fastforward_s
        started = time.perf_counter()
        read_before = dict(reader.TIMES)
        _say(f"merging snapshot {self.snap_id} at {_short(loop.where())}", level=1)
        self._stage = "agreeing with the other ranks"
        self.before_merge()
        self._stage = f"loading snapshot {self.snap_id}"
        same_sources = check_sources(self.manifest, self.force)
        records = self.manifest.get("allocations") or []
        device_tensors: list = []
        loading = time.perf_counter()
        buffers = self.manifest["buffers"]
        # Every buffer is read from here on, in parallel, while raw memory is written and the
        # graph unpickled: the raw allocations' first, then the graph's.
        with _reading_status(self.snap_id, (self.manifest.get("stats") or {}).get("bytes_total")), \
                Prefetch(self.rundir, buffers, [r.get("buffer") for r in records] + ["graph"], snapshot=self.snap_id) as fetched:
            if records:
                self._stage = "restoring raw device memory"
                DEVICE_BASES.update(self.restore_device(records, fetched.get))
            self._stage = f"loading snapshot {self.snap_id}"
            _, payload = load(self.rundir, self.snap_id, device_tensors, fetched)
        load_s = time.perf_counter() - loading
        live_frames = roots.frames_on_path(loop.frame)
        saved_frames = payload["frames"]
        for f in saved_frames:
            f["file"] = moved.here(f["file"])
        _check_frames(live_frames, saved_frames)
        merger = Merger(self.write_device, same_sources=same_sources, frames=live_frames)
        self._stage = "merging"
        self._merger = merger
        _import_what_the_run_imported_later(payload["globals"])
        live_modules = roots.instrumented_modules()
        # Every root first, then finish(): a place may wait for a live counterpart met later.
        merged_globals = []
        for module, values in payload["globals"].items():
            live = live_modules.get(module)
            if live is None:
                raise ReplayDiverged(f"module {module} held state in the snapshot but is not imported at the resume point")
            merged_globals.append((live, _merge_all(merger, live, values, f"globals[{module}]")))
        merged_statics = [(owner, _merge_all(merger, _attributes(owner), values, f"statics[{module}].{name}"))
                          for module, name, owner, values in _statics_of(payload, live_modules)]
        merged_locals = []
        for i, (frame, saved) in enumerate(zip(live_frames, saved_frames)):
            if saved["locals"]:
                merged_locals.append((frame, _merge_all(merger, dict(frame.f_locals), saved["locals"], f"frame[{i}].locals")))
        merged_hooks = _merge_all(merger, roots.torch_hooks(), payload.get("torch_hooks") or {}, "torch_hooks")
        saved_loggers = payload.get("loggers") or {}
        merged_loggers = _merge_all(merger, roots.live_loggers(saved_loggers), saved_loggers, "loggers")
        merged_exits = merger.value(None, payload.get("exits") or [], "exits")  # (a new list: adopted)
        for i, saved in (payload.get("ahead") or {}).items():
            # What a loop's source had fetched ahead (accelerate's shard collates one batch
            # ahead): into the source fast-forward made, which stands at the same batch.
            merger.value(self._sources.get(i), saved, f"loops[{i}].source")
        loaders = []  # (the replay's DataLoader, the run's): what a loop's source iterates
        for i, saved in (payload.get("loaders") or {}).items():
            mine = self._loop_loaders.get(i) or []
            if len(mine) == len(saved):
                for k, (live, snap) in enumerate(zip(mine, saved)):
                    merger.value(live, snap, f"loops[{i}].loaders[{k}]")  # where met first here: the replay's own
                    loaders.append((live, snap))
        merger.finish()
        if merger.made_again:
            _say(f"made again from their code the functions the run made in steps the replay skipped: "
                 f"{', '.join(merger.made_again)}", level=1)
        self._run_loaders = {id(live): merger.counterpart(snap, live) for live, snap in loaders}
        for live, values in merged_globals:
            live.update({name: merger.settled(value) for name, value in values.items()})
        for owner, values in merged_statics:
            for name, value in values.items():
                setattr(owner, name, merger.settled(value))
        for frame, values in merged_locals:
            write_locals(frame, {name: merger.settled(value) for name, value in values.items()})
        for name, value in merged_hooks.items():  # (a dict is merged in place; the flag is set)
            roots.set_torch_hook(name, merger.settled(value))
        for name, config in merged_loggers.items():
            roots.set_logger(name, merger.settled(config))
        lost = exits.register_missing(merger.settled(merged_exits))
        if lost:
            raise StateMismatch(f"the run registered the {lost[0].type_name} with atexit in a step the replay skips, and the "
                                "snapshot could not hold it: the restarted run would end without calling it",
                                "register a module-level function or a method of an object the program keeps")
        self._stage = "drawing again the order of DataLoaders whose samplers the replay made otherwise"
        self._redraw_orders()
        if device_tensors:
            self._stage = "placing device tensors"
            for saved, where in devices.place(merger.aligned, device_tensors).items():
                if where != saved:
                    _say(f"tensors saved on {saved} that the replay does not hold are placed on {where}", level=1)
        once_files_are_back = []
        for name, after in AFTER_MERGE.items():
            self._stage = name
            then = after(merger.aligned.values())
            if then is not None:
                once_files_are_back.append((name, then))
        self._stage = "restoring the random number generators"
        rng.restore(payload["rng"])
        self._stage = "restoring the program's process-wide settings"
        saved_settings = payload.get("settings") or {}
        settings.check_streams(saved_settings)
        if knobs.MOVED_FROM and saved_settings.get("cwd"):  # a working directory inside the program's tree
            saved_settings = {**saved_settings, "cwd": moved.rebase(saved_settings["cwd"], knobs.MOVED_FROM, settings.start_cwd() or os.getcwd())}
        put = settings.restore(saved_settings)
        if put:
            _say(f"settings the run's steps had changed, as it had them: {', '.join(put)}", level=1)
        # After the adapters (a logger's writer they close lets go of its file): what the
        # replayed setup wrote goes back to the snapshot's state.
        self._stage = "putting back the files the replayed setup wrote"
        files_report = files.settle(self.rundir, self.manifest, self.config, _say)
        for name, then in once_files_are_back:
            self._stage = name
            then()
        self.on_merged(self.snap_id, self.manifest.get("steps") or 0, self.manifest.get("iteration"))
        merge_s = time.perf_counter() - started
        verified = self._watch_witness()
        _say(
            f"restored snapshot {self.snap_id}: {merger.nbytes / 1e6:.1f} MB into {merger.tensors} tensors; "
            f"replay {replay_s:.2f} s, fast-forward {self.fastforward_s:.2f} s, merge {merge_s:.2f} s; {_VERIFIED[verified]}",
            level=1,
        )
        self.emit(
            "restored",
            id=self.snap_id,
            verified=verified,
            iteration=self.manifest.get("iteration"),
            replay_s=replay_s,
            fastforward_s=self.fastforward_s,
            merge_s=merge_s,
            load_s=load_s,  # of merge_s: reading, decoding and unpickling the graph and its buffers
            **{k: v - read_before[k] for k, v in reader.TIMES.items()},  # of load_s and raw memory: the store's parts
            merge_bytes=merger.nbytes,
            fastforwards=self.fastforwards,
            **({"files": files_report} if files_report else {}),
        )

    def _redraw_orders(self) -> None:
        """A loop whose replay iterates another DataLoader than the run's (chosen by state the
        skipped iterations changed) has its iterator made again from the run's; a sampler the
        replay made from other state than the run (inside an epoch, from what skipped epochs
        computed), or whose sampler counted its epochs in iterations the replay skipped, holds the
        run's state now: the order of the iterator that fast-forward made from it is drawn again,
        from the sampler as it stood when the run's loop started (``fastforward.Remake``). Where
        that cannot be proven, the iterator stays, and the witness compares what it yields."""
        for want, remake in self._remakes:
            theirs = self._run_loaders.get(id(remake.loader), remake.loader)
            if theirs is not remake.loader:
                why = remake.rebase(theirs)
                if why is None:
                    _say(f"made the iterator of loop {self.name(want)} again from the run's DataLoader (the replay's "
                         "loop took another one, chosen by state the iterations it skipped changed)", level=1)
                    continue
                if not remake.short:
                    _say(f"kept the DataLoader of loop {self.name(want)}, though the run's loop iterated another: "
                         f"{why}; the witness compares what it yields", level=1)
                    continue
            if remake.short:  # the replay's loader has fewer batches than the run had taken
                fail(FastForwardError(f"fast-forward of loop {self.name(want)}: {remake.short}"))
            if remake.want is None:
                continue
            why = remake.redraw()
            if why is None:
                _say(f"drew the order of the DataLoader of loop {self.name(want)} again from its merged sampler, "
                     "as it stood when the run's loop started (the replay's had drawn it from other state)")
            else:
                _say(f"kept the order of the DataLoader of loop {self.name(want)}, which the replay drew from "
                     f"another sampler than the run's: {why}; the witness compares what it yields", level=1)

    # -- the witness ------------------------------------------------------------------------
    def _watch_witness(self) -> str:
        """Compare the iterations after the merge with those that followed the snapshot in the
        run that took it (``graph.witness``): "checking", or "unverified" without a witness."""
        doc = self.rundir.load_witness(self.snap_id)
        if doc is not None and doc.get("token") != self.manifest.get("witness_token"):
            # The witness of an earlier snapshot of this id (one that failed, or was torn and
            # moved aside): this one's own was never written. It proves nothing of this one.
            doc = None
        if not doc or not doc.get("iterations"):
            if self.verify_only:
                _say(f"restored snapshot {self.snap_id}, unverified: it has no witness to compare the iterations "
                     "after it with (the run that took it stopped before the next iteration ended)")
                _stop(0)
            return "unverified"
        witness.active = witness.Checker(doc, self._diverged, self._warn_diverged, self._verified, self.force)
        loops.pending = True  # every boundary, until the window is compared
        return "checking"

    def _diverged(self, message: str) -> None:
        self.emit("diverged", id=self.snap_id, message=message)
        fail(RestoreError(
            f"snapshot {self.snap_id} restarted to other state than the run that took it: {message}",
            "the snapshot is intact; restart from another one with --snapshot ID, or pass --force to go on "
            "anyway (the run may then end with other bytes than an uninterrupted one); please report this",
        ))

    def _warn_diverged(self, message: str) -> None:
        self.emit("diverged", id=self.snap_id, message=message, forced=True)
        _say(f"warning: snapshot {self.snap_id}: {message}; going on (--force)")

    def _verified(self, count: int, differences: int, uncompared=()) -> None:
        if differences:
            _say(f"snapshot {self.snap_id} is not verified: its restart differed from the run that took it (--force)", level=1)
            return
        self.emit("verified", id=self.snap_id, iterations=count, **({"uncompared": list(uncompared)} if uncompared else {}))
        # What could not be compared is said: a restart on another machine (other CPU kernels,
        # threads or torch) matched batches and random generators, not the parameters' bytes.
        short = f" (not compared: {'; '.join(uncompared)})" if uncompared else ""
        _say(f"snapshot {self.snap_id} verified: the {count} iteration{'s' if count != 1 else ''} after it "
             f"match{'es' if count == 1 else ''} the run that took it{short}", level=0 if self.verify_only else 1)
        if self.verify_only:
            _stop(0)

    def _doing(self) -> str:
        """What the merge was doing, for a refusal: the object path while merging."""
        if self._stage == "merging":
            return f"merging the snapshot into the program at {self._merger.path}"
        return self._stage

    # -- divergence ------------------------------------------------------------------------
    def not_reached(self) -> str:
        want = self.expected[min(self.cursor, len(self.expected) - 1)]
        line = want["loop_id"].split(":")[0]
        return f"{_short(want['file'])}:{line} (in {want['function']})"


def _import_what_the_run_imported_later(modules) -> None:
    """A module of the program's that the run first imported in a step the replay skips (`import
    report_utils` inside the loop) is imported now, so that its globals take the snapshot's
    values; the program's own `import` then finds it, as it found the run's."""
    imported = roots.instrumented_modules()
    for module in modules:
        if module in imported:
            continue
        try:
            importlib.import_module(module)
        except Exception as exc:
            raise ReplayDiverged(f"module {module} held state in the snapshot but is not imported at the resume point, "
                                 f"and importing it failed: {type(exc).__name__}: {exc}") from exc
        _say(f"imported {module}, which the run imported in a step the replay skips", level=1)


def _statics_of(payload: dict, live_modules: dict):
    """(module, name, the replay's class or function, the snapshot's attributes) for the state
    the snapshot holds on the classes and functions of the program's modules (``roots``)."""
    for module, owners in (payload.get("statics") or {}).items():
        namespace = live_modules.get(module) or {}
        for name, values in owners.items():
            owner = roots.owner_at(namespace, name)
            if owner is None:
                raise ReplayDiverged(f"{module}.{name} held state in the snapshot but the replay does not define it")
            yield module, name, owner, values


def _attributes(owner) -> dict:
    """A class's or function's attributes, a function's default arguments among them."""
    found = dict(vars(owner))
    if isinstance(owner, types.FunctionType):
        found.update(__defaults__=owner.__defaults__, __kwdefaults__=owner.__kwdefaults__)
    return found


def _merge_all(merger: Merger, live: dict, saved: dict, path: str) -> dict:
    """Merged values of one root's names; a live-only name the replay has not bound stays unbound,
    unless it names a local function, which the merge makes again (restore.functions), or an
    object of a class the program defined in a function, made again of the replay's class
    (`head = Head(...)` in a step). The classes merge first: the merge makes such objects of
    the replay's class where it knows it, and a name's place precedes a class's among the
    locals that closures share (Net.__init__ refers to Head)."""
    classes_first = sorted(saved, key=lambda name: not _names_a_class(saved[name]))
    merged = {
        name: merger.value(live.get(name), saved[name], f"{path}.{name}")
        for name in classes_first
        if name in live or not isinstance(saved[name], LiveOnly) or isinstance(saved[name], LiveFunction)
        or (isinstance(saved[name], LiveObject) and saved[name].made)
    }
    return {name: merged[name] for name in saved if name in merged}


def _names_a_class(value) -> bool:
    return isinstance(value, LiveOnly) and (value.type_name or "").startswith("class ")


def _check_frames(live_frames, saved_frames) -> None:
    """The replay must stand in the same calls, at the same lines, as the program that took the
    snapshot: anything else would merge one place's state into another."""
    live = [(f.f_code.co_filename, f.f_code.co_qualname, f.f_lineno) for f in live_frames]
    saved = [(f["file"], f["function"], f["line"]) for f in saved_frames]
    for (lf, lq, ll), (sf, sq, sl) in zip(live, saved):
        if (lf, lq, ll) != (sf, sq, sl):
            raise ReplayDiverged(
                f"replay reached the loop through {lq} ({_short(lf)}:{ll}), the snapshot through {sq} ({_short(sf)}:{sl})"
            )
    if len(live) != len(saved):
        raise ReplayDiverged(f"replay reached the loop {len(live)} calls deep, the snapshot {len(saved)}")


def check_sources(manifest: dict, force: bool) -> bool:
    """Refuses a program whose source changed since the snapshot unless ``force``; says whether
    it runs the snapshot's sources."""
    from gpusnap.instrument.importer import SOURCES

    same = True
    for path, digest in (manifest.get("sources") or {}).items():
        now = SOURCES.get(path)
        if now is not None and now != digest:
            if not force:
                raise ProgramChanged(f"{path} changed since snapshot {manifest['id']} was taken")
            same = False
    return same


def install(rundir, snap_id: str, config: dict, emit, on_merged, restore_device=None, before_merge=None,
            write_device=None, flush_events=None) -> Replay:
    """Replay snapshot ``snap_id`` of ``rundir``; ``emit(event, **fields)`` reports to the
    supervisor, ``before_merge()`` may refuse (a ``GpusnapError``) at the saved boundary,
    ``on_merged(snap_id, steps, iteration)`` runs once the snapshot is merged.
    ``restore_device(records, read_buffer)`` restores raw allocations and ``write_device(address,
    data, host)`` fills device memory (cuda.core Buffers): the device side, which restore does
    not import. ``flush_events()`` waits for the events emitted so far to reach the supervisor
    (they are queued: a refusal's ``diverged`` was lost to the exit that followed it)."""
    global active, _verbosity, _flush_events
    _verbosity = int(config.get("verbosity", 1))
    _flush_events = flush_events or (lambda: None)
    replay = Replay(rundir, snap_id, config, emit, on_merged)
    replay.restore_device = restore_device or _no_device
    replay.write_device = write_device
    replay.before_merge = before_merge or (lambda: None)
    if replay.manifest.get("workers_draw"):
        workers.mark()  # fast-forward takes worker loaders' batches; later snapshots keep saying so
    it = replay.manifest.get("iteration")
    _say(f"restoring snapshot {replay.snap_id} (iteration {it}): replaying setup", level=1)
    try:
        check_sources(replay.manifest, replay.force)
    except GpusnapError as exc:
        fail(exc)
    if config.get("dist") and replay.manifest.get("files"):
        refused = files.refused_elsewhere(replay.manifest["files"], config, os.environ.get("RANK", "?"), replay.snap_id)
        if refused is not None:
            fail(refused)
    files.protect(rundir, replay.manifest, config)
    active = replay
    loops.on_loop_start = replay.on_loop_start
    loops.replaying = diverged_by_step
    atexit.register(_check_reached, replay)
    return replay


def _no_device(records: list, read_buffer) -> dict:
    raise ReplayDiverged(f"the snapshot holds {len(records)} raw device allocations, and this run restores none",
                         hint="restart with gpusnap, which tracks cuda-python allocations")


def _restore_locals_at(loop, want: dict) -> None:
    """The scalar locals an enclosing loop's saved iteration started with, before its body
    prefix runs again: the replay skipped the bodies that counted them (``epoch += 1`` at the
    end of a ``while True``), so the prefix would read setup's values. The loop's own target
    is assigned from its item after this."""
    values = want.get("locals_at")
    if not values:
        return
    values = loops.scalars_from_json(values)
    frame = loop.frame
    if frame.f_code.co_name == "<module>":
        frame.f_globals.update(values)
    else:
        write_locals(frame, values)


def _is(loop, entry: dict) -> bool:
    """Is the running ``loop`` the statement a snapshot's loop ``entry`` names?"""
    code = loop.frame.f_code
    return loop.loop_id == entry["loop_id"] and code.co_qualname == entry["function"] and code.co_filename == entry["file"]


def diverged_by_step() -> None:
    """An optimizer step ran before the merge: the replay is redoing training."""
    if active is None:
        return
    trainer = _training_generator(sys._getframe(1))
    if trainer is not None:
        # `for step, loss in enumerate(train_steps()):` with the step inside the generator: the
        # loop's fast-forward consumes items, each one a step. Every snapshot of such a program
        # meets this; another snapshot would not help.
        code = trainer.f_code
        fail(ReplayDiverged(
            f"the program took an optimizer step in the generator {code.co_qualname} ({_short(code.co_filename)}:"
            f"{trainer.f_lineno}) before reaching the saved position at {active.not_reached()}: a loop whose items "
            "come from a generator that trains cannot be brought to its place without training again",
            hint="no snapshot of this program restarts while it trains inside a generator; start fresh with --resume "
                 "never (a loop that steps in its own body, over a generator that yields batches, restarts)"))
    fail(ReplayDiverged(f"the program took an optimizer step before reaching the saved position at {active.not_reached()}"))


def _training_generator(frame):
    """The innermost frame of the program's own code on ``frame``'s stack, if it is a generator's."""
    sources = roots.instrumented_sources()
    while frame is not None:
        if frame.f_code.co_filename in sources:
            return frame if frame.f_code.co_flags & inspect.CO_GENERATOR else None
        frame = frame.f_back
    return None


def _check_reached(replay: Replay) -> None:
    escaped = getattr(sys, "last_value", None)  # set by boot when an exception left the program
    if replay.merged:
        _check_not_captured(replay, escaped)
        _check_first_iteration(replay, escaped)
        if isinstance(witness.active, witness.Checker) and escaped is None:
            witness.active.ended()
        return
    if escaped is not None and not isinstance(escaped, SystemExit):
        how = f"stopped with {_one_line(escaped)}"
    else:
        how = "ended"
    hint = None
    if replay.passed_over:
        # What the code after a passed-over loop met in its place: a best model only the loop
        # kept (best = None before it), a variable only the loop assigned.
        done = replay.finished[replay.passed_over - 1]
        hint = (f"the replay passed over the loop at {_short(done['file'])}:{done['loop_id'].split(':')[0]} (in "
                f"{done['function']}), which had run its course before the snapshot, and the code after it needs what "
                "that loop made; restart from a snapshot taken while it ran with --snapshot ID, or start fresh with "
                "--resume never")
    fail(ReplayDiverged(f"the program {how} before reaching the saved position at {replay.not_reached()}", hint))


# The placeholders a program may reach: LiveOnly and its kinds (a function made mid-run is a LiveFunction)
_PLACEHOLDERS = (LiveOnly, *LiveOnly.__subclasses__())


def _check_not_captured(replay: Replay, escaped) -> None:
    """The program ended on a placeholder it reached (``NotCaptured``; or a TypeError where it
    called or iterated one, which a placeholder must not allow: ``LiveOnly``), however long after
    the merge (a future made after setup, waited on at the next checkpoint; a hook made mid-run,
    applied every tenth step): the restore's failure, exit 6, not the program's."""
    seen = set()
    while escaped is not None and id(escaped) not in seen:
        called = isinstance(escaped, TypeError) and any(f"'{kind.__name__}'" in str(escaped) for kind in _PLACEHOLDERS)
        if isinstance(escaped, NotCaptured) or called:
            what = f"{_one_line(escaped)}: it called or iterated an object the snapshot could not hold" if called else escaped
            fail(RestoreError(
                f"the program stopped on {what} (after snapshot {replay.snap_id} was merged)",
                "a restart cannot give back an object made after setup that holds a thread, a lock, a file or a "
                "function made mid-run (the future of an async save, a queue, a lambda); "
                "`gpusnap inspect DIR` lists what the snapshot could not hold, and --snapshot ID restores an earlier one",
            ))
        seen.add(id(escaped))
        escaped = escaped.__cause__ or escaped.__context__


def _check_first_iteration(replay: Replay, escaped) -> None:
    """An exception that ends the program before the resumed loop's next boundary is blamed on
    the restore (a class whose pickled state leaves out what the program needs, as Lightning's
    CombinedLoader iterator did): the restart refuses (exit 6) instead of passing it off as the
    program's own failure."""
    if escaped is None or isinstance(escaped, (SystemExit, KeyboardInterrupt)) or replay.merged_at is None:
        return
    loop, index = replay.merged_at
    if loop.index <= index + 1:  # still in the first iteration after the merge
        fail(RestoreError(
            f"the program stopped with {_one_line(escaped)} in its first iteration after snapshot {replay.snap_id} "
            f"was merged at {_short(loop.where())}",
            _STALE_GRAPH_HINT if any(text in str(escaped) for text in _STALE_GRAPH) else
            "the restored state may lack something the program needs (please report this); `gpusnap inspect DIR` "
            "shows what the snapshot holds, --snapshot ID restores an earlier one",
        ))


# What torch says when a backward meets a graph that the replay built before the merge: the merge
# wrote the weights it saved (a loss computed before an inner loop that steps on it,
# tests/programs/corpus/adaptive_inner.py). A snapshot holds no autograd graph.
_STALE_GRAPH = ("modified by an inplace operation", "backward through the graph a second time")
_STALE_GRAPH_HINT = (
    "the iteration backpropagated a tensor computed before the loop boundary the snapshot was taken at "
    "(a loss computed before an inner loop that steps on it): a snapshot holds no autograd graph, and the "
    "replay built this one from the weights before the merge; compute it inside the loop that backpropagates "
    "it, or restart from another snapshot with --snapshot ID"
)


_VERIFIED = {
    "checking": "checking the iterations that follow against its witness",
    "unverified": "unverified: it has no witness (the run that took it stopped before the next iteration ended)",
}

_BUG_HINT = (
    "gpusnap could not restore this program's state; `gpusnap inspect DIR` shows what the snapshot "
    "holds, and --snapshot ID restores an earlier one (please report this)"
)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    if len(text) > 300:
        text = text[:297] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _stop(code: int) -> None:
    """End the program now (``verify --replay`` has what it came for)."""
    _flush_events()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def fail(exc: GpusnapError) -> None:
    _write(f"gpusnap: {_rank_prefix()}restore refused: {exc.message}\nhint: {exc.hint}\n")
    _flush_events()
    sys.stdout.flush()
    os._exit(exc.exit_code)


_verbosity = 1  # the run's --quiet (0) / --verbose (2), from the boot configuration
_flush_events = lambda: None  # noqa: E731 - install's: the agent's, which restore does not import
# What a framework adapter does once the snapshot is merged, by what the restore is doing then
# (named in a refusal): called with every live object the snapshot's objects merged into. What
# it returns, if anything, is called once the program's files are back in their snapshot state
# (a thread that appends to one starts then).
AFTER_MERGE: dict[str, object] = {}


def _say(text: str, level: int = 0) -> None:
    """A ``gpusnap:`` line; ``level`` as the supervisor's (0: warnings, always). In a distributed
    run every rank restores at once: progress is rank 0's (every rank's with --verbose)."""
    if level > _verbosity or (level >= 1 and _verbosity < 2 and os.environ.get("RANK", "0") != "0"):
        return
    _console.say(text, prefix=_rank_prefix())


def _rank_prefix() -> str:
    return f"rank {os.environ['RANK']}: " if int(os.environ.get("WORLD_SIZE", "1")) > 1 and "RANK" in os.environ else ""


_console = Console()  # on whatever sys.stderr is when it writes


def _write(lines: str) -> None:
    _console.write(lines)


@contextlib.contextmanager
def _reading_status(snap_id: str, total: int | None):
    """On a terminal, a status line redrawn in place while a long restore reads its chunks."""
    from gpusnap.store import reader

    if _verbosity < 1 or not _console.status_enabled() or os.environ.get("RANK", "0") != "0":
        yield  # (the ranks of a distributed run share a terminal: rank 0 draws the line)
        return
    started, last = time.perf_counter(), float("-inf")  # the first line as soon as STATUS_AFTER_S has passed
    done = [0]

    def report(nbytes: int) -> None:
        nonlocal last
        done[0] += nbytes
        now = time.perf_counter()
        if now - started < knobs.STATUS_AFTER_S or now - last < 0.2:
            return
        last = now
        of = f" of {total / 1e6:.0f} MB ({min(done[0] / total, 1.0):.0%})" if total else ""
        _console.show(f"gpusnap: restoring snapshot {snap_id}: read {done[0] / 1e6:.0f} MB{of}, {now - started:.0f} s")

    reader.report_read = report
    try:
        yield
    finally:
        reader.report_read = None
        _console.clear()


def _short(path: str) -> str:
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return rel if not rel.startswith("..") else path
