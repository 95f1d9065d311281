"""verify: read every chunk a snapshot needs and say exactly what is wrong; newest_intact: the
snapshot a restart should use."""

from __future__ import annotations

import os
import pathlib
from dataclasses import asdict, dataclass

from gpusnap.errors import FormatVersionError, SnapshotNotFound, StoreError
from gpusnap import atomic
from gpusnap.store import index, pack
from gpusnap.store.pack import PackReader, list_packs  # noqa: F401  (list_packs: re-exported)
from gpusnap.store.info import AFTER, SnapshotInfo
from gpusnap.store.reader import ChunkProblem, chunks_of, load_chunk

# Finding kinds, worst first when one snapshot has several.
KINDS = (
    "manifest_damaged",  # the manifest file does not parse
    "index_damaged",  # an index file does not parse (snapshot is None)
    "chunk_unindexed",  # a manifest names a chunk that no index names (index missing or stale)
    "pack_missing",  # an index names a pack file that is gone
    "pack_truncated",  # a pack ends before one of its chunks does
    "pack_unreadable",  # the OS refused to read a pack
    "chunk_corrupt",  # a chunk's bytes do not match its name, or its header its index entry
    "buffer_damaged",  # a buffer record's chunk sizes do not add up to its nbytes
)


@dataclass
class Finding:
    kind: str
    snapshot: str | None
    chunk: str | None
    pack: str | None
    path: str | None  # object path of the first buffer that uses the chunk
    message: str
    buffer: str | None = None

    def to_json(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        where = f"snapshot {self.snapshot}" if self.snapshot else "store"
        obj = f" [{self.path}]" if self.path else (f" [buffer {self.buffer}]" if self.buffer else "")
        return f"{where}: {self.kind}: {self.message}{obj}"


def verify(rd, snap_id: str | None = None) -> list[Finding]:
    """Read and check every chunk of one snapshot (or of all of them)."""
    root = rd.path
    idx = index.load(rd)
    findings = [
        Finding("index_damaged", None, None, None, None, f"index file {name} cannot be read: {why}")
        for name, why in idx.unreadable
    ]
    ids = rd.snapshot_ids()
    if snap_id is not None:
        if snap_id not in ids:
            raise SnapshotNotFound(f"no snapshot {snap_id} in {root}")
        ids = [snap_id]
    checked: dict[str, ChunkProblem | None] = {}
    reader = PackReader(rd)
    try:
        for sid in ids:
            found = _verify_one(rd, idx, reader, sid, checked)
            if found:
                # A run's retention may have pruned this snapshot, or moved its chunks (gc's
                # repacking), since the index was read: readers take no lock. Damage is what
                # a second look, at the index as it is now, still finds.
                if not rd.backend.exists(f"snapshots/{sid}.json"):
                    continue
                idx, checked = index.load(rd), {}
                found = _verify_one(rd, idx, reader, sid, checked)
            findings.extend(found)
    finally:
        reader.close()
    return findings


def _verify_one(rd, idx, reader, sid: str, checked: dict) -> list[Finding]:
    try:
        m = rd.load_manifest(sid)
    except FormatVersionError:
        raise
    except StoreError as exc:
        return [Finding("manifest_damaged", sid, None, None, None, exc.message)]
    out: list[Finding] = []
    reported: set[str] = set()
    for name, rec in sorted(m["buffers"].items()):
        path = rec.get("path") if isinstance(rec, dict) and isinstance(rec.get("path"), str) else None
        try:
            chunks = chunks_of(rec, idx)
        except ChunkProblem as p:
            out.append(Finding("buffer_damaged", sid, None, None, path, f"buffer {name} is damaged: {p.message}", name))
            continue
        for cid, nb in chunks:
            if cid not in checked:
                try:
                    load_chunk(reader, idx, cid, nb)
                    checked[cid] = None
                except ChunkProblem as p:
                    checked[cid] = p
            p = checked[cid]
            if p is not None and cid not in reported:
                reported.add(cid)
                out.append(Finding(p.kind, sid, cid, p.pack, path, p.message, name))
    return out


def newest_intact(rd):
    """(newest snapshot that verifies, [(id, why) for each newer one skipped])."""
    skipped: list[tuple[str, str]] = []
    for sid in reversed(rd.snapshot_ids()):
        found = [f for f in verify(rd, sid) if f.snapshot == sid]
        if not found:
            m = rd.load_manifest(sid)
            return SnapshotInfo.from_manifest(m), skipped
        more = f" (and {len(found) - 1} more problems)" if len(found) > 1 else ""
        skipped.append((sid, f"{found[0].kind}: {found[0].message}{more}"))
    return None, skipped


@dataclass
class Leftover:
    """Not damage: files that gc removes (temp files of killed writers, packs no index names)."""

    kind: str  # "temp_file" | "unindexed_pack"
    path: str


def leftovers(rd) -> list[Leftover]:
    root = pathlib.Path(rd.path)
    out = []
    # An object store has no temp files: its puts are whole or nothing.
    for dirpath, dirs, files in os.walk(root) if rd.local else ():
        if dirpath == str(root):
            dirs[:] = [d for d in dirs if not d.startswith(AFTER)]  # the program's files a restart moved aside
        for name in files:
            if atomic.is_temp(name):
                out.append(Leftover("temp_file", str(pathlib.Path(dirpath, name).relative_to(root))))
    idx = index.load(rd)
    for pack_id, key in list_packs(rd):
        if pack_id not in idx.packs and pack.unknown_version(rd, key) is None:
            out.append(Leftover("unindexed_pack", key))
    return out
