"""The writer's parallel half: new chunks are encoded by a pool of threads and written as packs by
one more, while the caller hashes the next ones.

    caller     SnapshotWriter.put_chunks: hashes each piece; a chunk new to the store goes to
               ``submit`` (the caller needs chunk ids at once: a buffer's record names them)
    encoders   ``threads`` threads, and any the caller adds later (``add_worker``): each takes a
               chunk, chooses its encoding (``choose.Chooser``), encodes it and appends it to the
               pack being filled
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

from gpusnap.store import backend, codec
from gpusnap.store.pack import PackBuilder


_FIRST_PACK_BYTES = 16 << 20


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
        self._cond = threading.Condition()
        self._tasks: collections.deque = collections.deque()
        self._in_hand = 0  # submitted, not yet in a pack window
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
        self._threads = [threading.Thread(target=self._flush_loop, name="gpusnap-flush", daemon=True)]
        for i in range(max(1, threads)):
            self._threads.append(threading.Thread(target=self._work, args=(worker_init, None), name=f"gpusnap-encode-{i}",
                                                  daemon=True))
        for t in self._threads:
            t.start()

    @staticmethod
    def windows_nbytes(capacity: int, windows: int = 2) -> int:
        """The memory ``windows`` pack windows of ``capacity`` take."""
        return max(2, windows) * PackBuilder.window_nbytes(capacity)

    # ---- the caller

    def submit(self, cid: str, piece, dtype: str, typesize: int) -> None:
        """Encode and store chunk ``cid``; ``piece`` must hold its bytes until ``finish``."""
        with self._cond:
            while self._in_hand >= self._max_in_hand and self.error is None:
                self._cond.wait()
            if self.error is not None:
                raise self.error
            self._tasks.append((cid, piece, dtype, typesize))
            self._in_hand += 1
            self._submitted += len(piece)
            if self._submitted >= self._reserve_at:
                self._reserving = True  # the flusher reserves the other windows
            self._cond.notify_all()

    def add_worker(self, until) -> bool:
        """One more encoder thread, started by (so running at the priority of) the calling
        thread, that ends once ``until()`` is true; False once the pipeline is closing."""
        thread = threading.Thread(target=self._work, args=(None, until), name="gpusnap-encode-extra", daemon=True)
        with self._cond:
            if self._closing:
                return False
            thread.start()  # under the condition: ``_join`` never meets a thread not yet started
            self._threads.append(thread)
        return True

    def finish(self) -> dict:
        with self._cond:
            while self._in_hand and self.error is None:
                self._cond.wait()
            if self._filling is not None and len(self._filling):
                self._full.append(self._filling)
                self._filling = None
            self._closing = True
            self._cond.notify_all()
        self._join()
        if self.error is not None:
            raise self.error
        return self.packs

    def abort(self) -> dict:
        with self._cond:
            if self.error is None:
                self.error = _Stopped()
            self._closing = True
            self._cond.notify_all()
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
        for t in list(self._threads):
            if t is not threading.current_thread():
                t.join()

    def _fail(self, exc: BaseException) -> None:
        with self._cond:
            if self.error is None:
                self.error = exc
            self._cond.notify_all()

    # ---- the encoders

    def _work(self, init, until) -> None:
        if init is not None:
            init()
        while True:
            with self._cond:
                while not self._tasks and not self._closing and self.error is None and not (until and until()):
                    self._cond.wait(0.05 if until else None)
                if self.error is not None or (until and until()) or not self._tasks:
                    return
                cid, piece, dtype, typesize = self._tasks.popleft()
            try:
                t0 = time.perf_counter()
                header, stored = self._encode(cid, piece, dtype, typesize)
                digest = codec.stored_digest(stored) if header[4] != codec.CODEC_RAW else None
                spent = time.perf_counter() - t0
                with self._cond:
                    builder = self._builder_for(len(stored))
                    builder.add(cid, header, stored, len(piece), digest)
                    if builder.nbytes >= (self._flush_at if self._handed else self._first_flush_at):
                        self._hand_to_flusher(builder)
                    self._in_hand -= 1
                    self.done_bytes += len(piece)
                    self.compress_s += spent
                    self._cond.notify_all()
            except _Stopped:
                return
            except BaseException as exc:  # noqa: BLE001 - the caller raises it
                self._fail(exc)
                return

    def _encode(self, cid: str, piece, dtype: str, typesize: int) -> tuple[bytes, bytes]:
        choice = self.chooser.pick(piece, dtype, typesize)
        if choice is None:
            header, stored = codec.encode(cid, piece, dtype, typesize, "none")
        else:
            t0 = time.perf_counter()
            header, stored = codec.encode(cid, piece, dtype, typesize, choice.codec)
            self.chooser.encoded(choice, len(piece), len(stored), time.perf_counter() - t0)
        self.chooser.stored(choice.codec if choice is not None and header[4] == codec.CODEC_BLOSC2 else None)
        return header, stored

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

    def _flush_loop(self) -> None:
        reserved = False
        while True:
            with self._cond:
                while not self._full and not (self._reserving and not reserved) \
                        and not (self._closing and self._in_hand == 0) and self.error is None:
                    self._cond.wait()
                if self.error is not None:
                    return
                # Once closing, no encoder needs another window: the last packs go without them.
                reserve = self._reserving and not reserved and not self._closing
                if not reserve and not self._full:
                    return
                builder = None if reserve else self._full.popleft()
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
