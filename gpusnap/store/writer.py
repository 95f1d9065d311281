"""SnapshotWriter: cuts buffers into chunks, names them, writes the new ones into packs, and
commits index then manifest.

Order of calls: RunDir.begin_snapshot() → put_buffer() any number of times → commit(manifest)
or abort(). The caller's thread hashes every chunk; new ones are encoded and written by the
threads of a ``pipeline.Pipeline``, started at the first new chunk (so a writer that stores
nothing new starts none), each running blosc2 on one thread (its own pool does not survive the
fork the writer runs in).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from typing import Callable

from gpusnap import atomic, knobs
from gpusnap.errors import RunDirLocked, StoreError
from gpusnap.store import codec, index, lock
from gpusnap.store.info import FORMAT_VERSION, SnapshotInfo, utc_now
from gpusnap.store.pack import Location, pack_key
from gpusnap.store.pipeline import Pipeline

_MAX_CHUNK_BYTES = codec.MAX_CHUNK_BYTES


@dataclass
class WriterSetup:
    """How one writer runs, beside the knobs. A forked writer fills it in before
    ``begin_snapshot`` (``capture/writer/process.py``); any other writer (tests, tools) takes the
    defaults."""

    threads: int = 0  # encoder threads (0: knobs.WRITER_THREADS, else one per core)
    encoder_init: Callable[[], None] | None = None  # each encoder thread runs it first (to lower its own priority)
    # Memory for the pack windows: pages the trainee allocated ahead (``stage.window_memory``),
    # so that the writer allocates none. None: the pipeline maps its own, unless ``own_windows``
    # is False (no memory room for them): its packs then go to the store from where each entry
    # lies, through the page cache, as on tmpfs.
    window_memory: memoryview | None = None
    own_windows: bool = True
    # (bytes put, bytes written) after every chunk: a forked writer tells the trainee how far it
    # is (the live status line of a long write).
    report_progress: Callable[[int, int], None] | None = None


def windows_nbytes(pack_bytes: int | None = None, chunk_bytes: int | None = None) -> int:
    """What the pipeline's pack windows take (``WriterSetup.window_memory`` must hold that much)."""
    return Pipeline.windows_nbytes(_pack_capacity(_flush_at(pack_bytes), int(chunk_bytes or knobs.CHUNK_BYTES)))


