"""The writer: runs in the forked child, turns the trainee's image into a committed snapshot.

Order: drain large CPU tensors into the drain region of the staging arena (not for a stop
snapshot) -> set up the store's encoder threads and, for a periodic snapshot, the pacer
(``pace``: idle priority, bounded) -> collect roots (with what fast-forward will need of each
loop: its note, RNG states, a digest of its last item) -> pickle the graph (buffers stream into
the store as they are met) -> put the pickle stream itself as the buffer "graph" -> name objects
by path -> commit the manifest -> apply retention (a failure there is a warning: the snapshot is
committed). The trainee has resumed training before any of this starts.
"""

from __future__ import annotations

import gc
import io
import sys
import time
from dataclasses import dataclass, field

from gpusnap import knobs
from gpusnap.capture.pickling.pickler import GraphPickler, type_name
from gpusnap.capture.pickling.reducers import HostMemory, _storage_key
from gpusnap.capture.trainee import loopnotes, pace, paths
from gpusnap.graph import roots, workers
from gpusnap.stage import limits
from gpusnap.stage.drain import Drained, drain
from gpusnap.stage.prepare import window_memory
from gpusnap.store import writer as store_writer


@dataclass
class WriteJob:
    """Everything the parent decided before fork; the child reads it from its memory image."""

    run_dir: str
    snap_id: str
    frame: object  # the frame of the loop whose boundary is the safe point
    active_loops: list
    rng_states: dict
    requested_s: float  # perf_counter() when the safe point was reached (monotonic across fork)
    iteration: int | None
    reason: str
    resumed_from: str | None = None
    keep: int | None = None
    prune_first: bool = False  # a snapshot of this run failed for lack of space: retention first, to keep - 1
    steps: int = 0  # optimizer steps so far: restored so that iteration numbers continue
    sources: dict = field(default_factory=dict)  # instrumented file -> xxh3-128 of its source
    device: object = None  # stage.device.DeviceStage: the device memory staged in the arena
    unforked: object = None  # stage.unforked.Unforked: host memory fork does not pass on, staged
    arena_fd: int = -1  # the staging arena's memfd: the writer maps its regions afresh from it
    drain: object = None  # the stage.arena.Region the writer drains CPU tensors into (None: no drain)
    windows: object = None  # the stage.arena.Region for its pack windows, allocated ahead (stage.window_region)
    optimizers: list = field(default_factory=list)  # what the drain copies first
    generation: int | None = None  # of the arena regions this writer reads (sealed before fork)
    schedule: dict | None = None  # the supervisor's timer and measured overhead (manifest "schedule")
    stop: bool = False  # a stop snapshot (SIGTERM, a spot notice): training waits for it
    expected_bytes: int = 0  # what the last snapshot held: the pacer's guess of this one's bytes
    lock_token: str | None = None  # of the run directory's lock this writer writes under (store.lock.check_token)
    files: object = None  # files.record.FilesJob: the program's files, as the stall found them
    witness_token: str | None = None  # this snapshot's own, in its manifest and in its witness
    settings: dict = field(default_factory=dict)  # graph.settings.capture(): what the program changed process-wide
    finished_loops: list = field(default_factory=list)  # training phases that ended before it (steploop.finished_loops)


