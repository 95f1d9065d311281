"""The writer's parallel half: new chunks are encoded by a pool of threads and written as packs by
one more, while the caller hashes the next ones.

    caller     SnapshotWriter.put_chunks: hashes each piece; a chunk new to the store goes to
               ``submit`` (the caller needs chunk ids at once: a buffer's record names them)
    encoders   ``threads`` threads, and any the caller adds later (``add_worker``): each takes a
               chunk, chooses its encoding (``choose.Chooser``), encodes it, claims its place in
               the pack being filled (under the lock) and copies it there (outside it)
    flusher    one thread: writes each full pack (``PackBuilder.flush``, the one place a pack is
               put into storage), while the encoders fill the next. Once a sixteenth of a pack
               has been submitted, it first reserves the other windows (``PackBuilder.reserve``)
               while the encoders fill on: a snapshot too small to need them never allocates
               them, and a large one's first pack does not wait for them (a stop snapshot of
               1 GB waited 40 ms more for its first pack when they were reserved after it). The
               first pack is at most 16 MiB, so that the disk starts as soon as the reservation
               is done. Windows in memory the caller allocated ahead
               (``memory``: the trainee's, ``stage.window_region``) need no reservation.

blosc2 (``blosc2.set_releasegil``) and xxhash release the GIL while they work, so the threads run
on as many cores as the host gives them; blosc2 itself runs single-threaded in each (its own
pool does not survive fork).

Encoders at idle priority (``lowered``: they run ``worker_init`` first) can be starved for seconds
whenever no core is idle, and a starved thread that holds something the others wait for holds
them all back: the pipeline's lock, the GIL, a chunk, a copy into a window not yet written
(tools/results/writer-priority-inversion-cpu-2026-11-29.txt). So such an encoder only encodes: it
leaves the entry in ``_encoded``, and a thread at the caller's priority places it (claims its
place under the lock, copies it outside the lock, with the GIL let go: ``PackBuilder.claim`` and
``fill``). Every thread at the caller's priority that would wait does that first (``_wait``): the
caller for room or for the end, the flusher for a window. A thread added later (``add_worker``:
the pacer's, at normal priority) turns the lowered encoders off (they take no more chunks), and
when it finds no chunk waiting it encodes again one that a lowered encoder holds, the oldest
first: encoding is pure, the first copy placed wins, the other is dropped (also when it comes
while the first waits for a window). Otherwise it waits for a chunk or the end, without a timer:
the writer's watchdog takes a writer whose threads only wake on timers for a hung one.
``finish`` waits for the flusher only: an encoder still starved when every chunk is placed has
nothing left to touch, and ends when it wakes.

Order of calls: ``Pipeline(...)`` → ``submit`` any number of times → ``finish()``, which returns
the packs written, {pack id: (nbytes, [(chunk id, Location)])}, and leaves the pack windows mapped
(``release``); or ``abort()`` at any point, which stops the threads, releases the windows and
returns the packs written so far, for the caller to remove. An error in a thread (a full disk) is
raised by the next ``submit`` or by ``finish``.

Memory: ``windows`` pack windows (one filling, the others written or waiting for the flusher),
and the encoded copies of at most ``2 x threads`` chunks in the encoders' hands; unwindowed
(``PackBuilder``), the compressed entries of as many packs instead of the windows.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import NamedTuple

from gpusnap.store import backend, codec
from gpusnap.store.pack import PackBuilder


_FIRST_PACK_BYTES = 16 << 20


class _Task:
    """One chunk to encode; ``placed`` once its entry has a place in a pack (by whichever of the
    threads that encoded it got there first)."""

    __slots__ = ("cid", "piece", "dtype", "typesize", "stolen", "placed")

    def __init__(self, cid: str, piece, dtype: str, typesize: int) -> None:
        self.cid, self.piece, self.dtype, self.typesize = cid, piece, dtype, typesize
        self.stolen = False
        self.placed = False


class _Encoded(NamedTuple):
    """A chunk's entry, encoded, to be placed."""

    task: _Task
    header: bytes
    stored: object  # the stored bytes: a compressed copy, or the piece itself when raw
    digest: str | None  # ``codec.stored_digest`` of a compressed entry
    codec: str | None  # what it was compressed with, for the chooser's counts (None: raw)
    seconds: float  # encoding it took


class _Stopped(Exception):
    """The pipeline was aborted: a thread ends without touching anything more."""


