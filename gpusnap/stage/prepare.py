"""Between snapshots: the trainee readies its memory for the next drain, in the background.

After an optimizer's first step, and again on the first step after each snapshot, ``prepare``
lists the large CPU tensors the optimizers step (a few microseconds a tensor, in the training
thread), reserves the next snapshot's drain region of the arena for them (``drain_region``
hands it to the snapshot), and gives the work to one thread of the trainee:

1. collapse those tensors into huge pages (``hugepages``): after a drain, the trainee's next
   write then costs one fault per 2 MiB instead of one per 4 KiB, and fork copies 512 times
   fewer page-table entries;
2. allocate the drain region's pages (``Arena.populate``), with ``GPUSNAP_DRAIN=keep``: no
   drain then pays for fresh pages while it races the trainee;
3. with it, once a snapshot has filled more than one pack, the pages of the next writer's pack
   windows (``window_region``): a writer that allocates and frees its own spent 40% of its
   CPU time on them (a 96 MB shard of a 4-rank job on the CI machine, ``perf``: populating,
   unmapping and freeing 136 MiB of shared memory), at the trainee's priority, on every
   snapshot.

All are done in steps of a few milliseconds, and none starts while a writer runs. The thread
runs at the trainee's priority and sleeps after each step for as long as ``1 / SHARE - 1`` times
the step took, so it takes at most ``SHARE`` of one core from training. It ran at idle priority
once, and that made the first snapshot of a run wait: a collapse holds the process's memory-map
lock, which fork needs for writing, and on a host whose cores training keeps busy an idle-priority
thread preempted inside a step held it for hundreds of milliseconds (the first snapshot stalled
0.49-0.64 s where later ones, once the thread was done, stalled 0.01-0.06 s:
tools/results/bench_snapshot-cpu-2026-11-24-exp-first-stall.txt), and the training threads' own
page faults queued behind it too (populating holds the same lock). At the trainee's priority a
step in flight ends within its few milliseconds, so ``writer_starting`` gives it
``_STEP_GRACE_S`` and forks. Each pass skips what is done already, so the pass after a snapshot
does only what the snapshot undid.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator

from gpusnap import knobs
from gpusnap.errors import ArenaFull, StageError
from gpusnap.stage import hugepages
from gpusnap.rawmem import address_of, resident
from gpusnap.stage.arena import Region, made_arena, trainee_arena, writer_view


# How long the stall lets a step in flight finish before it forks anyway: a step takes a few
# milliseconds, and a step that is done holds no kernel lock (mmap_lock, for a collapse) that
# fork would queue behind.
_STEP_GRACE_S = 0.005
# The share of one core the thread takes at most (it sleeps between steps to keep to it).
SHARE = 0.5


class _Worker:
    def __init__(self):
        self._writer_running = False
        self._between_steps = threading.Event()
        self._between_steps.set()
        self._work: Iterator | None = None
        self._new_work = threading.Condition()
        self._pending = False
        self.idle = threading.Event()  # set while the thread has nothing to do
        self._thread: threading.Thread | None = None

    def start(self, work: Iterator) -> None:
        """Run ``work`` (an iterator: each next() is one step) instead of any earlier work."""
        with self._new_work:
            self._work, self._pending = work, True
            self.idle.clear()
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="gpusnap-prepare", daemon=True)
                self._thread.start()
            self._new_work.notify()

    def writer_starting(self) -> None:
        """No step starts from now on; a step in flight gets ``_STEP_GRACE_S`` to end, then
        ends on its own."""
        self._writer_running = True
        self._between_steps.wait(_STEP_GRACE_S)

    def writer_done(self) -> None:
        self._writer_running = False

    def _run(self) -> None:
        while True:
            with self._new_work:
                while not self._pending:
                    self.idle.set()
                    self._new_work.wait()
                work, self._pending = self._work, False
            while work is not None and not self._writer_running and work is self._work:
                self._between_steps.clear()
                started = time.perf_counter()
                try:
                    next(work)
                except StopIteration:
                    break
                except Exception:  # noqa: BLE001 - best effort: a failed step costs speed only
                    break
                finally:
                    self._between_steps.set()
                time.sleep((time.perf_counter() - started) * (1.0 / SHARE - 1.0))


_worker = _Worker()
# What the next drain is expected to copy: the storages the optimizers step (known from the
# last ``prepare``) and what the last writer's pickler drained besides them.
_optimizer_bytes = 0
_other_bytes = 0
_drain: Region | None = None  # the next snapshot's drain region, reserved ahead
_windows: Region | None = None  # the next writer's pack windows, reserved ahead


def prepare(optimizers, windows_nbytes: int = 0) -> None:
    """In the trainee, after an optimizer step: start readying the memory the next drain
    copies first (the optimizers' large CPU tensors), and ``windows_nbytes`` for the next
    writer's pack windows (0: none)."""
    global _drain, _windows, _optimizer_bytes
    from gpusnap.stage.drain import optimizer_storages

    storages = optimizer_storages(optimizers, knobs.DRAIN_MIN_BYTES)
    steps = []
    if knobs.HUGEPAGES == "on":
        steps.append(hugepages.collapse(storages.items()))
    _optimizer_bytes = sum(storages.values())
    if knobs.DRAIN == "keep":
        try:
            _drain = _reserve(_drain_bytes())
        except StageError:  # said by the snapshot, which reserves again
            _drain = None
        else:
            regions = [_drain]
            if windows_nbytes:
                _windows = _reserve_windows(windows_nbytes)
                regions += [_windows] if _windows is not None else []
            arena = trainee_arena()
            room = arena.tightest_room().room_bytes * 0.5  # never crowd out the trainee
            for region in regions:  # the drain's first: it races the trainee
                adds = region.nbytes - arena.populated(region.offset, region.nbytes)
                if adds <= room:
                    steps.append(arena.populate(region))
                    room -= adds
    _worker.start(itertools.chain(*steps))


def preparing() -> bool:
    """True while the background thread readies memory (what a snapshot's cost includes)."""
    return _worker._thread is not None and not _worker.idle.is_set()


def drain_region() -> Region:
    """The drain region of the snapshot being taken (in the stall): the one reserved ahead when
    it is large enough, else a new one. Raises ``ArenaFull``."""
    global _drain
    region, _drain = _drain, None
    wanted = _drain_bytes()
    if _pending(region) and region.nbytes >= wanted:
        return region
    if not wanted:  # no optimizer has stepped and no drain has run: nothing is known
        return _first_guess()
    _drain = region
    try:
        return _reserve(wanted)
    except ArenaFull:
        if not _other_bytes:
            raise
    # What the last pickler drained besides the optimizers' state may be gone by now; what the
    # optimizers step is what the drain races the trainee for, and what this snapshot needs.
    return _reserve(_optimizer_bytes)


def window_region(stop: bool) -> Region | None:
    """In the stall: a region reserved ahead, whose pages ``prepare`` allocated, for the
    writer's pack windows (``window_memory``), so that the writer allocates and frees no memory
    of its own; None when none is. A stop snapshot drains nothing: its windows are the drain
    region. A periodic one's are the windows region, once a snapshot has filled more than one
    pack (a smaller one's writer touches little of its own windows)."""
    global _drain, _windows
    if stop:
        region, _drain = _drain, None
    else:
        region, _windows = _windows, None
    return region if _pending(region) else None


def window_memory(fd: int, region: Region, nbytes: int) -> memoryview | None:
    """In the writer: the first ``nbytes`` of ``region`` (``window_region``),
    mapped, when the region is that large and every page of that part is allocated (faulting it
    in is then only mapping pages that exist: no allocation for an out-of-memory kill to hit
    while a pack write pins the writer's pages). None otherwise: the windows are its own."""
    if region.nbytes < nbytes:
        return None
    view = writer_view(fd, region.offset, nbytes)
    return view if resident(address_of(view), nbytes) >= nbytes else None


def _drain_bytes() -> int:
    return _optimizer_bytes + _other_bytes


def _first_guess() -> Region:
    """A drain region for a program that gpusnap knows nothing of yet: its resident set, when
    that fits, or none worth the name (this snapshot drains nothing; its writer says how much
    the next one should hold)."""
    import psutil

    try:
        return trainee_arena().reserve(psutil.Process().memory_info().rss, "drain")
    except ArenaFull:
        return trainee_arena().reserve(1, "drain")


def _reserve_windows(nbytes: int) -> Region | None:
    """The next writer's pack windows: the region reserved already for the pending generation,
    else a new one (None when the arena has no room: the writer maps its own)."""
    if _pending(_windows) and _windows.nbytes >= nbytes:
        return _windows
    try:
        return trainee_arena().reserve(nbytes, "windows")
    except StageError:
        return None


def _reserve(nbytes: int) -> Region:
    arena = trainee_arena()
    if _pending(_drain):
        arena.free(_drain)  # replaced by a larger one, maybe at the same offset
    return arena.reserve(max(nbytes, 1), "drain")


def _pending(region: Region | None) -> bool:
    """Whether ``region`` was reserved for the snapshot not taken yet (no fork has sealed it)."""
    arena = made_arena()
    return region is not None and arena is not None and region.generation == arena.pending


def drained(wanted_bytes: int) -> None:
    """A writer's report: its drain wanted ``wanted_bytes`` (with room enough it would have
    copied that much), of which what the optimizers do not step is the pickler's share."""
    global _other_bytes
    _other_bytes = max(0, wanted_bytes - _optimizer_bytes)


def writer_starting() -> int | None:
    """In the stall, just before fork: nothing is prepared from here until ``writer_done``;
    the arena's pending regions become a generation, whose number the writer is given (None
    when no arena was made: the snapshot stages nothing)."""
    _worker.writer_starting()
    arena = made_arena()
    return arena.seal() if arena is not None else None


def writer_done(generation: int | None) -> None:
    """The writer of ``generation`` has exited (or never started): its regions may be reused."""
    arena = made_arena()
    if generation is not None and arena is not None:
        arena.release(generation)
    _worker.writer_done()


def snapshot_skipped() -> None:
    """The snapshot reserved regions but is not taken: give them back."""
    global _drain, _windows
    _drain = _windows = None
    arena = made_arena()
    if arena is not None:
        arena.discard()


def arena_fd() -> int:
    """The arena's memfd for the writer to map its regions from; -1 when there is no arena."""
    arena = made_arena()
    return arena.fd if arena is not None else -1
