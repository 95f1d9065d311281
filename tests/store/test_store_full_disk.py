"""gc on a full disk, through the store's injection points (every write fails with ENOSPC, as on
a file system that is 100% full): it frees what no snapshot needs before it writes anything, and
what it leaves verifies. tests/e2e/test_e2e_full_disk.py does the same on a real tmpfs."""

from __future__ import annotations

import errno

import pytest

from gpusnap.errors import NoSpace
from gpusnap import atomic
from gpusnap.store import RunDir, index, lock
from gpusnap.store.check import list_packs
from store_helpers import IDENTITY, make_run, payload, snap


def _disk_bytes(rd) -> int:
    return sum(p.stat().st_size for p in rd.path.rglob("*") if p.is_file())


def _fill(monkeypatch) -> None:
    """From now on every write the store makes fails as on a 100% full disk."""

    def no_space(*_args):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(atomic, "_write", no_space)
    monkeypatch.setattr(lock, "_pwrite", no_space)


def test_gc_on_a_full_disk_frees_the_pruned_snapshots_without_writing(tmp_path, monkeypatch):
    rd, snaps = make_run(tmp_path, n=3)
    rd.prune(None)  # one consolidated index, as retention leaves it after each commit
    before = _disk_bytes(rd)
    _fill(monkeypatch)
    with pytest.raises(NoSpace):
        snap(rd, {"b": payload(7, 200_000)})  # the disk is full
    with rd.lock("gc") as held:
        assert held.held and (rd.path / "lock").read_bytes() == b""  # the record waits for room
        report = rd.prune(1)
    assert report["removed_snapshots"] == ["000001", "000002"]
    assert report["removed_bytes"] > 200_000 and _disk_bytes(rd) <= before - report["removed_bytes"]
    assert report["no_room"]  # the index that would drop the dead entries could not be written
    assert rd.verify() == []
    sid, recs, bufs = snaps[-1]
    assert rd.read_buffer(recs["a"]) == bufs["a"] and rd.read_buffer(recs["b"]) == bufs["b"]


def test_dead_index_entries_are_never_reused_or_preferred(tmp_path, monkeypatch):
    """A pack that gc removed before it could rewrite the index leaves dead entries: a later
    writer writes such a chunk anew instead of naming it, and readers take the live copy."""
    rd = RunDir.create(tmp_path / "run", IDENTITY)
    gone = payload(100, 1_000_000)  # snapshot 1's 'b', dropped with it: packs of its own
    snap(rd, {"a": payload(0, 300_000), "b": gone})
    snap(rd, {"a": payload(0, 300_000), "b": payload(101, 200_000)})
    with monkeypatch.context() as full:
        _fill(full)
        assert rd.prune(1)["no_room"]
    dead = [cid for cid, loc in index.load(rd.path).chunks.items() if loc.pack not in dict(list_packs(rd.path))]
    assert dead, "the old index still names the removed pack"
    sid, recs = snap(rd, {"a": payload(0, 300_000), "b": gone})  # the dropped bytes come back
    assert rd.verify() == []
    assert rd.read_buffer(recs["b"]) == gone
    assert all(index.load(rd.path).chunks[c].pack in dict(list_packs(rd.path)) for c, _ in recs["b"]["chunks"])
    report = rd.prune(None)  # with room again, gc drops the dead entries
    assert not report["no_room"] and rd.verify() == []
    assert all(loc.pack in dict(list_packs(rd.path)) for loc in index.load(rd.path).chunks.values())


def test_a_pack_kept_only_for_a_few_small_chunks_is_repacked(tmp_path):
    """The first snapshot's pack holds a large buffer that changes and a small one that never
    does: once the large one is dropped, gc copies the small one out and removes the pack."""
    rd = RunDir.create(tmp_path / "run", IDENTITY)
    small = payload(1, 5000)
    for k in range(3):  # one pack each (the default sizes)
        w = rd.begin_snapshot(rd.next_snapshot_id())
        bufs = {name: w.put_buffer(data, dtype="float32", typesize=4)
                for name, data in {"big": payload(10 + k, 2_000_000), "small": small}.items()}
        w.commit({"buffers": bufs})
    assert len(list(list_packs(rd.path))) == 3
    before = _disk_bytes(rd)
    report = rd.prune(1)
    assert report["repacked_packs"] == 1 and report["removed_packs"] == 2
    assert len(list(list_packs(rd.path))) == 2 and _disk_bytes(rd) < before - 2_000_000
    assert rd.verify() == []
    m = rd.load_manifest("000003")
    assert rd.read_buffer(m["buffers"]["small"]) == small and rd.read_buffer(m["buffers"]["big"]) == payload(12, 2_000_000)


def test_verify_while_retention_prunes_and_repacks_reports_no_damage(tmp_path, monkeypatch):
    """Readers take no lock: a live run's retention may prune a snapshot verify has listed, and
    repack the chunks of one it keeps, after verify read the index. Neither is damage."""
    from gpusnap.store import check

    rd = RunDir.create(tmp_path / "run", IDENTITY)
    small = payload(1, 5000)
    for k in range(3):
        w = rd.begin_snapshot(rd.next_snapshot_id())
        bufs = {name: w.put_buffer(data, dtype="float32", typesize=4)
                for name, data in {"big": payload(10 + k, 2_000_000), "small": small}.items()}
        w.commit({"buffers": bufs})
    real = check._verify_one
    pruned = []

    def retention_meanwhile(*args):
        if not pruned:
            pruned.append(rd.prune(1))  # as a writer's --keep 1 would, between verify's listing and its reads
        return real(*args)

    monkeypatch.setattr(check, "_verify_one", retention_meanwhile)
    assert rd.verify() == []
    assert pruned[0]["removed_snapshots"] == ["000001", "000002"] and pruned[0]["repacked_packs"] == 1