class Pipeline:
    def __init__(self, root, *, capacity: int, flush_at: int, chooser, threads: int, windows: int = 2,
                 worker_init=None, memory=None, own_windows: bool = True) -> None:
        import blosc2

        blosc2.set_releasegil(True)
        self._root = root
        self._flush_at = flush_at
        # The first pack goes to the disk at 16 MiB (a quarter of the default): the disk then
        # starts once the other windows are reserved, not once a whole window is filled.
        self._first_flush_at = min(flush_at, _FIRST_PACK_BYTES)
        self._handed = 0  # windows handed to the flusher
        self.chooser = chooser
        lock = threading.RLock()
        self._cond = threading.Condition(lock)
        # What encoders wait on: only a new chunk, the end or an error wakes them. A lowered one
        # woken by every placement would take the GIL each time, and could be preempted with it.
        self._ready = threading.Condition(lock)
        self._lowered_off = False  # set by the first ``add_worker``: lowered encoders take no more chunks
        self._tasks: collections.deque = collections.deque()
        self._held: dict[_Task, None] = {}  # taken by a lowered encoder, not yet encoded: oldest first
        self._encoded: collections.deque = collections.deque()  # by lowered encoders, to be placed (``_wait``)
        self._in_hand = 0  # submitted, not yet placed in a pack
        self._max_in_hand = 2 * max(1, threads)
        # A store that copies what it is given (tmpfs) gets each entry where it lies: ``submit``'s
        # pieces are held until ``finish`` anyway, and a compressed entry is its own bytes object.
        windowed = not backend.of(root).copies_on_put("packs")
        windows = max(2, windows)
        # ``memory``: page-aligned memory for the windows (allocated ahead by
        # the trainee), used when it holds them all.
        size = PackBuilder.window_nbytes(capacity)
        if memory is None or len(memory) < self.windows_nbytes(capacity, windows) or not windowed:
            memory = None
        if memory is None and not own_windows:
            windowed = False  # no memory room for windows of its own: each entry from where it lies
        self.windows = "ahead" if memory is not None else "own" if windowed else "none"  # for the manifest
        self._builders = [PackBuilder(capacity, windowed=windowed,
                                      memory=None if memory is None else memory[i * size : (i + 1) * size])
                          for i in range(windows)]
        self._fills = {builder: 0 for builder in self._builders}  # entries claimed in it, not yet copied
        self._filling: PackBuilder | None = self._builders[0]
        self._free = []  # the other windows, once reserved (``_reserve_rest``)
        self._reserve_at = max(1, flush_at // 16)  # bytes submitted that start the reservation
        self._submitted = 0
        self._reserving = False
        self._full: collections.deque = collections.deque()
        self._closing = False
        self.error: BaseException | None = None
        self.packs: dict[str, tuple[int, list]] = {}
        self.done_bytes = 0  # raw bytes of chunks in a pack window
        self.bytes_written = 0
        self.compress_s = 0.0  # summed over the encoders
        self.io_s = 0.0
        self._flusher = threading.Thread(target=self._flush_loop, name="gpusnap-flush", daemon=True)
        self._flusher.start()
        for i in range(max(1, threads)):
            threading.Thread(target=self._work, args=(worker_init, None), name=f"gpusnap-encode-{i}", daemon=True).start()

    @staticmethod
    def windows_nbytes(capacity: int, windows: int = 2) -> int:
        """The memory ``windows`` pack windows of ``capacity`` take."""
        return max(2, windows) * PackBuilder.window_nbytes(capacity)

    # ---- the caller

    def submit(self, cid: str, piece, dtype: str, typesize: int) -> None:
        """Encode and store chunk ``cid``; ``piece`` must hold its bytes until ``finish``."""
        with self._cond:
            while self._in_hand >= self._max_in_hand and self.error is None:
                self._wait()
            if self.error is not None:
                raise self.error
            self._tasks.append(_Task(cid, piece, dtype, typesize))
            self._in_hand += 1
            self._submitted += len(piece)
            if self._submitted >= self._reserve_at:
                self._reserving = True  # the flusher reserves the other windows
            self._ready.notify()
            self._cond.notify_all()

    def add_worker(self, until) -> bool:
        """One more encoder thread, started by (so running at the priority of) the calling
        thread, that ends once ``until()`` is true and takes over chunks starved encoders hold
        (module docstring); False once the pipeline is closing. From the first one on, lowered
        encoders take no more chunks: one was needed because they were starved, and each chunk a
        starved one takes is another chance to be preempted holding the GIL."""
        with self._cond:
            if self._closing:
                return False
            self._lowered_off = True
        threading.Thread(target=self._work, args=(None, until), name="gpusnap-encode-extra", daemon=True).start()
        return True

    def finish(self) -> dict:
        with self._cond:
            while self._in_hand and self.error is None:
                self._wait()
            if self._filling is not None and len(self._filling):
                self._full.append(self._filling)
                self._filling = None
            self._closing = True
            self._wake_all()
        self._join()
        if self.error is not None:
            raise self.error
        return self.packs

    def abort(self) -> dict:
        with self._cond:
            if self.error is None:
                self.error = _Stopped()
            self._closing = True
            self._wake_all()
            while any(self._fills.values()):  # a copy still under way into a window it unmaps
                self._cond.wait()
        self._join()
        self.release()
        return self.packs

    def release(self) -> None:
        """Unmap the pack windows. Not part of ``finish``: unmapping 136 MiB of shared memory
        takes 35-50 ms, which a stop snapshot's commit waited for; a forked writer leaves them to
        its exit, after the commit, and a writer in a long-lived process to the garbage collector."""
        for builder in self._builders:
            builder.close()

    def _join(self) -> None:
        """Wait for the flusher; not for the encoders (module docstring)."""
        if self._flusher is not threading.current_thread():
            self._flusher.join()

    def _fail(self, exc: BaseException) -> None:
        with self._cond:
            if self.error is None:
                self.error = exc
            self._wake_all()

    def _wake_all(self) -> None:
        """The end or an error: every thread waiting looks. Called with the condition held."""
        self._ready.notify_all()
        self._cond.notify_all()

    # ---- the encoders

    def _work(self, init, until) -> None:
        """An encoder: ``init`` lowers its priority (it then leaves its entries to be placed);
        ``until``: an added one, which ends once it is true and takes over starved chunks."""
        lowered = init is not None
        if lowered:
            init()
        while True:
            with self._cond:
                task = self._take(until, lowered)
                if task is None:
                    return
            try:
                entry = self._encode(task)
                if lowered:
                    with self._cond:
                        self._held.pop(task, None)
                        if not task.placed:
                            self._encoded.append(entry)
                            self._cond.notify_all()
                else:
                    self._place(entry)
            except _Stopped:
                return
            except BaseException as exc:  # noqa: BLE001 - the caller raises it
                self._fail(exc)
                return

    def _take(self, until, lowered: bool) -> _Task | None:
        """The next chunk to encode, waiting for one; for an added encoder (``until``), else one a
        lowered encoder holds. None once this thread should end. Called with the condition held."""
        while True:
            if self.error is not None or (until and until()) or (lowered and self._lowered_off):
                if self._tasks:
                    self._ready.notify()  # the wake this thread may have taken was for a chunk: pass it on
                return None
            if self._tasks:
                task = self._tasks.popleft()
                if lowered:  # what a lowered encoder holds may be taken over (it may be starved)
                    self._held[task] = None
                return task
            if until:
                for task in self._held:  # the oldest first; lowered encoders take no more now
                    if not task.stolen:
                        task.stolen = True
                        return task
            if self._closing:
                return None
            self._ready.wait()

    def _wait(self) -> None:
        """Wait on the condition, held by a thread at the caller's priority; but first place an
        entry a lowered encoder left, when the window being filled or a free one has room for it
        (placing never waits here: the flusher, which frees windows, calls this too)."""
        entry = self._encoded[0] if self._encoded else None
        if entry is None or not self._room_for(len(entry.stored)):
            self._cond.wait()
            return
        self._encoded.popleft()
        try:
            claimed = self._claim(entry)
        except _Stopped:
            return
        self._cond.release()
        try:
            self._fill(claimed)
        except BaseException as exc:  # noqa: BLE001 - the caller raises it
            self._fail(exc)
        finally:
            self._cond.acquire()

    def _place(self, entry: _Encoded) -> None:
        """Put an encoded entry in the pack being filled: claim its place under the lock, copy it
        outside it."""
        with self._cond:
            claimed = self._claim(entry)
        self._fill(claimed)

    def _claim(self, entry: _Encoded):
        """Take the entry's place in the window being filled, unless another copy of it has one;
        what ``_fill`` copies. Called with the condition held."""
        task = entry.task
        if task.placed:
            return None
        builder = self._builder_for(len(entry.stored))
        if task.placed:  # placed by another copy while this one waited for a window (it lets go of the lock)
            return None
        offset = builder.claim(task.cid, entry.header, entry.stored, len(task.piece), entry.digest)
        if offset is not None:
            self._fills[builder] += 1
        task.placed = True
        self._held.pop(task, None)
        if builder.nbytes >= (self._flush_at if self._handed else self._first_flush_at):
            self._hand_to_flusher(builder)
        self._in_hand -= 1
        self.done_bytes += len(task.piece)
        self.compress_s += entry.seconds
        self.chooser.stored(entry.codec)
        self._cond.notify_all()
        return None if offset is None else (builder, offset, entry.header, entry.stored)

    def _fill(self, claimed) -> None:
        """Copy a claimed entry into its window, without the lock."""
        if claimed is None:
            return
        builder, offset, header, stored = claimed
        try:
            builder.fill(offset, header, stored)
        finally:
            with self._cond:
                self._fills[builder] -= 1
                self._cond.notify_all()

    def _encode(self, task: _Task) -> _Encoded:
        """The chunk's entry, in the encoding the chooser picks for it (pure: two threads may
        encode one chunk, and the first copy placed wins)."""
        started = time.perf_counter()
        choice = self.chooser.pick(task.piece, task.dtype, task.typesize)
        if choice is None:
            header, stored = codec.encode(task.cid, task.piece, task.dtype, task.typesize, "none")
        else:
            t0 = time.perf_counter()
            header, stored = codec.encode(task.cid, task.piece, task.dtype, task.typesize, choice.codec)
            self.chooser.encoded(choice, len(task.piece), len(stored), time.perf_counter() - t0)
        compressed = header[4] != codec.CODEC_RAW
        return _Encoded(task, header, stored, codec.stored_digest(stored) if compressed else None,
                        choice.codec if choice is not None and header[4] == codec.CODEC_BLOSC2 else None,
                        time.perf_counter() - started)

    def _room_for(self, stored_nbytes: int) -> bool:
        """Whether ``_builder_for`` would return at once. Called with the condition held."""
        return (self._filling is not None and self._filling.fits(stored_nbytes)) or bool(self._free)

    def _builder_for(self, stored_nbytes: int) -> PackBuilder:
        """The window being filled, when the entry fits it; else that one goes to the flusher
        and the next free one is taken (waiting for the flusher to free one). Called with the
        condition held."""
        while True:
            if self.error is not None:
                raise _Stopped()
            builder = self._filling
            if builder is not None and builder.fits(stored_nbytes):
                return builder
            if builder is not None:
                self._hand_to_flusher(builder)
                self._cond.notify_all()
            elif self._free:
                self._filling = self._free.pop()
            else:
                self._cond.wait()

    def _hand_to_flusher(self, builder: PackBuilder) -> None:
        """A full window goes to the flusher. Called with the condition held."""
        self._reserving = True
        self._handed += 1
        self._full.append(builder)
        self._filling = None

    # ---- the flusher

    def _reserve_rest(self) -> bool:
        """Allocate every page of the windows other than the first before the first pack goes to
        the disk: in a memory cgroup too small for them, the out-of-memory kill then comes while
        no O_DIRECT write pins the writer's pages (killed in the middle of one, it kept them
        pinned, and the kernel went on to kill the program). On the flusher's thread, outside the
        condition, while the encoders fill the first window. False after an error."""
        try:
            for builder in self._builders[1:]:
                builder.reserve()
        except BaseException as exc:  # noqa: BLE001 - the caller raises it
            self._fail(exc)
            return False
        with self._cond:
            self._free.extend(self._builders[1:])
            self._cond.notify_all()
        return True

    def _flushable(self) -> bool:
        """A full window whose every claimed entry is copied. Called with the condition held."""
        return bool(self._full) and self._fills[self._full[0]] == 0

    def _reserve_now(self, reserved: bool) -> bool:
        return self._reserving and not reserved and not self._closing

    def _flush_loop(self) -> None:
        reserved = False
        while True:
            with self._cond:
                # Once closing, no encoder needs another window: the last packs go without them.
                while self.error is None and not self._flushable() and not self._reserve_now(reserved) \
                        and not (self._closing and self._in_hand == 0 and not self._full):
                    self._wait()
                if self.error is not None:
                    return
                if self._reserve_now(reserved):
                    builder = None
                elif self._flushable():
                    builder = self._full.popleft()
                else:
                    return
            if builder is None:
                reserved = True
                if not self._reserve_rest():
                    return
                continue
            t0 = time.perf_counter()
            try:
                pack_id, nbytes, located = builder.flush(self._root)
            except BaseException as exc:  # noqa: BLE001 - the caller raises it
                self._fail(exc)
                return
            seconds = time.perf_counter() - t0
            self.chooser.wrote(nbytes, seconds)
            with self._cond:
                self.packs[pack_id] = (nbytes, located)
                self.bytes_written += nbytes
                self.io_s += seconds
                self._free.append(builder)
                self._cond.notify_all()
