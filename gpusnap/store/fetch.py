"""Reading a snapshot's buffers at the disk's speed: a pool of threads reads, checks and decodes
every chunk into its buffer, while the caller unpickles the graph and waits only for the buffer
it needs next.

Order of calls: ``Prefetch(rd, buffers, order)`` (starts reading, ``order`` first) → ``get(name)``
any number of times (the buffer's bytes once all its chunks are in; ChunkCorrupt / ChunkMissing
as ``reader.read_buffer`` raises them) → ``close()`` (stops the threads; ``with`` does it). The
threads use the store's reading verbs only (``reader.load_chunk``: one range of one pack, then its
checks), each with its own ``PackReader``; blosc2 decodes on the calling thread with the GIL
released, so decoding runs on every core as reading does.

``TIMES`` gains ``fetch_s``: the wall time from the start until the last buffer was in (its parts
``read_s``, ``decode_s``, ``check_s`` are summed over the threads).
"""

from __future__ import annotations

import os
import queue
import threading
import time

from gpusnap.errors import ChunkCorrupt, ChunkMissing
from gpusnap.store import index, reader
from gpusnap.store.pack import PackReader


def threads_for() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


class _Buffer:
    __slots__ = ("record", "data", "left", "ready", "problem")

    def __init__(self, record: dict, chunks: list):
        self.record = record
        self.data = bytearray(int(record["nbytes"]))
        self.left = len(chunks)
        self.ready = threading.Event()
        self.problem: reader.ChunkProblem | None = None
        if not self.left:
            self.ready.set()


class Prefetch:
    def __init__(self, rd, buffers: dict, order=(), *, snapshot: str | None = None, threads: int | None = None):
        import blosc2

        blosc2.set_releasegil(True)
        self._rd, self._records, self._snapshot = rd, buffers, snapshot
        idx = getattr(rd, "_read_index", None)
        self._idx = idx if idx is not None else index.load(rd)
        rd._read_index = self._idx
        self._buffers: dict[str, _Buffer] = {}
        self._tasks: queue.SimpleQueue = queue.SimpleQueue()
        self._stop = False
        self._lock = threading.Lock()
        self._started = time.perf_counter()
        self._left = 0
        names = [n for n in order if n in buffers] + [n for n in buffers if n not in set(order)]
        for name in names:
            record = buffers[name]
            try:
                chunks = reader.chunks_of(record, self._idx)  # sizes checked before they allocate
            except reader.ChunkProblem:
                continue  # damaged: ``get`` reads it the checked way and says so
            buf = self._buffers[name] = _Buffer(record, chunks)
            pos = 0
            for cid, nb in chunks:
                self._tasks.put((buf, cid, nb, pos))
                self._left += 1
                pos += nb
        n = max(1, min(threads or threads_for(), self._left))
        self._threads = [threading.Thread(target=self._work, name=f"gpusnap-fetch-{i}", daemon=True) for i in range(n)]
        for _ in self._threads:
            self._tasks.put(None)
        for t in self._threads:
            t.start()

    def get(self, name: str) -> bytearray:
        buf = self._buffers.get(name)
        if buf is None:
            return reader.read_buffer(self._rd, self._records[name], snapshot=self._snapshot)
        buf.ready.wait()
        if buf.problem is not None and buf.problem.kind in ("pack_missing", "chunk_unindexed"):
            # gc (a live run's retention) may have moved the chunk since the index was read:
            # the one-thread path reads the index again and says what is missing if it still is.
            return reader.read_buffer(self._rd, self._records[name], snapshot=self._snapshot)
        if buf.problem is not None:
            p = buf.problem
            path = buf.record.get("path")
            where = (f" of {path}" if path else "") + (f" (snapshot {self._snapshot})" if self._snapshot else "")
            cls = ChunkCorrupt if p.kind in ("chunk_corrupt", "pack_truncated") else ChunkMissing
            raise cls(f"{p.message}{where}")
        return buf.data

    def close(self) -> None:
        self._stop = True
        for t in self._threads:
            t.join()

    def __enter__(self) -> "Prefetch":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _work(self) -> None:
        pack_reader = PackReader(self._rd)
        try:
            while not self._stop:
                task = self._tasks.get()
                if task is None:
                    return
                buf, cid, nb, pos = task
                if buf.problem is None:
                    try:
                        with memoryview(buf.data) as view:
                            reader.load_chunk(pack_reader, self._idx, cid, nb, view[pos : pos + nb])
                    except reader.ChunkProblem as p:
                        buf.problem = p
                    if reader.report_read is not None:
                        reader.report_read(nb)
                with self._lock:
                    buf.left -= 1
                    if not buf.left:
                        buf.ready.set()
                    self._left -= 1
                    if not self._left:
                        reader.TIMES["fetch_s"] += time.perf_counter() - self._started
        finally:
            pack_reader.close()