def _flush_at(pack_bytes: int | None) -> int:
    # Two windows (one filling while the other is written) within WRITER_WINDOW_BYTES.
    return max(1, min(pack_bytes or knobs.PACK_BYTES, knobs.WRITER_WINDOW_BYTES // 2))


def _pack_capacity(flush_at: int, chunk_bytes: int) -> int:
    # A stored chunk is never longer than its raw bytes (codec.encode stores raw then).
    return flush_at + codec.ENTRY_NBYTES + chunk_bytes


@dataclass
class WriterStats:
    bytes_total: int = 0  # raw bytes put
    bytes_new: int = 0  # raw bytes of chunks that were new to the store
    bytes_written: int = 0  # bytes of the pack files this writer wrote
    chunks_total: int = 0
    chunks_new: int = 0
    hash_s: float = 0.0
    compress_s: float = 0.0  # summed over the encoder threads
    io_s: float = 0.0  # the pack writes, on the flusher thread
    bytes_known: int = 0  # raw bytes of chunks the store had: done once hashed


def as_bytes_view(data) -> memoryview:
    view = data if isinstance(data, memoryview) else memoryview(data)
    if view.ndim != 1 or view.format not in ("B", "b", "c"):
        if not view.c_contiguous:
            raise StoreError("put_buffer needs a contiguous buffer")
        view = view.cast("B") if view.ndim <= 1 else view.cast("B", (view.nbytes,))
    return view if view.format == "B" else view.cast("B")


class SnapshotWriter:
    def __init__(self, rd, snap_id: str, *, chunk_bytes: int | None = None, pack_bytes: int | None = None,
                 codec: str | None = None, lock_token: str | None = None, setup: WriterSetup | None = None) -> None:
        import blosc2

        self._rd = rd
        self.snap_id = snap_id
        self._lock_token = lock_token  # of the lock this writer writes under: checked before the commit
        self._index = index.load(rd)
        self._known = self._index.live()  # chunk id -> Location, committed ones in packs that are there
        self._new: dict[str, Location] = {}
        self._packs: dict[str, tuple[int, list[tuple[str, Location]]]] = {}
        self._flush_at = _flush_at(pack_bytes)
        self._chunk_bytes = int(chunk_bytes or knobs.CHUNK_BYTES)
        if not 0 < self._chunk_bytes <= _MAX_CHUNK_BYTES:
            raise StoreError(f"GPUSNAP_CHUNK_BYTES must be between 1 and {_MAX_CHUNK_BYTES}")
        # A forked child inherits blosc2's thread pool state but not its threads.
        blosc2.free_resources()
        self._setup = setup or WriterSetup()
        self._nthreads = self._setup.threads or knobs.WRITER_THREADS or (os.cpu_count() or 1)
        self._codec = codec or knobs.CODEC
        self._pipeline: Pipeline | None = None
        self._disk_prior = _measured_disk_bps(rd)
        self._index_name: str | None = None
        self._done = False
        self.stats = WriterStats()

    def put_buffer(self, data, *, dtype: str, typesize: int) -> dict:
        """Store one buffer; return its record {"nbytes", "dtype", "chunks": [[id, nbytes]]}."""
        view = as_bytes_view(data)
        return self.put_chunks([view[start : start + self._chunk_bytes] for start in range(0, len(view), self._chunk_bytes)],
                               dtype=dtype, typesize=typesize)

    def put_chunks(self, pieces, *, dtype: str, typesize: int) -> dict:
        """Store one buffer given chunk by chunk, as ``put_buffer`` cuts it: each piece is the
        chunk's bytes, or ``(id, nbytes)`` of a chunk the store holds already (device memory
        whose fingerprint did not change: neither copied nor rewritten)."""
        if self._done:
            raise StoreError("put_buffer after commit or abort")
        chunks = []
        st = self.stats
        n = 0
        for piece in pieces:
            if isinstance(piece, tuple):
                cid, nbytes = piece
                if cid not in self._known and cid not in self._new:
                    raise StoreError(f"chunk {cid} is reused but this store does not hold it")
                st.chunks_total += 1
                st.bytes_known += nbytes
                st.bytes_total += nbytes
                chunks.append([cid, nbytes])
                n += nbytes
                continue
            piece = as_bytes_view(piece)
            t0 = time.perf_counter()
            cid = codec.chunk_id(piece)
            st.hash_s += time.perf_counter() - t0
            st.chunks_total += 1
            if cid not in self._known and cid not in self._new:
                self._new[cid] = None  # located once its pack is written
                try:
                    self._start().submit(cid, piece, dtype, typesize)
                except BaseException:
                    self.abort()  # a snapshot that lost a pack cannot commit: take back what it wrote
                    raise
                st.chunks_new += 1
                st.bytes_new += len(piece)
            else:
                st.bytes_known += len(piece)
            chunks.append([cid, len(piece)])
            n += len(piece)
            st.bytes_total += len(piece)  # piece by piece: the pacer's line counts what is put (``progress``)
            if self._setup.report_progress is not None:
                self._setup.report_progress(st.bytes_total, self._pipeline.bytes_written if self._pipeline else 0)
        return {"nbytes": n, "dtype": dtype, "chunks": chunks}

    def _start(self) -> Pipeline:
        if self._pipeline is None:
            from gpusnap.store.choose import Chooser

            forced = None if self._codec == "auto" else self._codec
            chooser = Chooser(self._nthreads, self._disk_prior, forced)
            self._pipeline = Pipeline(self._rd, capacity=_pack_capacity(self._flush_at, self._chunk_bytes),
                                      flush_at=self._flush_at, chooser=chooser, threads=self._nthreads,
                                      worker_init=self._setup.encoder_init, memory=self._setup.window_memory,
                                      own_windows=self._setup.own_windows)
        return self._pipeline

    @property
    def windows(self) -> str | None:
        """Where the pipeline's pack windows are: "ahead" (``WriterSetup.window_memory``), "own" (mapped by
        the pipeline), "none" (a store that copies what it is given has none, nor a writer
        without room for its own); None before the first new chunk."""
        return self._pipeline.windows if self._pipeline is not None else None

    def disk_bps(self) -> float:
        """The disk's write speed as this writer knows it: measured by its own packs, else by
        the run's last snapshot, else a guess."""
        from gpusnap.store.choose import DISK_BPS_GUESS

        if self._pipeline is not None:
            return self._pipeline.chooser.disk_bps
        return self._disk_prior or DISK_BPS_GUESS

    def progress(self) -> tuple[int, int]:
        """(raw bytes done, raw bytes put): a chunk is done once it is in a pack window, or
        once hashed when the store had it."""
        done = self.stats.bytes_known + (self._pipeline.done_bytes if self._pipeline else 0)
        return done, self.stats.bytes_total

    def add_encoder(self, until) -> bool:
        """One more encoder thread at the calling thread's priority, until ``until()``; False
        when the pipeline has not started (no new chunk yet: nothing to encode). Another thread
        than the caller's may call this: only the caller's thread starts the pipeline."""
        pipeline = self._pipeline
        return pipeline is not None and pipeline.add_worker(until)

    def _finish_packs(self) -> None:
        if self._pipeline is None:
            return
        try:
            self._packs = self._pipeline.finish()
        finally:
            p = self._pipeline
            self.stats.compress_s, self.stats.io_s, self.stats.bytes_written = p.compress_s, p.io_s, p.bytes_written
        for _, located in self._packs.values():
            for cid, loc in located:
                self._new[cid] = loc

    def commit(self, manifest: dict, stamp=None) -> SnapshotInfo:
        """Wait for the pipeline's packs, commit the index of the new chunks, then the manifest.
        Only then does the snapshot exist. ``stamp(doc)``, when given, is called just before the
        manifest is written (the times that end there)."""
        if self._done:
            raise StoreError("commit after commit or abort")
        buffers = manifest.get("buffers")
        if not isinstance(buffers, dict):
            raise StoreError("a manifest needs a 'buffers' table")
        for name, rec in buffers.items():
            total = 0
            for cid, nb in rec["chunks"]:
                if cid not in self._known and cid not in self._new:
                    raise StoreError(f"buffer {name!r} names chunk {cid}, which this store does not hold")
                total += nb
            if total != rec["nbytes"]:
                raise StoreError(f"buffer {name!r}: chunks hold {total} bytes, record says {rec['nbytes']}")
        try:
            self._finish_packs()
            created = utc_now()
            if self._packs:
                self._index_name = index.write(self._rd, self.snap_id, self._packs, created)
            st = self.stats
            stats = dict(manifest.get("stats") or {})
            stats.update(
                bytes_total=st.bytes_total,
                bytes_new=st.bytes_new,
                bytes_written=st.bytes_written,
                chunks_total=st.chunks_total,
                chunks_new=st.chunks_new,
                compression_ratio=round(st.bytes_new / st.bytes_written, 4) if st.bytes_written else None,
                dedup_ratio=round(st.bytes_total / st.bytes_new, 4) if st.bytes_new else None,
            )
            if self._pipeline is not None:
                chooser = self._pipeline.chooser
                stats["codecs"] = dict(chooser.counts)
                if chooser.measured_disk:
                    stats["disk_bps"] = round(chooser.disk_bps)
            doc = dict(manifest)
            doc.update(format=FORMAT_VERSION, id=self.snap_id, created=created, stats=stats)
            if stamp is not None:
                stamp(doc)
            data = json.dumps(doc, indent=1, allow_nan=False, default=_json_default).encode()
            lock.check_token(self._rd.path, self._lock_token)
            try:
                self._rd.backend.commit(f"snapshots/{self.snap_id}.json", data)
            except atomic.FileExists:
                raise atomic.FileExists(f"snapshot {self.snap_id} already exists; committed snapshots are never rewritten") from None
        except (RunDirLocked, atomic.FileExists):
            # Another writer holds the directory, or committed this id: this one is not alone,
            # and a pack of its own may be that writer's too (same bytes, same name).
            self.abort(remove=False)
            raise
        except BaseException:
            self.abort()
            raise
        self._done = True
        return SnapshotInfo.from_manifest(doc)  # the windows go with the writer (a forked one exits)

    def abort(self, remove: bool = True) -> None:
        """Remove what this writer wrote: its index first (so no index names a missing pack),
        then its packs. Committed snapshots are untouched. ``remove=False``: leave it all to gc
        (another writer may name the same packs)."""
        if self._done:
            return
        self._done = True
        if self._pipeline is not None:
            self._packs.update(self._pipeline.abort())  # its threads stop; what they wrote goes below
        if not remove or self._rd.backend.exists(f"snapshots/{self.snap_id}.json"):
            return  # the manifest made it (only the directory fsync failed): it is committed
        try:
            if self._index_name:
                self._rd.backend.delete(f"{index.DIR}/{self._index_name}")
            for pack_id in self._packs:
                self._rd.backend.delete(pack_key(pack_id))
        except Exception:
            pass  # gc removes what is left; the error that made us abort is the one to report


def _json_default(obj):
    if hasattr(obj, "item"):  # numpy / torch scalars in caller-provided fields
        return obj.item()
    if isinstance(obj, (set, tuple)):
        return list(obj)
    raise TypeError(f"{type(obj).__name__} is not JSON serializable")


def _measured_disk_bps(rd) -> float | None:
    """What the newest snapshot's writer measured of this directory's disk, or None."""
    try:
        ids = rd.snapshot_ids()
        return float(rd.load_manifest(ids[-1]).get("stats", {}).get("disk_bps") or 0) or None if ids else None
    except Exception:  # noqa: BLE001 - a guess: a damaged manifest only means no measurement
        return None
