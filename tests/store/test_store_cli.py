"""The store commands through the real click group: exit codes and exact messages."""

from __future__ import annotations

import json
import struct

import pytest
from click.testing import CliRunner

from gpusnap.cli import _register, cli
from gpusnap.errors import FormatVersionError, RunDirError, RunDirMismatch
from gpusnap.store import RunDir, index
from gpusnap.store.codec import ENTRY_NBYTES
from gpusnap.store.pack import pack_path
from store_helpers import IDENTITY, SMALL, make_run, payload

_register()


def run(*args):
    return CliRunner().invoke(cli, list(map(str, args)))


def test_ls_table_and_json(tmp_path):
    rd, snaps = make_run(tmp_path)
    r = run("ls", rd.path)
    assert r.exit_code == 0
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["ID", "CREATED", "ITERATION", "STALL", "DURABLE", "DIRTY", "WRITTEN", "TOTAL", "INTERVAL", "OVERHEAD", "RESUMED", "FROM"]
    assert [line.split()[0] for line in lines[1:]] == ["000001", "000002", "000003"]
    r = run("ls", rd.path, "--json")
    doc = json.loads(r.stdout)
    assert [sorted(d) for d in doc] == [sorted(["id", "created", "iteration", "stall_s", "bytes_written", "bytes_total", "resumed_from",
                                                "dirty_bytes", "durable_s", "every", "interval_s", "overhead"])] * 3
    assert [d["iteration"] for d in doc] == [10, 20, 30]
    assert [d["dirty_bytes"] for d in doc] == [None] * 3  # no device memory: "-" in the table
    assert doc[0]["bytes_total"] == 500_000 and doc[1]["bytes_written"] < doc[0]["bytes_written"]


def test_ls_not_a_run_dir(tmp_path):
    r = run("ls", tmp_path)
    assert r.exit_code == 3
    assert r.stderr == f"gpusnap: {tmp_path} is not a gpusnap run directory\nhint: pass the directory given to `gpusnap run --dir`\n"


def test_verify_ok_then_damaged(tmp_path):
    rd, snaps = make_run(tmp_path)
    r = run("verify", rd.path)
    assert r.exit_code == 0
    assert r.stdout.splitlines()[1:] == ["  000001  ok", "  000002  ok", "  000003  ok", "no damage"]
    cid = snaps[-1][1]["b"]["chunks"][0][0]
    loc = index.load(rd.path).chunks[cid]
    p = pack_path(rd.path, loc.pack)
    raw = bytearray(p.read_bytes())
    raw[loc.offset + ENTRY_NBYTES + 5] ^= 1
    p.write_bytes(raw)
    r = run("verify", rd.path)
    assert r.exit_code == 4
    out = r.stdout.splitlines()
    assert out[1:4] == ["  000001  ok", "  000002  ok", "  000003  DAMAGED"]
    assert out[4].startswith(f"snapshot 000003: chunk_corrupt: chunk {cid} in pack {loc.pack} ")
    assert out[4].endswith(" [frame[1].locals.b]")
    assert r.stderr == (
        "gpusnap: 1 problem found in snapshot 000003\n"
        f"hint: restart from the newest intact snapshot: `gpusnap restart {rd.path} --snapshot 000002`\n"
    )
    r = run("verify", rd.path, "000002")
    assert r.exit_code == 0
    doc = json.loads(run("verify", rd.path, "--json").stdout)
    assert [(f["kind"], f["snapshot"], f["chunk"], f["path"]) for f in doc["findings"]] == [
        ("chunk_corrupt", "000003", cid, "frame[1].locals.b")
    ]


@pytest.mark.slow
def test_verify_missing_index_says_gc_reindexes(tmp_path):
    rd, snaps = make_run(tmp_path, n=1)
    for p in (rd.path / "index").glob("*.json"):
        p.unlink()
    r = run("verify", rd.path)
    assert r.exit_code == 4
    assert r.stderr == (
        "gpusnap: 9 problems found in snapshot 000001\n"
        f"hint: no snapshot verifies; start the program afresh with `gpusnap run --resume never --dir {rd.path}`; "
        f"packs that no index names may hold the missing chunks: `gpusnap gc {rd.path}` re-indexes them\n"
    )
    r = run("gc", rd.path)
    assert r.exit_code == 0
    assert r.stdout == "removed 0 snapshots, 0 packs, 0 temp files; freed 0 B\nre-indexed 9 chunks found in packs no index named\n"
    assert run("verify", rd.path).exit_code == 0


def test_gc_keep_and_lock(tmp_path):
    rd, snaps = make_run(tmp_path)
    with rd.lock("run"):
        r = run("gc", rd.path, "--keep", "1")
        assert r.exit_code == 3 and r.stderr.startswith(f"gpusnap: {rd.path} is used by pid ")
    r = run("gc", rd.path, "--keep", "1")
    assert r.exit_code == 0 and r.stdout.startswith("removed 2 snapshots (000001, 000002), ")
    r = run("gc", rd.path, "--keep", "0")
    assert r.exit_code == 2 and r.stderr.startswith("gpusnap: --keep must be at least 1\n")


