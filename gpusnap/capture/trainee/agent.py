"""The trainee side of a snapshot: installed by boot, it takes the snapshot at a safe point.

Flow of one snapshot (docs/architecture.md, "The pipeline")::

    control.request()    signal handler / control thread / gpusnap.snapshot(): set loops.pending
    _on_boundary(loop)   every main-thread loop boundary while pending: is this a safe point?
                         (steploop.is_safe_point)
    _snapshot(loop)      stage (synchronize the devices in use, copy dirty device chunks
                         into the staging arena, reserve its drain region), check headroom,
                         seal the arena's regions, fork
                                                          <- the stall ends here
      child:  writer.write_snapshot(job) -> result on a pipe -> os._exit      (fork)
      parent: a waiter thread reads the result, reaps the child, releases the child's
              arena regions (stage.writer_done), reports to the supervisor

The parts: ``session`` (the shared state), ``control`` (requests, the supervisor's channel),
``steploop`` (the step loop, safe points, optimizer hooks), ``fork`` (the writer process).
At most one writer runs; a request during a write is coalesced into one snapshot taken after
it. A stop request (SIGTERM) waits for its writer and exits with EXIT_PREEMPTED once the
snapshot is committed.
"""

from __future__ import annotations

import atexit
import os
import secrets
import sys
import time

from gpusnap import files, knobs, lifeline, stage
from gpusnap.capture.safepoints import inflight, steploop
from gpusnap.capture.trainee import children, control, handlers, pace, session
from gpusnap.capture.trainee import witness as witnessing
from gpusnap.capture.writer import fork
from gpusnap.errors import EXIT_PREEMPTED, EXIT_PREEMPTED_UNSAVED, StageError
from gpusnap.graph import caches, exits, rng, roots, settings, workers
from gpusnap.instrument import loops
from gpusnap.stage import limits

_coalesced_said = False


def install(config: dict, note_source) -> None:
    """Called by gpusnap.boot before the first line of the program runs. ``note_source(source)``
    is what fast-forward will need of a loop's source (restore's ``fastforward.describe``): capture
    takes the notes, restore reads them, and capture never imports restore."""
    session.config = dict(config)
    os.register_at_fork(after_in_child=loops.reset_after_fork_in_child)
    if not session.config.get("run_dir"):
        return
    caches.install()  # the program's functools caches, with entries a snapshot can hold
    import psutil  # noqa: F401  (the headroom check runs inside the stall)

    from gpusnap.capture.writer import process as writer  # noqa: F401  (every forked writer would import it again)
    from gpusnap.store import RunDir, codec, preload

    preload()
    codec.decode_on_one_thread()  # this process forks writers: blosc2's pool must never run here
    lifeline.arm()  # each writer dies with the trainee (fork.start_writer)
    if session.config.get("dist"):  # a rank of a torchrun job: its own shard, global snapshots
        from gpusnap.capture.dist import coordinator as dist

        session.rundir = dist.install(session.config)
        session.dist = dist.coordinator
    else:
        session.rundir = RunDir.open(session.config["run_dir"], trusted=True)
    loops.on_boundary = _boundary
    session.resumed_from = (session.config.get("resume") or {}).get("snapshot")
    children.install()
    from gpusnap.instrument.cache import cache_dir

    files.install(session.config, str(session.rundir.path), always_excluded=[d for d in (cache_dir(),) if d])
    atexit.register(_exit_preempted_if_the_program_stopped)  # first: it runs last
    control.install_signals()
    control.connect(session.config.get("control"))
    steploop.install(note_source)
    inflight.install()
    atexit.register(witnessing.flush)  # after the writer's wait (atexit runs in reverse): its commit frees the witness
    atexit.register(fork.wait_for_writer_at_exit)
    settings.note_start()  # what the program changes process-wide from here on is its own
    exits.install()  # and what it registers with atexit


def resuming():
    """(run directory, snapshot id) when this run restarts from a snapshot, else None: boot
    then installs the replay, handing it ``emit`` and ``resumed``."""
    return (session.rundir, session.resumed_from) if session.resumed_from is not None else None


emit = control.emit
flush_events = control.flush  # before an exit that skips atexit (os._exit)


def before_merge() -> None:
    """The replay is about to merge: in a distributed run, every rank resumes from one snapshot."""
    if session.dist is not None:
        session.dist.agree_resume()


def resumed(snap_id: str, steps: int, iteration: int | None) -> None:
    """The replay merged snapshot ``snap_id``: count steps and iterations on from it."""
    session.steps, session.resumed_from = steps, snap_id
    session.iterations = iteration if iteration is not None and steps else 0