def write_snapshot(job: WriteJob, report_progress=None) -> dict:
    """Write ``job``'s snapshot; ``report_progress(bytes put, bytes written)`` is told how far
    it is (``store.writer.WriterSetup``)."""
    from gpusnap.store import RunDir

    stall_s = time.perf_counter() - job.requested_s
    started = time.perf_counter()
    # The drain races the trainee's next writes to the same pages (each one it loses is a page
    # copy in the trainee), so it runs at the trainee's priority; the rest has no such race:
    # only cores the trainee leaves idle.
    drained = drain(job.arena_fd, job.drain, knobs.DRAIN_MIN_BYTES, job.optimizers) if job.drain is not None else Drained()
    drain_s = time.perf_counter() - started
    plan = pace.plan(job.stop)
    # The pack windows are pages the trainee allocated ahead, when it has them all: nothing to
    # fault in before the first pack goes to the disk (a stop snapshot of 1 GB started writing
    # at 30 ms instead of 70-120 ms), nothing to allocate and free on every periodic snapshot,
    # nothing for an out-of-memory kill to take.
    windows = window_memory(job.arena_fd, job.windows, store_writer.windows_nbytes()) if job.windows is not None else None
    setup = store_writer.WriterSetup(threads=plan.threads, encoder_init=pace.encoder_init(plan), window_memory=windows,
                                     own_windows=windows is not None or _room_for(store_writer.windows_nbytes()),
                                     report_progress=report_progress)
    # The writer exits when done, so its garbage never needs collecting, and the cycle collector
    # would otherwise rescan the trainee's whole inherited heap over and over while the walks
    # below allocate (half the time of pickling a deep graph).
    gc.disable()
    rundir = RunDir.open(job.run_dir)
    # On a disk that filled, the snapshot would not fit beside the ones --keep keeps: make room
    # first, keeping the newest keep - 1 (and always one), so that the run has keep again once it
    # commits. Retention after the commit alone never ran, as no commit came.
    before = _apply_retention(rundir, max(1, job.keep - 1), "before the write") if job.keep and job.prune_first else {}
    sink = rundir.begin_snapshot(job.snap_id, lock_token=job.lock_token, setup=setup)
    pacer = None
    if not job.stop:
        staged = job.device.dirty_bytes if job.device is not None else 0
        expected = max(job.expected_bytes, drained.wanted + staged)
        pacer = pace.Pacer(plan, sink, expected, sink.disk_bps(), started).start()
    try:
        read = HostMemory(drained, job.unforked).view
        payload = roots.collect(job.frame, job.active_loops, job.rng_states, lambda loop: loopnotes.record(loop, read),
                                loopnotes.fetched_ahead, job.settings)
        stream = io.BytesIO()
        pickler = GraphPickler(stream, sink, drained=drained, device=job.device, unforked=job.unforked,
                               frame_cells=roots.frame_cells(roots.frames_on_path(job.frame)))
        pickler.dump_graph(payload)
        drained.done()  # the pages of what the pickler drained go now, and the region's unused tail
        if job.device is not None:
            _put_device(job, rundir, sink, pickler)
        graph = sink.put_buffer(stream.getbuffer(), dtype="bytes", typesize=1)
        graph["kind"] = "graph"
        if pickler.iterative:
            graph["pickler"] = "iterative"  # the graph was too deep for the C pickler
        sources = {id(obj) for obj in (payload.get("ahead") or {}).values()}  # positioned by fast-forward, not livecheck
        iterators = {id(obj): info for obj, _ in pickler.live_only
                     if id(obj) not in sources and (info := loopnotes.describe(obj, read, job.active_loops, pickler.context_generators))}
        manifest = _manifest(job, payload, pickler, graph, stall_s, iterators, loopnotes.held_by_sources(job.active_loops))
        if job.files is not None:
            from gpusnap import files

            manifest["files"], file_buffers = files.put(job.files, sink, rundir)
            manifest["buffers"].update(file_buffers)
        if job.device is not None:
            manifest["allocations"] = [a.record() for a in job.device.allocations]
            manifest["device"] = _device_summary(job.device, pickler)
        manifest["drain"] = {"s": drain_s, "bytes": drained.nbytes}
        if job.unforked is not None:
            manifest["unforked_bytes"] = job.unforked.nbytes
        if job.schedule:
            manifest["schedule"] = job.schedule

        def stamp(doc: dict) -> None:  # once every pack and the index are committed
            if pacer is not None:
                pacer.stop()
            plan.windows = sink.windows
            now = time.perf_counter()
            doc.update(write_s=now - started, durable_s=now - job.requested_s, writer=plan.record())

        info = sink.commit(manifest, stamp)
    except BaseException:
        if pacer is not None:
            pacer.stop()
        sink.abort()
        raise
    durable_s = time.perf_counter() - job.requested_s
    retention = _apply_retention(rundir, job.keep) if job.keep else {}
    return {
        **before,
        **retention,
        "event": "committed",
        "id": info.id,
        "iteration": job.iteration,
        "stall_s": stall_s,
        "durable_s": durable_s,
        "write_s": time.perf_counter() - started,
        "drain_s": drain_s,
        "drained_bytes": drained.nbytes,
        "drain_wanted_bytes": drained.wanted if job.drain is not None else None,
        "bytes_written": info.bytes_written,
        "bytes_total": info.bytes_total,
        "live_only": len(pickler.live_only),
    }


def _room_for(nbytes: int) -> bool:
    """Whether the memory left (the host's, the job's cgroup's) holds ``nbytes`` more within
    what gpusnap may take of it (``Limit.usable_bytes``, as the fork's check asks of the
    trainee's resident set): pack windows past it would meet the out-of-memory killer, which may
    take the program after the writer."""
    try:
        return nbytes <= limits.tightest().usable_bytes
    except (OSError, ValueError, KeyError):  # no /proc/meminfo to read: as before the check
        return True


def _put_device(job: WriteJob, rundir, sink, pickler: GraphPickler) -> None:
    """The device ranges: raw allocations, and those the graph's storages lie in; dirty chunks
    from the arena, clean ones by the previous snapshot's ids."""
    from gpusnap.stage import put_ranges

    previous = rundir.load_manifest(job.device.previous).get("buffers", {}) if job.device.previous else {}
    pickler.buffers.update(put_ranges(job.device, job.arena_fd, sink, previous, pickler.device_wanted))