def test_inspect_text_and_json(tmp_path):
    rd = RunDir.create(tmp_path / "run", IDENTITY)
    w = rd.begin_snapshot("000001", **SMALL)
    rec = w.put_buffer(payload(1, 4096), dtype="float32", typesize=4)
    rec.update(kind="torch", path="frame[1].locals.model.weight", shape=[32, 32])
    graph = w.put_buffer(b"\x80\x05pickle", dtype="bytes", typesize=1)
    graph.update(kind="graph", path="<graph>")
    w.commit({
        "buffers": {"t0": rec, "graph": graph}, "iteration": 7, "stall_s": 0.0125, "write_s": 0.5, "reason": "signal",
        "resumed_from": None,
        "roots": {"frames": [{"file": "train.py", "function": "<module>", "line": 40}], "globals": ["__main__"], "rng": ["random"]},
        "objects": [{"path": "frame[1].locals.model", "type": "torch.nn.modules.linear.Linear"},
                    {"path": "frame[1].locals.model.weight", "type": "torch.nn.parameter.Parameter", "dtype": "float32", "shape": [32, 32], "buffer": "t0"}],
        "live_only": [{"path": "frame[1].locals.log", "type": "_io.TextIOWrapper"}],
    })
    r = run("inspect", rd.path)
    assert r.exit_code == 0
    out = r.stdout
    assert out.startswith("snapshot 000001  created ")
    assert "  iteration 7  reason signal  resumed from -\nstall 0.013 s  write 0.500 s\n" in out
    assert "  frames:  train.py:40 <module>\n  globals: __main__\n  rng:     random\n" in out
    rows = [line.split("  ") for line in out.splitlines()]
    assert ["frame[1].locals.model.weight", "torch.nn.parameter.Parameter", "float32", "[32, 32]", "t0"] in [
        [c.strip() for c in row if c.strip()] for row in rows
    ]
    assert "live-only, not captured (1):\n  frame[1].locals.log  _io.TextIOWrapper\n" in out
    doc = json.loads(run("inspect", rd.path, "000001", "--json").stdout)
    assert doc["stats"]["bytes_total"] == 4096 + 8 and doc["id"] == "000001"
    r = run("inspect", rd.path, "000009")
    assert r.exit_code == 4 and r.stderr.startswith(f"gpusnap: no snapshot 000009 in {rd.path}\nhint: list the snapshots")


def _state(rd):
    import torch

    torch.manual_seed(0)
    w = torch.randn(3, 4)
    b16 = torch.randn(6).to(torch.bfloat16)
    steps = torch.arange(5, dtype=torch.int64)
    wr = rd.begin_snapshot(rd.next_snapshot_id(), **SMALL)
    bufs = {}
    for name, t in {"w": w, "b16": b16, "steps": steps}.items():
        rec = wr.put_buffer(memoryview(t.numpy() if t.dtype != torch.bfloat16 else t.view(torch.int16).numpy()).cast("B"),
                            dtype=str(t.dtype)[6:], typesize=t.element_size())
        rec["kind"] = "torch"
        bufs[name] = rec
    modules = {
        "frame[1].locals.model": {
            "weight": {"buffer": "w", "dtype": "float32", "shape": [3, 4], "stride": [4, 1], "offset": 0},
            "weight_t": {"buffer": "w", "dtype": "float32", "shape": [4, 2], "stride": [1, 4], "offset": 1},
            "half": {"buffer": "b16", "dtype": "bfloat16", "shape": [2], "stride": [2], "offset": 1},
        },
        "frame[1].locals.opt_state": {"step": {"buffer": "steps", "dtype": "int64", "shape": [5], "stride": [1], "offset": 0}},
    }
    wr.commit({"buffers": bufs, "modules": modules})
    return w, b16, steps


def test_export_safetensors(tmp_path):
    torch = pytest.importorskip("torch")
    from safetensors.torch import load_file

    rd = RunDir.create(tmp_path / "run", IDENTITY)
    w, b16, steps = _state(rd)
    out = tmp_path / "w.safetensors"
    r = run("export", rd.path, "--out", out)
    assert r.exit_code == 0 and r.stdout == f"wrote 4 tensors (124 B) of snapshot 000001 to {out}\n"
    t = load_file(out)
    assert sorted(t) == ["frame[1].locals.model.half", "frame[1].locals.model.weight", "frame[1].locals.model.weight_t",
                         "frame[1].locals.opt_state.step"]
    assert torch.equal(t["frame[1].locals.model.weight"], w)
    assert torch.equal(t["frame[1].locals.model.weight_t"], torch.as_strided(w, (4, 2), (1, 4), 1))
    assert torch.equal(t["frame[1].locals.model.half"], b16[1:5:2]) and t["frame[1].locals.model.half"].dtype == torch.bfloat16
    assert torch.equal(t["frame[1].locals.opt_state.step"], steps)
    (header_len,) = struct.unpack("<Q", out.read_bytes()[:8])
    assert header_len % 8 == 0
    r = run("export", rd.path, "--out", out, "--module", "frame[1].locals.model")
    assert r.exit_code == 0
    assert sorted(load_file(out)) == ["half", "weight", "weight_t"]


def test_create_open_refusals(tmp_path):
    rd = RunDir.create(tmp_path / "run", IDENTITY)
    assert RunDir.create(tmp_path / "run", IDENTITY).identity == IDENTITY
    other = {"command": {"kind": "script", "target": "train.py", "args": ["--epochs", "4"]}}
    with pytest.raises(RunDirMismatch) as info:
        RunDir.create(tmp_path / "run", other)
    assert info.value.message == (
        f"{rd.path} belongs to another command: the argument list differs "
        "(['--epochs', '3'] there, ['--epochs', '4'] here)"
    )
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "x").write_text("x")
    with pytest.raises(RunDirError, match="is a non-empty directory that is not a gpusnap run directory"):
        RunDir.create(tmp_path / "junk", IDENTITY)
    doc = json.loads((rd.path / "run.json").read_text())
    doc["format"] = 99
    (rd.path / "run.json").write_text(json.dumps(doc))
    with pytest.raises(FormatVersionError, match="has format 99; this gpusnap knows format 1"):
        RunDir.open(rd.path)
    r = run("ls", rd.path)
    assert r.exit_code == 3 and r.stderr.startswith(f"gpusnap: {rd.path} has format 99; this gpusnap knows format 1\n")
