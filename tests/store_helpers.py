"""Shared helpers for the store tests: a run directory with known content."""

from __future__ import annotations

import hashlib
import pathlib

from gpusnap.store import RunDir
from gpusnap.store.writer import WriterSetup

IDENTITY = {"command": {"kind": "script", "target": "train.py", "args": ["--epochs", "3"]}, "cwd": "/w"}
# One encoder thread and ZSTD: the chunks of a snapshot lie in its packs in the order of their
# buffers, and the damage tests' layouts (which pack holds what) do not change with the machine's
# load (tests/store/test_store_pipeline.py covers many threads and the codec chosen per chunk).
SMALL = {"chunk_bytes": 64 << 10, "pack_bytes": 256 << 10, "codec": "zstd", "setup": WriterSetup(threads=1)}


def payload(seed: int, nbytes: int) -> bytes:
    """Deterministic bytes that compress a little, like weights."""
    out = bytearray()
    i = 0
    while len(out) < nbytes:
        block = hashlib.sha256(f"{seed}:{i}".encode()).digest()
        out += block[:24] + bytes(8)
        i += 1
    return bytes(out[:nbytes])


def snap(rd: RunDir, buffers: dict[str, bytes], **extra) -> tuple[str, dict]:
    sid = rd.next_snapshot_id()
    w = rd.begin_snapshot(sid, **SMALL)
    recs = {}
    for name, data in buffers.items():
        rec = w.put_buffer(data, dtype="float32", typesize=4)
        rec.update(kind="torch", path=f"frame[1].locals.{name}")
        recs[name] = rec
    w.commit({"buffers": recs, **extra})
    return sid, recs


def make_run(tmp_path: pathlib.Path, n: int = 3) -> tuple[RunDir, list[tuple[str, dict, dict[str, bytes]]]]:
    """A run directory with n snapshots; each changes buffer 'b' and keeps buffer 'a'."""
    rd = RunDir.create(tmp_path / "run", IDENTITY)
    out = []
    a = payload(0, 300_000)
    for k in range(n):
        bufs = {"a": a, "b": payload(100 + k, 200_000)}
        sid, recs = snap(rd, bufs, iteration=10 * (k + 1))
        out.append((sid, recs, bufs))
    return rd, out


def packs_of(rd: RunDir, recs: dict, name: str) -> list[pathlib.Path]:
    from gpusnap.store import index
    from gpusnap.store.pack import pack_path

    idx = index.load(rd.path)
    return [pack_path(rd.path, idx.chunks[c].pack) for c, _ in recs[name]["chunks"]]


def only_in(rd: RunDir, recs: dict, name: str) -> pathlib.Path:
    """A pack that holds a chunk of this snapshot's buffer ``name`` and nothing older."""
    return packs_of(rd, recs, name)[-1]
