"""Damaged or forged input is refused before it is believed: sizes, offsets, strides and ids read
from manifests, indexes and packs are checked against each other before they size an
allocation, a read or a path, and compressed bytes are checked before the decompressor sees
them."""

from __future__ import annotations

import json
import shutil
import tracemalloc

import pytest
from click.testing import CliRunner

from gpusnap import knobs
from gpusnap.cli import _register, cli
from gpusnap.errors import ChunkCorrupt, SnapshotNotFound, StoreError
from gpusnap.store import RunDir, codec, index
from gpusnap.store.codec import ENTRY_NBYTES
from gpusnap.store.pack import pack_path
from harness import Run, copy_programs, gpusnap, plain, progress, ref_and_out, request_snapshot, wait_for
from store_helpers import IDENTITY, SMALL, make_run, payload

_register()


def run(*args):
    return CliRunner().invoke(cli, list(map(str, args)))


def _edit_manifest(rd, sid, edit):
    p = rd.path / "snapshots" / f"{sid}.json"
    doc = json.loads(p.read_text())
    edit(doc)
    p.write_text(json.dumps(doc))


def _verify_peak(rd):
    """verify's findings and the most memory it held at once."""
    tracemalloc.start()
    try:
        findings = rd.verify()
        return findings, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("claim", [1 << 30, -4096, 0, "4096", 2.5])
def test_a_chunk_size_the_index_does_not_confirm_is_buffer_damage_without_an_allocation(tmp_path, claim):
    rd, snaps = make_run(tmp_path)
    recs = snaps[-1][1]
    cid, real = recs["b"]["chunks"][0]

    def claim_size(doc):
        doc["buffers"]["b"]["chunks"][0][1] = claim
        if isinstance(claim, int):
            doc["buffers"]["b"]["nbytes"] += claim - real  # the record adds up: only the index disagrees

    _edit_manifest(rd, "000003", claim_size)
    findings, peak = _verify_peak(rd)
    assert [(f.kind, f.snapshot, f.path, f.buffer) for f in findings] == [("buffer_damaged", "000003", "frame[1].locals.b", "b")]
    assert findings[0].message.startswith("buffer b is damaged: chunk ")
    assert peak < 16 << 20, f"verify held {peak} bytes"
    info, skipped = rd.newest_intact()
    assert info.id == "000002" and skipped[0][1].startswith("buffer_damaged: buffer b is damaged")
    with pytest.raises(ChunkCorrupt, match=r"^buffer of frame\[1\].locals.b \(snapshot 000003\) is damaged: chunk "):
        rd.read_buffer(rd.load_manifest("000003")["buffers"]["b"], snapshot="000003")


def test_an_index_entry_that_claims_more_than_its_pack_holds_is_index_damage(tmp_path):
    rd, snaps = make_run(tmp_path)
    (idx_file,) = (rd.path / "index").glob("000003-*.json")
    doc = json.loads(idx_file.read_text())
    (pack,) = doc["packs"].values()
    pack["chunks"][0][2] = 1 << 40  # stored bytes: a terabyte in a pack of a few hundred KB
    idx_file.write_text(json.dumps(doc))
    findings, peak = _verify_peak(rd)
    assert findings[0].kind == "index_damaged" and "stored size 1099511627776" in findings[0].message
    assert {f.kind for f in findings[1:]} == {"chunk_unindexed"} and peak < 16 << 20
    pack["chunks"][0][2] = 100
    pack["chunks"][0][1] = -5
    idx_file.write_text(json.dumps(doc))
    assert rd.verify()[0].kind == "index_damaged"
    assert rd.newest_intact()[0].id == "000002"


def test_compressed_bytes_are_checked_before_the_decompressor_sees_them(tmp_path, monkeypatch):
    monkeypatch.setattr(knobs, "CODEC", "zstd")  # compressed whatever the disk's speed
    rd, snaps = make_run(tmp_path)
    recs = snaps[-1][1]
    idx = index.load(rd.path)
    cid = next(c for c, _ in recs["b"]["chunks"] if idx.chunks[c].codec == codec.CODEC_BLOSC2)
    loc = idx.chunks[cid]
    assert loc.digest is not None  # the writer named the stored bytes in the index
    path = pack_path(rd.path, loc.pack)
    raw = bytearray(path.read_bytes())
    raw[loc.offset + ENTRY_NBYTES + loc.stored_nbytes - 3] ^= 0x10
    path.write_bytes(raw)
    decoded = []
    real = codec.decode_into
    monkeypatch.setattr(codec, "decode_into", lambda cd, stored, out: decoded.append(bytes(stored)) or real(cd, stored, out))
    findings = rd.verify("000003")
    assert [(f.kind, f.chunk) for f in findings] == [("chunk_corrupt", cid)]
    assert findings[0].message == f"chunk {cid} in pack {loc.pack} is damaged: its stored bytes do not match their digest"
    damaged = bytes(raw[loc.offset + ENTRY_NBYTES : loc.offset + ENTRY_NBYTES + loc.stored_nbytes])
    assert damaged not in decoded and decoded  # the intact chunks were decoded, the damaged one never


def test_ids_order_as_numbers_in_keep_and_ls(tmp_path):
    rd = RunDir.create(tmp_path / "run", IDENTITY)
    for sid in ("999998", "999999", "1000000"):
        w = rd.begin_snapshot(sid, **SMALL)
        w.commit({"buffers": {"b": w.put_buffer(payload(int(sid) % 7, 70_000), dtype="float32", typesize=4)}})
    assert rd.snapshot_ids() == ["999998", "999999", "1000000"]
    assert rd.next_snapshot_id() == "1000001" and rd.resolve(None) == "1000000"
    r = run("gc", rd.path, "--keep", "1")
    assert r.exit_code == 0 and r.stdout.startswith("removed 2 snapshots (999998, 999999)"), r.output
    assert rd.snapshot_ids() == ["1000000"] and rd.verify() == []


