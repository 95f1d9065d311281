"""SnapshotWriter: cuts buffers into chunks, names them, writes the new ones into packs, and
commits index then manifest.

Order of calls: RunDir.begin_snapshot() → put_buffer() any number of times → commit(manifest)
or abort(). It runs inside a forked child of the training program, so it starts no thread of
its own and resets blosc2's pool before compressing with threads.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass

from gpusnap import knobs
from gpusnap.errors import RunDirLocked, StoreError
from gpusnap.store import atomic, codec, index, lock
from gpusnap.store.pack import Location, PackBuilder, pack_key
from gpusnap.store.info import FORMAT_VERSION, SnapshotInfo, utc_now

_MAX_CHUNK_BYTES = codec.MAX_CHUNK_BYTES

# report_progress(bytes_put, bytes_written) after every chunk, when set: a forked writer sets it
# to tell the trainee how far it is (the live status line of a long write).
report_progress = None


@dataclass
class WriterStats:
    bytes_total: int = 0  # raw bytes put
    bytes_new: int = 0  # raw bytes of chunks that were new to the store
    bytes_written: int = 0  # bytes of the pack files this writer wrote
    chunks_total: int = 0
    chunks_new: int = 0
    hash_s: float = 0.0
    compress_s: float = 0.0
    io_s: float = 0.0


def as_bytes_view(data) -> memoryview:
    view = data if isinstance(data, memoryview) else memoryview(data)
    if view.ndim != 1 or view.format not in ("B", "b", "c"):
        if not view.c_contiguous:
            raise StoreError("put_buffer needs a contiguous buffer")
        view = view.cast("B") if view.ndim <= 1 else view.cast("B", (view.nbytes,))
    return view if view.format == "B" else view.cast("B")


class SnapshotWriter:
    def __init__(self, rd, snap_id: str, *, chunk_bytes: int | None = None, pack_bytes: int | None = None,
                 lock_token: str | None = None) -> None:
        import blosc2

        self._rd = rd
        self.snap_id = snap_id
        self._lock_token = lock_token  # of the lock this writer writes under: checked before the commit
        self._index = index.load(rd)
        self._known = self._index.live()  # chunk id -> Location, committed ones in packs that are there
        self._new: dict[str, Location] = {}
        self._packs: dict[str, tuple[int, list[tuple[str, Location]]]] = {}
        self._flush_at = max(1, min(pack_bytes or knobs.PACK_BYTES, knobs.WRITER_WINDOW_BYTES))
        self._chunk_bytes = int(chunk_bytes or knobs.CHUNK_BYTES)
        if not 0 < self._chunk_bytes <= _MAX_CHUNK_BYTES:
            raise StoreError(f"GPUSNAP_CHUNK_BYTES must be between 1 and {_MAX_CHUNK_BYTES}")
        # A stored chunk is never longer than its raw bytes (codec.encode stores raw then).
        self._pack = PackBuilder(self._flush_at + codec.ENTRY_NBYTES + self._chunk_bytes)
        # A forked child inherits blosc2's thread pool state but not its threads.
        blosc2.free_resources()
        self._nthreads = knobs.WRITER_THREADS or (os.cpu_count() or 1)
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
                chunks.append([cid, nbytes])
                n += nbytes
                continue
            piece = as_bytes_view(piece)
            t0 = time.perf_counter()
            cid = codec.chunk_id(piece)
            st.hash_s += time.perf_counter() - t0
            st.chunks_total += 1
            if cid not in self._known and cid not in self._new:
                t0 = time.perf_counter()
                header, stored = codec.encode(cid, piece, dtype, typesize, self._nthreads)
                st.compress_s += time.perf_counter() - t0
                if not self._pack.fits(len(stored)):
                    self._flush_pack()
                self._pack.add(cid, header, stored, len(piece))
                self._new[cid] = None  # located once its pack is written
                st.chunks_new += 1
                st.bytes_new += len(piece)
                if self._pack.nbytes >= self._flush_at:
                    self._flush_pack()
            chunks.append([cid, len(piece)])
            n += len(piece)
            if report_progress is not None:
                report_progress(st.bytes_total + n, st.bytes_written)
        st.bytes_total += n
        return {"nbytes": n, "dtype": dtype, "chunks": chunks}

    def _flush_pack(self) -> None:
        if not len(self._pack):
            return
        t0 = time.perf_counter()
        try:
            pack_id, nbytes, located = self._pack.flush(self._rd)
        except BaseException:
            self.abort()  # a snapshot that lost a pack cannot commit: take back what it wrote
            raise
        self.stats.io_s += time.perf_counter() - t0
        self.stats.bytes_written += nbytes
        self._packs[pack_id] = (nbytes, located)
        for cid, loc in located:
            self._new[cid] = loc

    def commit(self, manifest: dict) -> SnapshotInfo:
        """Flush the last pack, commit the index of the new chunks, then the manifest. Only
        then does the snapshot exist."""
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
            self._flush_pack()
            self._pack.close()
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
            doc = dict(manifest)
            doc.update(format=FORMAT_VERSION, id=self.snap_id, created=created, stats=stats)
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
        return SnapshotInfo.from_manifest(doc)

    def abort(self, remove: bool = True) -> None:
        """Remove what this writer wrote: its index first (so no index names a missing pack),
        then its packs. Committed snapshots are untouched. ``remove=False``: leave it all to gc
        (another writer may name the same packs)."""
        if self._done:
            return
        self._done = True
        if not remove or self._rd.backend.exists(f"snapshots/{self.snap_id}.json"):
            self._pack.close()
            return  # the manifest made it (only the directory fsync failed): it is committed
        try:
            if self._index_name:
                self._rd.backend.delete(f"{index.DIR}/{self._index_name}")
            for pack_id in self._packs:
                self._rd.backend.delete(pack_key(pack_id))
        except Exception:
            pass  # gc removes what is left; the error that made us abort is the one to report
        self._pack.close()


def _json_default(obj):
    if hasattr(obj, "item"):  # numpy / torch scalars in caller-provided fields
        return obj.item()
    if isinstance(obj, (set, tuple)):
        return list(obj)
    raise TypeError(f"{type(obj).__name__} is not JSON serializable")