def _device_summary(stage, pickler: GraphPickler) -> dict:
    """What the manifest says of device memory: what was copied off the GPU, what the snapshot
    holds, what it leaves out (copied in the stall but reached by nothing the program holds
    from its roots; in use on the device and listed by no source)."""
    unreached: dict[str, int] = {}
    for staged in stage.ranges:
        r = staged.range
        if not r.always_written and r.name not in pickler.device_wanted:
            unreached[str(r.device)] = unreached.get(str(r.device), 0) + r.nbytes
    return {"dirty_bytes": stage.dirty_bytes, "devices": list(stage.devices), "reused_from": stage.previous,
            "captured_bytes": sum(s.range.nbytes for s in stage.ranges if s.range.always_written or s.range.name in pickler.device_wanted),
            "unreached_bytes": unreached,
            "unaccounted_bytes": {str(d): n for d, n in stage.unaccounted().items()}}


def _apply_retention(rundir, keep: int, when: str = "after the commit") -> dict:
    """Prune to the newest ``keep`` snapshots. The snapshot is committed before this runs, and a
    commit is a commit: a failure here is a warning beside it (``warning``, ``hint``), never the
    snapshot's failure (which would turn a SIGTERM's exit 75 into 76). Before the write (a full
    disk), a failure is a warning too: the write may fit all the same."""
    try:
        report = rundir.prune(keep)
    except Exception as exc:  # noqa: BLE001 - whatever it is, the snapshot stays committed
        message = getattr(exc, "message", None) or str(exc) or type(exc).__name__
        return {
            "warning": f"retention (--keep {keep}) failed {when}: {message}",
            "hint": getattr(exc, "hint", None) or "run `gpusnap gc DIR --keep N` once the cause is fixed",
        }
    return {"pruned_first": report["removed_snapshots"]} if when != "after the commit" else {}


def _manifest(job: WriteJob, payload: dict, pickler: GraphPickler, graph: dict, stall_s: float, iterators: dict,
              in_sources: set[int]) -> dict:
    torch = sys.modules.get("torch")
    named = roots.named_roots(payload)
    wanted = {id(obj) for obj, _ in pickler.live_only} | {id(t) for t, _ in pickler.tensors}
    wanted |= {id(b) for b, _ in pickler.core_buffers}
    where = paths.find_paths(named, wanted, torch)

    buffers = dict(pickler.buffers)
    buffers["graph"] = graph
    objects = [{"path": path, "type": type_name(value)} for path, value in named]
    for tensor, key in pickler.tensors:
        path = where.get(id(tensor))
        if path is None:
            continue
        name = pickler.storage_names.get(key)
        if name is not None:
            buffers[name].setdefault("path", path)
        objects.append(
            {
                "path": path,
                "type": type_name(tensor),
                "dtype": str(tensor.dtype).removeprefix("torch."),
                "shape": list(tensor.shape),
                "buffer": name,
            }
        )
    by_path = {entry["path"]: entry for entry in objects}
    for buffer, name in pickler.core_buffers:
        path = where.get(id(buffer))
        if path is None:
            continue
        if name is not None:
            buffers[name].setdefault("path", path)
        entry = by_path.get(path)
        if entry is None:  # not a root itself
            entry = {"path": path, "type": type_name(buffer)}
            objects.append(entry)
        entry.update(buffer=name, nbytes=buffer.size)
    modules = {
        path: paths.module_tensors(module, pickler.storage_names, _storage_key, pickler.storage_offsets)
        for path, module in paths.top_modules(named, torch)
    }
    live_only = [{"path": where.get(id(obj), "?"), "type": name} for obj, name in pickler.live_only]
    for entry, (obj, _) in zip(live_only, pickler.live_only):
        # where it stood: replay checks its own (livecheck); one that only a loop's source
        # reaches moves with the source, which fast-forward positions and checks
        if id(obj) in iterators and not (entry["path"] == "?" and id(obj) in in_sources):
            entry["iterator"] = iterators[id(obj)]
    return {
        "iteration": job.iteration,
        "reason": job.reason,
        "witness_token": job.witness_token,
        "stall_s": stall_s,
        "resumed_from": job.resumed_from,
        "roots": {
            "frames": [{"file": f["file"], "function": f["function"], "line": f["line"]} for f in payload["frames"]],
            "globals": sorted(payload["globals"]),
            "rng": sorted(payload["rng"]),
        },
        "loops": payload["loops"],
        "finished": job.finished_loops,
        "workers_draw": workers.seen(),
        "steps": job.steps,
        "sources": job.sources,
        "objects": objects,
        "live_only": live_only,
        "modules": modules,
        "buffers": buffers,
    }