def _boundary(loop) -> None:
    """``loops.on_boundary`` (every main-thread boundary while ``loops.pending``): the witness's
    part, then the snapshot's."""
    if loops.replaying is not None:
        return  # nothing to record or snapshot until the replay has merged its snapshot
    if witnessing.stopping():
        control.requests.clear()  # the stop snapshot is taken: it answers them all
        if witnessing.stop_due():
            _exit_after_stop(loop)
    if witnessing.at_boundary(loop):
        return  # a restarted run not yet proven takes no snapshot; requests wait
    coordinator = session.dist
    if coordinator is not None:
        if control.requests or coordinator.wants_boundary():
            coordinator.on_boundary(loop)
    elif control.requests:
        _on_boundary(loop)
    if handlers.due() and not control.requests and not witnessing.stopping():  # the snapshot is forked
        handlers.deliver(loop.frame, stop=False)
    if witnessing.wants_boundaries() or (coordinator is not None and coordinator.wants_boundary()):
        loops.pending = True
    elif not control.requests:
        loops.pending = False
        if control.requests:  # a signal between the check and the store
            loops.pending = True


def _exit_preempted_if_the_program_stopped() -> None:
    """At exit, after the writer's wait: a program that stopped through its own SIGTERM handler,
    given after a stop snapshot, stopped for the preemption, and requeued it goes on from that
    snapshot (``handlers``)."""
    if handlers.stopped_by_program:
        fork.exit_now(EXIT_PREEMPTED if session.last_result.get("event") == "committed" else EXIT_PREEMPTED_UNSAVED)


def _exit_after_stop(loop) -> None:
    """End the process after a stop snapshot: its witness is recorded (or none is taken), so the
    program's own handlers run now; one that stops the program (Lightning's, at its next batch)
    would otherwise leave the restart unverified. Single process only: a distributed job's stop
    ends in ``coordinator.stop_after``."""
    handlers.deliver(loop.frame, stop=True)
    writer = session.writer
    if writer is not None:
        writer.thread.join()  # its report says whether the snapshot is committed, and frees its witness
    witnessing.flush()
    fork.exit_now(EXIT_PREEMPTED if session.last_result.get("event") == "committed" else EXIT_PREEMPTED_UNSAVED)


def _on_boundary(loop) -> None:
    global _coalesced_said
    requests = control.requests
    stop = any(s for _, s in list(requests))
    running = session.writer
    if running is not None and not stop:
        if not _coalesced_said:
            _coalesced_said = True
            control.emit("coalesced", id=running.snap_id, reason=requests[0][0] if requests else "?")
        return
    if not steploop.is_safe_point(loop) or steploop.in_accumulation(loop) or inflight.holds_back():
        return
    _snapshot(loop)


def _snapshot(loop) -> None:
    requested_s = time.perf_counter()
    loops.pending = False
    requests = control.requests
    reasons = list(requests)
    del requests[: len(reasons)]  # a request that lands meanwhile stays for the next boundary
    if requests:
        loops.pending = True
    stop = any(s for _, s in reasons)
    reason = "term" if stop else reasons[0][0] if reasons else "request"
    take(loop, None, reason, stop, requested_s)


