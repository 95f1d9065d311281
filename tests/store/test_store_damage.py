"""The damage table: each case damages a run directory one way and asserts exactly what
verify reports, what newest_intact() falls back to, and what reading raises."""

from __future__ import annotations

import errno
import json
import os

import pytest

from gpusnap.errors import ChunkCorrupt, ChunkMissing, NoSpace, RunDirPermission, StoreError
from gpusnap import atomic
from gpusnap.store import index
from gpusnap.store.check import leftovers
from gpusnap.store.codec import ENTRY_NBYTES
from gpusnap.store.pack import pack_path
from store_helpers import make_run, payload, snap


def _loc(rd, cid):
    return index.load(rd.path).chunks[cid]


def _kinds(findings):
    return [(f.kind, f.snapshot, f.chunk, f.path) for f in findings]


def test_intact_run_verifies(tmp_path):
    rd, snaps = make_run(tmp_path)
    assert rd.verify() == []
    info, skipped = rd.newest_intact()
    assert (info.id, skipped) == ("000003", [])
    for sid, recs, bufs in snaps:
        for name, data in bufs.items():
            assert rd.read_buffer(recs[name]) == data


def test_flipped_byte_in_pack(tmp_path):
    rd, snaps = make_run(tmp_path)
    sid, recs, _ = snaps[-1]
    cid = recs["b"]["chunks"][1][0]
    loc = _loc(rd, cid)
    path = pack_path(rd.path, loc.pack)
    raw = bytearray(path.read_bytes())
    raw[loc.offset + ENTRY_NBYTES + loc.stored_nbytes // 2] ^= 0x40
    path.write_bytes(raw)

    findings = rd.verify()
    assert _kinds(findings) == [("chunk_corrupt", "000003", cid, "frame[1].locals.b")]
    assert findings[0].pack == loc.pack
    info, skipped = rd.newest_intact()
    assert info.id == "000002"
    assert [s for s, _ in skipped] == ["000003"] and skipped[0][1].startswith("chunk_corrupt: chunk " + cid)
    with pytest.raises(ChunkCorrupt, match=f"chunk {cid} in pack {loc.pack}.* of frame\\[1\\].locals.b"):
        rd.read_buffer(recs["b"])
    assert rd.read_buffer(snaps[1][1]["b"]) == snaps[1][2]["b"]


def test_truncated_pack(tmp_path):
    rd, snaps = make_run(tmp_path)
    # The last entry of a pack of snapshot 3, which wrote only chunks of 'b' (the encoder threads
    # put chunks in a pack in the order they finish, not their buffer's).
    locs = {cid: _loc(rd, cid) for cid, _ in snaps[-1][1]["b"]["chunks"]}
    cid = max(locs, key=lambda c: (locs[c].pack, locs[c].offset))
    loc = locs[cid]
    path = pack_path(rd.path, loc.pack)
    os.truncate(path, loc.offset + ENTRY_NBYTES + 8)

    findings = rd.verify()
    assert _kinds(findings) == [("pack_truncated", "000003", cid, "frame[1].locals.b")]
    assert "is truncated" in findings[0].message
    assert rd.newest_intact()[0].id == "000002"
    with pytest.raises(ChunkCorrupt):
        rd.read_buffer(snaps[-1][1]["b"])


def test_missing_pack(tmp_path):
    rd, snaps = make_run(tmp_path)
    recs = snaps[-1][1]
    locs = [_loc(rd, c) for c, _ in recs["b"]["chunks"]]
    assert len({loc.pack for loc in locs}) == 1
    pack_path(rd.path, locs[0].pack).unlink()

    findings = rd.verify()
    assert _kinds(findings) == [("pack_missing", "000003", c, "frame[1].locals.b") for c, _ in recs["b"]["chunks"]]
    assert findings[0].message == f"pack {locs[0].pack} holding chunk {recs['b']['chunks'][0][0]} is missing"
    assert rd.newest_intact()[0].id == "000002"
    with pytest.raises(ChunkMissing, match="is missing of frame"):
        rd.read_buffer(recs["b"])


def test_missing_index_is_reported_then_rebuilt_by_gc(tmp_path):
    rd, snaps = make_run(tmp_path)
    recs = snaps[-1][1]
    (idx_file,) = (rd.path / "index").glob("000003-*.json")
    idx_file.unlink()

    findings = rd.verify()
    assert _kinds(findings) == [("chunk_unindexed", "000003", c, "frame[1].locals.b") for c, _ in recs["b"]["chunks"]]
    assert [x.kind for x in leftovers(rd)] == ["unindexed_pack"]
    assert rd.newest_intact()[0].id == "000002"

    report = rd.prune(None)
    assert report["reindexed_chunks"] == 4 and report["removed_packs"] == 0
    assert rd.verify() == []
    assert rd.read_buffer(recs["b"]) == snaps[-1][2]["b"]


def test_all_indexes_missing_means_nothing_intact(tmp_path):
    rd, snaps = make_run(tmp_path)
    for p in (rd.path / "index").glob("*.json"):
        p.unlink()
    assert {f.kind for f in rd.verify()} == {"chunk_unindexed"}
    info, skipped = rd.newest_intact()
    assert info is None and [s for s, _ in skipped] == ["000003", "000002", "000001"]


def test_stale_index(tmp_path):
    rd, snaps = make_run(tmp_path)
    (idx_file,) = (rd.path / "index").glob("000003-*.json")
    doc = json.loads(idx_file.read_text())
    (pack,) = doc["packs"].values()
    rows = pack["chunks"]
    rows[0][1], rows[1][1] = rows[1][1], rows[0][1]  # an index that no longer matches its pack
    idx_file.write_text(json.dumps(doc))

    findings = rd.verify()
    assert [(f.kind, f.chunk) for f in findings] == [("chunk_corrupt", rows[0][0]), ("chunk_corrupt", rows[1][0])]
    assert all("entry header does not match the index" in f.message for f in findings)
    assert rd.newest_intact()[0].id == "000002"


def test_half_written_manifest_is_invisible_and_gc_removes_it(tmp_path):
    rd, snaps = make_run(tmp_path)
    tmp = rd.path / "snapshots" / f"000004.json{atomic.TMP_MARK}4194999-0badc0de"
    tmp.write_text('{"format": 1, "buffers": {"a": ')
    assert [s.id for s in rd.snapshots()] == ["000001", "000002", "000003"]
    assert rd.verify() == []
    assert [(x.kind, x.path) for x in leftovers(rd)] == [("temp_file", f"snapshots/{tmp.name}")]
    assert rd.prune(None)["removed_temp"] == 1
    assert not tmp.exists() and leftovers(rd) == []


def test_damaged_manifest(tmp_path):
    rd, snaps = make_run(tmp_path)
    p = rd.path / "snapshots" / "000003.json"
    p.write_bytes(p.read_bytes()[:-40])
    findings = rd.verify()
    assert _kinds(findings) == [("manifest_damaged", "000003", None, None)]
    assert [s.id for s in rd.snapshots()] == ["000001", "000002"]
    info, skipped = rd.newest_intact()
    assert info.id == "000002" and skipped[0][0] == "000003"


@pytest.mark.parametrize("err,exc", [(errno.ENOSPC, NoSpace), (errno.EIO, StoreError)])
@pytest.mark.parametrize("fail_at", [0, 1, 2, 5, -1])
def test_write_errors_leave_earlier_snapshots_intact(tmp_path, monkeypatch, err, exc, fail_at):
    rd, snaps = make_run(tmp_path, n=2)
    before = sorted(p.relative_to(rd.path) for p in rd.path.rglob("*") if p.is_file())
    calls = []
    real = atomic._write

    def failing_write(fd, data):
        calls.append(len(data))
        if fail_at == -1 or len(calls) == fail_at + 1:  # -1: the manifest, the last file written
            name = os.readlink(f"/proc/self/fd/{fd}")
            if fail_at != -1 or "/snapshots/" in name:
                raise OSError(err, os.strerror(err))
        return real(fd, data)

    monkeypatch.setattr(atomic, "_write", failing_write)
    with pytest.raises(exc) as info:
        snap(rd, {"a": payload(7, 300_000), "b": payload(8, 900_000)})
    assert type(info.value) is exc
    if err == errno.ENOSPC:
        assert info.value.message.startswith("no space left on device while writing ")
    else:
        assert "Input/output error" in info.value.message
    monkeypatch.setattr(atomic, "_write", real)
    after = sorted(p.relative_to(rd.path) for p in rd.path.rglob("*") if p.is_file())
    assert after == before  # the failed writer removed everything it had written
    assert rd.verify() == [] and [s.id for s in rd.snapshots()] == ["000001", "000002"]
    sid, recs = snap(rd, {"c": payload(9, 100_000)})
    assert sid == "000003" and rd.read_buffer(recs["c"]) == payload(9, 100_000)


def test_eio_at_fsync(tmp_path, monkeypatch):
    rd, _ = make_run(tmp_path, n=1)

    def bad_fsync(fd):
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(atomic, "_fsync", bad_fsync)
    with pytest.raises(StoreError, match=r"^write of .*\.pack failed: Input/output error$"):
        snap(rd, {"x": payload(3, 100_000)})
    monkeypatch.undo()
    assert rd.verify() == [] and leftovers(rd) == []


def test_read_only_run_directory(tmp_path, monkeypatch):
    rd, snaps = make_run(tmp_path, n=2)
    os.chmod(rd.path, 0o500)
    try:
        with pytest.raises(RunDirPermission) as info:
            rd.begin_snapshot(rd.next_snapshot_id())
        assert info.value.message == f"{rd.path} is read-only (mode 0500)"
        with pytest.raises(RunDirPermission):
            rd.prune(1)
        assert rd.verify() == [] and [s.id for s in rd.snapshots()] == ["000001", "000002"]
        assert rd.read_buffer(snaps[0][1]["a"]) == snaps[0][2]["a"]
    finally:
        os.chmod(rd.path, 0o700)

    def erofs_open(path, flags, mode=0o777):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(atomic, "_open", erofs_open)
    with pytest.raises(RunDirPermission, match="Read-only file system"):
        snap(rd, {"x": payload(3, 1000)})
