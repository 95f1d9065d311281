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


def load_chunk(reader: PackReader, idx: index.Index, cid: str, raw_nbytes: int, out: memoryview) -> None:
    """Decode chunk ``cid`` into ``out`` and check it against its name, or raise ChunkProblem."""
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
        if hid != cid or raw != raw_nbytes or stored_nbytes != loc.stored_nbytes:
            raise codec.EntryError("entry header does not match the index")
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


def read_buffer(rd, record: dict, *, snapshot: str | None = None) -> bytearray:
    """The buffer's raw bytes; ChunkCorrupt / ChunkMissing name the chunk, the pack, the
    snapshot and the object path."""
    idx = getattr(rd, "_read_index", None)
    if idx is None:
        idx = rd._read_index = index.load(rd.path)
    out = bytearray(int(record["nbytes"]))
    view = memoryview(out)
    reader = PackReader(pathlib.Path(rd.path))
    where = f" of {record['path']}" if record.get("path") else ""
    if snapshot:
        where += f" (snapshot {snapshot})"
    if sum(nb for _, nb in record["chunks"]) != len(out):
        raise ChunkCorrupt(f"buffer{where}: its chunks do not add up to {len(out)} bytes")
    pos = 0
    try:
        for cid, nb in record["chunks"]:
            try:
                load_chunk(reader, idx, cid, nb, view[pos : pos + nb])
            except ChunkProblem as p:
                cls = ChunkCorrupt if p.kind in ("chunk_corrupt", "pack_truncated") else ChunkMissing
                raise cls(f"{p.message}{where}") from None
            pos += nb
            if report_read is not None:
                report_read(nb)
    finally:
        reader.close()
    if pos != len(out):
        raise ChunkCorrupt(f"buffer{where} has chunks for {pos} bytes, expected {len(out)}")
    return out


def pack_file(rd, pack_id: str) -> pathlib.Path:
    return pack_path(pathlib.Path(rd.path), pack_id)