def test_snapshot_ids_are_checked_wherever_they_are_read(tmp_path):
    rd, snaps = make_run(tmp_path, n=1)
    (tmp_path / "run.json").write_text("{}")  # what "../run" would reach
    (rd.path / "snapshots" / "evil.json").write_text("{}")
    (rd.path / "snapshots" / "12.json").write_text("{}")
    assert rd.snapshot_ids() == ["000001"] and [s.id for s in rd.snapshots()] == ["000001"]
    for bad in ("../run", "../../run", "000001/../000001", "1", "0000001", "00000a", "", None):
        with pytest.raises(SnapshotNotFound, match="a snapshot id is 6 or more digits"):
            rd.load_manifest(bad)
        with pytest.raises(StoreError):
            rd.begin_snapshot(bad)
    r = run("inspect", rd.path, "../run")
    assert r.exit_code == 4
    assert r.stderr == (f"gpusnap: no snapshot '../run' in {rd.path}: a snapshot id is 6 or more digits, such as 000001\n"
                        "hint: list the snapshots with `gpusnap ls DIR`\n")


def test_a_manifest_with_junk_in_its_informational_fields_still_lists(tmp_path):
    rd, _ = make_run(tmp_path, n=2)
    _edit_manifest(rd, "000002", lambda doc: doc.update(stats={"bytes_written": "lots"}, schedule=[1], device=7, iteration="x"))
    r = run("ls", rd.path, "--json")
    assert r.exit_code == 0, r.output
    listed = json.loads(r.stdout)
    assert [(s["id"], s["iteration"], s["bytes_written"]) for s in listed] == [("000001", 10, listed[0]["bytes_written"]),
                                                                               ("000002", None, 0)]


def _exported_state(rd):
    w = rd.begin_snapshot("000001", **SMALL)
    rec = w.put_buffer(payload(3, 48), dtype="float32", typesize=4)
    modules = {"m": {"weight": {"buffer": "w", "dtype": "float32", "shape": [3, 4], "stride": [4, 1], "offset": 0}}}
    w.commit({"buffers": {"w": rec}, "modules": modules})


@pytest.mark.parametrize("layout,why", [
    ({"shape": [1 << 20], "stride": [0]}, "stride [0] repeats elements along a dimension of shape [1048576]"),
    ({"shape": [12, 12], "stride": [1, 1]}, "shape [12, 12], stride [1, 1], offset 0 do not fit the 12 elements"),
    ({"shape": [4, 4]}, "shape [4, 4], stride [4, 1], offset 0 do not fit the 12 elements"),
    ({"shape": [-3, 4]}, "its shape [-3, 4] is not a list of whole numbers"),
    ({"offset": -1}, "its offset [-1, 0] is not a list of whole numbers"),
    ({"byte_offset": 4096}, "its storage starts at byte 4096 of its 48-byte buffer w"),
])
def test_export_refuses_a_layout_that_does_not_fit_its_bytes(tmp_path, layout, why):
    pytest.importorskip("numpy")
    rd = RunDir.create(tmp_path / "run", IDENTITY)
    _exported_state(rd)
    _edit_manifest(rd, "000001", lambda doc: doc["modules"]["m"]["weight"].update(layout))
    out = tmp_path / "w.safetensors"
    r = run("export", rd.path, "--out", out)
    assert r.exit_code == 4 and r.stderr.startswith(f"gpusnap: weight: {why}"), r.stderr
    assert r.stderr.count("\n") == 2 and not out.exists()


@pytest.mark.slow
@pytest.mark.more  # a restart past a damaged newest snapshot: test_e2e_damage.py (CI's time)
def test_run_and_restart_fall_back_past_a_damaged_newest_snapshot(tmp_path):
    """The same command again (`run --resume auto`) and `restart` both skip a snapshot whose
    manifest claims a negative chunk size, resume from the one before, and end with the bytes
    of an uninterrupted run."""
    program = copy_programs(tmp_path) / "notorch" / "counters.py"
    ref, out = ref_and_out(tmp_path)
    plain(program, ref, 60, cwd=tmp_path)
    run_ = Run("run", "--dir", "snaps", program, out, 60, cwd=tmp_path, env={"TEST_STEP_SLEEP_S": "0.05"})
    wait_for(lambda: progress(out) >= 5, "step 5", proc=run_)
    older = request_snapshot(run_, tmp_path / "snaps")
    newest = request_snapshot(run_, tmp_path / "snaps")
    run_.kill_group()
    rd = RunDir.open(tmp_path / "snaps")
    _edit_manifest(rd, newest, lambda doc: doc["buffers"]["graph"]["chunks"][0].__setitem__(1, -1))
    shutil.copytree(rd.path, tmp_path / "copy")
    for command in (("restart", "snaps"), ("run", "--dir", "copy", program, out, 60)):
        (out / "final.json").unlink(missing_ok=True)
        done = gpusnap(*command, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        assert f"gpusnap: skipping snapshot {newest}: buffer_damaged: buffer graph is damaged: chunk " in done.stderr
        assert f"gpusnap: resuming from snapshot {older}" in done.stderr
        assert (out / "final.json").read_text() == (ref / "final.json").read_text()