def take(loop, snap_id: str | None, reason: str, stop: bool, requested_s: float | None = None) -> None:
    """Snapshot ``snap_id`` (None: the run directory's next) at this safe point. In a rank of a
    distributed run (``session.dist``) the id is the global snapshot's, and what becomes of it
    (a shard that fails, a stop) is the coordinator's to settle with the other ranks."""
    global _coalesced_said
    requested_s = time.perf_counter() if requested_s is None else requested_s
    coordinator = session.dist
    iteration = session.iterations if session.iterations else loop.index
    if loop in loops.ACTIVE:
        steploop.mark_enclosing(loops.ACTIVE.index(loop))
    control.emit("honored", reason=reason, iteration=iteration, where=loop.where())
    running = session.writer
    if running is not None:  # only a stop request gets here with a writer running
        running.thread.join()
    _coalesced_said = False

    snap_id = snap_id or session.rundir.next_snapshot_id()
    try:
        running = children.refusal()
        if running is not None:
            raise running
        device = stage.stage_device_memory(snap_id, _written, paranoid=bool(knobs.PARANOID or session.config.get("paranoid")))
        unforked = stage.stage_unforked(roots.frames_on_path(loop.frame))
        # A stop snapshot drains nothing: training stops (its witness's few iterations run at
        # idle priority), and the drain's copy would only delay the commit.
        drain = stage.drain_region() if knobs.DRAIN != "off" and not stop else None
        windows = stage.window_region(stop)  # pages allocated ahead for the pack windows, if any
        refusal = _headroom_refusal()
        hint = None
    except StageError as exc:  # the arena cannot hold what the snapshot stages, a CUDA error
        refusal, hint = exc.message, exc.hint
    except Exception as exc:  # noqa: BLE001 - whatever else failed in the stall: a snapshot never ends the program
        first = (str(exc).splitlines() or [""])[0]
        refusal = f"staging failed: {type(exc).__name__}: {first}"
        hint = "this snapshot is skipped, training goes on; please report this"
    files_job = None
    if refusal is None:
        _flush_console()
        try:
            files_job = files.stage(snap_id, session.rundir.path)
        except Exception as exc:  # noqa: BLE001 - never into the program's loop
            refusal, hint = f"recording the program's files failed: {type(exc).__name__}: {exc}", None
    if refusal is not None:
        stage.snapshot_skipped()
        if coordinator is not None:
            coordinator.shard_failed(f"snapshot skipped: {refusal}")
            return
        if not control.connected():  # otherwise the supervisor prints the event
            print(f"gpusnap: snapshot skipped: {refusal}", file=sys.stderr, flush=True)
            if hint:
                print(f"hint: {hint}", file=sys.stderr, flush=True)
        control.emit("skipped", reason=reason, message=refusal, **({"hint": hint} if hint else {}))
        if stop:
            fork.exit_now(EXIT_PREEMPTED_UNSAVED)
        return
    from gpusnap.capture.writer.process import WriteJob  # imported at install: free here

    job = WriteJob(
        run_dir=str(session.rundir.path),
        snap_id=snap_id,
        frame=loop.frame,
        active_loops=list(loops.ACTIVE),
        finished_loops=steploop.finished_loops(),
        rng_states=rng.capture(),
        settings=settings.capture(),
        requested_s=requested_s,
        iteration=iteration,
        reason=reason,
        resumed_from=session.resumed_from,
        keep=session.config.get("keep") if coordinator is None else None,  # a shard's retention is global
        prune_first=session.disk_full,
        steps=session.steps,
        sources=dict(roots.instrumented_sources()),
        device=device,
        unforked=unforked,
        arena_fd=stage.arena_fd(),
        drain=drain,
        windows=windows,
        optimizers=list(session.optimizers),
        schedule=session.schedule,
        stop=stop,
        expected_bytes=session.last_bytes_total,
        lock_token=session.config.get("lock_token") if coordinator is None else coordinator.lock_held.token,
        files=files_job,
        witness_token=secrets.token_hex(8),
    )
    workers.freeze()  # persistent workers' epoch states: the next epoch's may replace them after the fork
    job.generation = stage.writer_starting()  # seals the regions this writer reads
    try:
        fork.start_writer(job, at_step_loop=steploop.is_step_loop(loop))  # session.writer
    except OSError as exc:  # fork itself failed (no memory, process limit): training goes on
        files.forked(files_job)
        stage.writer_done(job.generation)
        message = f"could not fork the writer: {exc.strerror or exc}"
        if coordinator is not None:
            coordinator.shard_failed(message)
            return
        if not control.connected():
            print(f"gpusnap: snapshot {job.snap_id} failed: {message}", file=sys.stderr, flush=True)
        control.emit("failed", id=job.snap_id, message=message)
        if stop:
            fork.exit_now(EXIT_PREEMPTED_UNSAVED)
        return
    files.forked(files_job)  # the writer has its own copies of the descriptors
    trains_on = witnessing.start(job.snap_id, job.witness_token, loop, steploop.step_loop_keys(), stop and coordinator is None)
    if stop and trains_on:
        pace.trainee_yields()  # the writer has the machine; the witness's iterations take what it leaves
    if stop and not trains_on:
        if coordinator is not None:
            # It ends the process, and runs no handler of the program's: a rank's handler may
            # talk to the others (Lightning's broadcasts).
            coordinator.stop_after()
        _exit_after_stop(loop)


def _flush_console() -> None:
    """What the program printed before the snapshot leaves its buffer now, before the fork: stdout
    into a pipe or a file (a job's log) is block-buffered, a process killed after the snapshot
    took those lines with it, and the restart goes on after them (``prints.py``: the log had none
    of the snapshot's first lines). The same bytes, only earlier."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed or replaced stream: the program meets it itself
            pass


def _written(snap_id: str) -> frozenset | None:
    """The buffers committed snapshot ``snap_id`` holds; None when it is not committed (or
    has been removed since)."""
    try:
        return frozenset(session.rundir.load_manifest(snap_id).get("buffers") or ())
    except Exception:  # noqa: BLE001 - absent or unreadable: not committed
        return None


# What boot hands the replay, so that restore reaches the device side without importing stage.
restore_device = stage.restore_allocations
write_device = stage.write_device_memory


def _headroom_refusal(root: str = "/") -> str | None:
    """Why a fork now could get the program killed, or None. The writer's copy-on-write worst
    case is the trainee's resident set, and it must fit in what is left of host memory or, in a
    job's memory cgroup, of the cgroup's limit, whichever is tighter: the cgroup's OOM killer
    acts long before the host runs out (``stage.limits``, as the arena is sized)."""
    import psutil

    rss = psutil.Process().memory_info().rss
    limit = limits.tightest(root)
    if rss > limit.usable_bytes:
        return (
            f"copy-on-write worst case {rss / 2**30:.2f} GiB exceeds {knobs.HEADROOM_FRACTION:.0%} of the "
            f"{limit.room_bytes / 2**30:.2f} GiB left under {limit.what}"
        )
    return None
