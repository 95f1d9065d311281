"""How a snapshot's writer shares the host: its threads, their priority, and the pace that bounds
a write when no core is idle.

A stop snapshot (SIGTERM, a spot notice) is waited for by training anyway, and must commit within
the notice: its writer runs at the trainee's priority with one encoder thread per core and drains
nothing, and the trainee drops to idle priority for the iterations its witness records
(``trainee_yields``), so the writer has the machine.

A periodic snapshot must cost training little: after its drain (at the trainee's priority, see
``stage/drain.py``) its encoder threads run at ``WRITER_PRIORITY`` (idle: only on cores training
leaves idle). Where no core is idle (training and its DataLoader workers hold them all, or other
jobs do), idle threads would wait for the end of training, and a node failure meanwhile would lose
everything since the last commit. So a pacer thread bounds the write: it expects the snapshot's
bytes done by ``deadline_s`` = max(PACE_MIN_S, 2 x their writing time at the disk's measured
speed), and whenever the bytes done fall behind a straight line to ``PACE_SHARE`` of it, it starts
one encoder thread at normal priority (a thread at idle priority cannot raise itself back without
privileges, but one started by a thread at normal priority runs at normal priority), which stops
once the write is ahead again; past the deadline, one per core. The line counts the bytes put so
far piece by piece: counted buffer by buffer, a 64 MiB tensor put no bytes until its last chunk,
and the writer never fell behind a line to nothing. The caller's thread, which walks the
program's objects and hashes every chunk, runs at the trainee's priority throughout: hashing is a
small part of the work (xxh3 at several GB/s), and the encoders wait for it.

Once the pacer has added an encoder, the idle ones take no more chunks, and the added one takes
over the chunks they hold (``store/pipeline.py``). They were starved, and a thread of this process
starved while it holds the GIL holds back every other: the added encoder, the pacer itself. With
three DataLoader workers and training spinning on the 2 cores of the CI machine, a 64 MiB write
took 1.99-6.89 s against its 2 s deadline before that, 0.25-1.28 s after (22 runs,
``tools/results/writer-priority-inversion-cpu-2026-11-29.txt``).

A rank of a distributed run shares its node's cores with the other ranks' writers: it gets
cores / local ranks encoder threads (``LOCAL_WORLD_SIZE``).
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass

from gpusnap import knobs

PACE_MIN_S = 2.0  # no deadline is shorter: walking and pickling a program's objects takes time too
# The line reaches all bytes at this share of the deadline: the last packs, the index and the
# commit follow, and the drain before it ran without the pacer. At 0.75, 2 of 6 periodic 1 GB
# snapshots with every core training committed past a 2 s deadline (2.01 s, 2.13 s); at 0.6, 1 of
# 6 (tools/results/bench_snapshot-cpu-2026-11-28-1gb-default-pace*.txt).
PACE_SHARE = 0.6
TICK_S = 0.05


@dataclass
class Plan:
    threads: int
    stop: bool  # a stop snapshot: every thread at the trainee's priority, no pacer
    deadline_s: float | None = None  # the pacer's (None: no pacer)
    expected_bytes: int = 0
    boosted_s: float = 0.0  # time encoder threads at normal priority ran (filled in by the pacer)
    boosts: int = 0
    windows: str | None = None  # where the pack windows were (store.writer.SnapshotWriter.windows)

    def record(self) -> dict:
        """The manifest's ``writer``: how this write ran."""
        out = {"threads": self.threads, "priority": "trainee" if self.stop else knobs.WRITER_PRIORITY}
        if self.deadline_s is not None:
            out.update(deadline_s=round(self.deadline_s, 3), expected_bytes=self.expected_bytes,
                       boosted_s=round(self.boosted_s, 3), boosts=self.boosts)
        if self.windows is not None:
            out["windows"] = self.windows
        return out


def threads_for(stop: bool) -> int:
    """Encoder threads: WRITER_THREADS, else every core, shared among a node's ranks."""
    if knobs.WRITER_THREADS:
        return knobs.WRITER_THREADS
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    ranks = 1 if stop else max(1, _int_env("LOCAL_WORLD_SIZE", 1))
    return max(1, cores // ranks)


def _int_env(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


def plan(stop: bool) -> Plan:
    """How this writer runs: its encoder threads, and whether they lower their priority
    (``encoder_init``)."""
    return Plan(threads=threads_for(stop), stop=stop)


def encoder_init(p: Plan):
    """What each encoder thread runs first: a periodic snapshot's lowers its own priority."""
    return None if p.stop else _lower_this_thread


def _lower_this_thread() -> None:
    lower_priority(knobs.WRITER_PRIORITY)


def lower_priority(policy: str) -> None:
    """The calling thread only (Linux schedules threads): ``idle`` runs it only on cores nothing
    else wants (SCHED_IDLE); a number: that nice value."""
    if policy == "idle":
        try:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
            return
        except (AttributeError, OSError):
            policy = "19"
    try:
        os.setpriority(os.PRIO_PROCESS, 0, int(policy))
    except (ValueError, OSError):
        pass


class Pacer:
    """Keeps a periodic writer within its deadline (module docstring). ``start`` once the store's
    writer exists; ``stop`` before its commit waits for the last packs."""

    def __init__(self, p: Plan, sink, expected_bytes: int, disk_bps: float, started: float):
        self.plan, self.sink = p, sink
        p.expected_bytes = max(1, int(expected_bytes))
        p.deadline_s = max(PACE_MIN_S, 2.0 * p.expected_bytes / max(disk_bps, 1.0))
        self.started = started
        self._boosting = 0  # encoder threads at normal priority wanted now
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpusnap-pacer", daemon=True)

    def start(self) -> "Pacer":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._done.set()
        self._thread.join()
        self._boosting = 0

    def behind(self, elapsed: float) -> int:
        """Encoder threads at normal priority the write needs ``elapsed`` s after its start."""
        p = self.plan
        if elapsed >= p.deadline_s:
            return p.threads
        done, put = self.sink.progress()
        # What the pickler has put counts as soon as it is put: the guess at the start knows only
        # the last snapshot and what the optimizers step (a first snapshot, a large buffer no
        # optimizer steps, would otherwise never fall behind it).
        expected = max(p.expected_bytes, put)
        return 1 if done < expected * elapsed / (PACE_SHARE * p.deadline_s) else 0

    def _run(self) -> None:
        running = 0
        last = time.perf_counter()
        while not self._done.wait(TICK_S):
            now = time.perf_counter()
            if running:
                self.plan.boosted_s += now - last
            last = now
            want = self.behind(now - self.started)
            self._boosting = want
            running = min(running, want)
            while running < want and self.sink.add_encoder(self._until(running + 1)):
                running += 1
                self.plan.boosts += 1

    def _until(self, n: int):
        return lambda: self._boosting < n


def trainee_yields() -> None:
    """In the trainee, after a stop snapshot's fork: every thread of it at idle priority, so that
    the iterations its witness records run on what the writer leaves. The trainee exits after."""
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return
    for tid in tasks:
        try:
            os.sched_setscheduler(int(tid), os.SCHED_IDLE, os.sched_param(0))
        except (AttributeError, OSError, ValueError):
            pass
