"""Reading chunks back, each one checked against its name."""

from __future__ import annotations

import pathlib
import threading
import time

from gpusnap.errors import ChunkCorrupt, ChunkMissing
from gpusnap.store import codec, index
from gpusnap.store.pack import Location, PackReader, pack_path


# Time this process spent reading chunks (the files), decoding them (blosc2) and checking them
# against their names (xxh3), and the bytes they came to: a restart reports its read's parts.
# Summed over the threads that read (store/fetch.py), which adds the wall time of its reads.
TIMES = {"read_s": 0.0, "decode_s": 0.0, "check_s": 0.0, "nbytes": 0, "fetch_s": 0.0}
_times_lock = threading.Lock()
# report_read(nbytes) after every chunk read, when set: a restore sets it to show its progress.
report_read = None


class ChunkProblem(Exception):
    """Internal: why one chunk cannot be read. ``kind`` is a Finding kind."""

    def __init__(self, kind: str, cid: str, pack: str | None, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.cid = cid
        self.pack = pack
        self.message = message


def chunks_of(record, idx: index.Index) -> list[tuple[str, int]]:
    """The ``[(chunk id, raw nbytes)]`` of a manifest's buffer record, each size checked against
    the record's ``nbytes`` and the index before any of them sizes an allocation or a read:
    ChunkProblem ``buffer_damaged`` says what does not agree. A chunk no index names is left
    for ``load_chunk`` to report."""

    def damaged(why: str):
        return ChunkProblem("buffer_damaged", None, None, why)

    if not isinstance(record, dict) or not isinstance(record.get("chunks"), list):
        raise damaged("its record has no list of chunks")
    nbytes = record.get("nbytes")
    if not isinstance(nbytes, int) or isinstance(nbytes, bool) or nbytes < 0:
        raise damaged(f"its size {nbytes!r} is no number of bytes")
    out, total = [], 0
    for entry in record["chunks"]:
        if not isinstance(entry, list) or len(entry) != 2 or not codec.is_digest(entry[0], 32):
            raise damaged(f"chunk entry {entry!r} is not [32 hex digits, size]")
        cid, nb = entry
        if not isinstance(nb, int) or isinstance(nb, bool) or not 0 < nb <= codec.MAX_CHUNK_BYTES:
            raise damaged(f"chunk {cid} claims {nb!r} bytes (a chunk holds 1 to {codec.MAX_CHUNK_BYTES})")
        loc = idx.chunks.get(cid)
        if loc is not None and loc.raw_nbytes != nb:
            raise damaged(f"chunk {cid} is {loc.raw_nbytes} bytes in the index, the manifest says {nb}")
        out.append((cid, nb))
        total += nb
    if total != nbytes:
        raise damaged(f"its chunks hold {total} bytes, its record says {nbytes}")
    return out


def load_chunk(reader: PackReader, idx: index.Index, cid: str, raw_nbytes: int, out: memoryview | None = None) -> memoryview:
    """Decode chunk ``cid`` and check it against its name, or raise ChunkProblem; returns
    ``out``, or when None a buffer allocated once the index, the pack's entry header and the
    stored bytes have agreed on the chunk's size. Compressed bytes are checked against their
    digest before they reach the decompressor."""
    loc: Location | None = idx.chunks.get(cid)
    if loc is None:
        raise ChunkProblem("chunk_unindexed", cid, None, f"chunk {cid} is named by no index file")
    if loc.raw_nbytes != raw_nbytes:
        raise ChunkProblem(
            "chunk_corrupt", cid, loc.pack, f"chunk {cid}: the index says {loc.raw_nbytes} bytes, the manifest {raw_nbytes}"
        )
    started = time.perf_counter()
    try:
        header, stored = reader.read_entry(loc)
    except FileNotFoundError:
        raise ChunkProblem("pack_missing", cid, loc.pack, f"pack {loc.pack} holding chunk {cid} is missing") from None
    except EOFError as exc:
        raise ChunkProblem("pack_truncated", cid, loc.pack, f"pack {loc.pack} is truncated: {exc}") from None
    except OSError as exc:
        raise ChunkProblem("pack_unreadable", cid, loc.pack, f"pack {loc.pack} cannot be read: {exc.strerror}") from None
    read = time.perf_counter()
    try:
        cd, raw, stored_nbytes, hid = codec.parse_header(header)
        if hid != cid or raw != raw_nbytes or stored_nbytes != loc.stored_nbytes or cd != loc.codec:
            raise codec.EntryError("entry header does not match the index")
        if loc.digest is not None and codec.stored_digest(stored) != loc.digest:
            raise codec.EntryError("its stored bytes do not match their digest")
        codec.check_stored(cd, stored, raw_nbytes)
        if out is None:
            out = memoryview(bytearray(raw_nbytes))
        codec.decode_into(cd, stored, out)
    except codec.EntryError as exc:
        raise ChunkProblem("chunk_corrupt", cid, loc.pack, f"chunk {cid} in pack {loc.pack} is damaged: {exc}") from None
    decoded = time.perf_counter()
    got = codec.chunk_id(out)
    with _times_lock:
        TIMES["read_s"] += read - started
        TIMES["decode_s"] += decoded - read
        TIMES["check_s"] += time.perf_counter() - decoded
        TIMES["nbytes"] += raw_nbytes
    if got != cid:
        raise ChunkProblem("chunk_corrupt", cid, loc.pack, f"chunk {cid} in pack {loc.pack} reads back as {got}")
    return out


def read_buffer(rd, record: dict, *, snapshot: str | None = None) -> bytearray:
    """The buffer's raw bytes; ChunkCorrupt / ChunkMissing name the chunk, the pack, the
    snapshot and the object path."""
    idx = getattr(rd, "_read_index", None)
    if idx is None:
        idx = rd._read_index = index.load(rd)
    path = record.get("path") if isinstance(record, dict) else None
    where = f" of {path}" if path else ""
    if snapshot:
        where += f" (snapshot {snapshot})"
    try:
        chunks = chunks_of(record, idx)
    except ChunkProblem as p:
        raise ChunkCorrupt(f"buffer{where} is damaged: {p.message}") from None
    out = bytearray(sum(nb for _, nb in chunks))
    view = memoryview(out)
    reader = PackReader(rd)
    pos = 0
    try:
        for cid, nb in chunks:
            try:
                try:
                    load_chunk(reader, idx, cid, nb, view[pos : pos + nb])
                except ChunkProblem as p:
                    if p.kind not in ("pack_missing", "chunk_unindexed"):
                        raise
                    # gc (a live run's retention) moved the chunk since the index was read
                    idx = rd._read_index = index.load(rd)
                    load_chunk(reader, idx, cid, nb, view[pos : pos + nb])
            except ChunkProblem as p:
                cls = ChunkCorrupt if p.kind in ("chunk_corrupt", "pack_truncated") else ChunkMissing
                raise cls(f"{p.message}{where}") from None
            pos += nb
            if report_read is not None:
                report_read(nb)
    finally:
        reader.close()
    return out


def pack_file(rd, pack_id: str) -> pathlib.Path:
    return pack_path(pathlib.Path(rd.path), pack_id)
