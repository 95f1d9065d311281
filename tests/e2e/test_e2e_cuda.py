"""torch programs on a GPU through the real CLI: each is run uninterrupted, then snapshotted at a
random step, killed -9 and restarted, and its final bytes are compared with the uninterrupted
run's. The programs pick their device as scripts do (the GPU when there is one), so the same
test bodies run on the CPU in CI; the ``gpu`` variants need a CUDA device and are skipped
without one. Also: a GPU snapshot restored onto the CPU, clean device chunks neither copied nor
rewritten, and a CuPy program where CuPy is installed."""

from __future__ import annotations

import json
import os
import random

import pytest
import torch
from harness import (
    Run,
    assert_same,
    copy_programs,
    gpusnap,
    kill_and_restart,
    listed,
    load_final,
    plain,
    progress,
    request_snapshot,
    wait_for,
)

pytestmark = pytest.mark.slow  # end-to-end runs: the full suite, not the quick loop

SEEDS = [int(s) for s in os.environ.get("GPUSNAP_TEST_SEEDS", "1").split(",")]
CUDA = torch.cuda.is_available()
ENV = {"OMP_NUM_THREADS": "1", "CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
SLOW = {**ENV, "TEST_STEP_SLEEP_S": "0.05"}
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA device")

# name: (program under programs/cuda, steps, runs on the CPU in CI too)
PROGRAMS = {"cnn": ("cnn.py", 40, True), "gpt": ("gpt.py", 40, False)}


def manifest(run_dir, snap_id: str) -> dict:
    return json.loads((run_dir / "snapshots" / f"{snap_id}.json").read_text())


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, needs_cuda])])
@pytest.mark.parametrize("name", PROGRAMS)
def test_program_restarts_to_the_same_bytes(tmp_path, name, device, seed):
    program, steps, on_cpu_too = PROGRAMS[name]
    if device == "cpu" and (CUDA or not on_cpu_too):
        pytest.skip("the CPU variant runs where there is no GPU, for the programs cheap enough for CI")
    rnd = random.Random(f"{name}/{seed}")
    print(f"program {name} on {device} seed {seed}")
    script = copy_programs(tmp_path) / "cuda" / program
    ref, out = tmp_path / "ref", tmp_path / "out"
    ref.mkdir()
    out.mkdir()
    plain(script, ref, steps, cwd=tmp_path, env=ENV)
    kill_and_restart(script, [steps], tmp_path, out, rnd, steps, ENV, SLOW)
    assert_same(load_final(ref), load_final(out))


@pytest.mark.gpu
@needs_cuda
def test_a_gpu_snapshot_restores_onto_the_cpu(tmp_path):
    """The replay sees no GPU (CUDA_VISIBLE_DEVICES empty), so the program builds its tensors on
    the CPU: the snapshot's bytes merge into them, and what the replay does not hold (tensors
    made during training) is placed on the CPU."""
    programs = copy_programs(tmp_path)
    ref, out = tmp_path / "ref", tmp_path / "out"
    ref.mkdir()
    out.mkdir()
    plain(programs / "on_cuda.py", ref, 300, cwd=tmp_path, env=ENV)
    run = Run("run", "--dir", "snaps", programs / "on_cuda.py", out, 300, cwd=tmp_path, env=SLOW)
    wait_for(lambda: progress(out) >= 120, "step 120", proc=run)
    request_snapshot(run, tmp_path / "snaps")
    run.kill_group()
    restarted = gpusnap("restart", "snaps", "-v", cwd=tmp_path, env={**ENV, "CUDA_VISIBLE_DEVICES": ""})
    assert restarted.returncode == 0, restarted.stderr
    assert "tensors saved on cuda:0 that the replay does not hold are placed on cpu" in restarted.stderr
    assert_same(load_final(ref), load_final(out))


@pytest.mark.gpu
@needs_cuda
def test_clean_device_chunks_are_neither_copied_nor_rewritten(tmp_path):
    """The CNN's 8 MiB embedding table never changes: from the second snapshot on it is not
    copied off the GPU, and its buffer names the first snapshot's chunks."""
    programs = copy_programs(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    snaps = tmp_path / "snaps"
    run = Run("run", "--dir", "snaps", programs / "cuda" / "cnn.py", out, 100_000, cwd=tmp_path, env=SLOW)
    try:
        wait_for(lambda: progress(out) >= 3, "step 3", proc=run)
        first = request_snapshot(run, snaps)
        at = progress(out)
        wait_for(lambda: progress(out) >= at + 2, "two more steps", proc=run)
        second = request_snapshot(run, snaps)
    finally:
        run.kill_group()
    a, b = manifest(snaps, first), manifest(snaps, second)
    table = [name for name, rec in b["buffers"].items() if rec.get("path", "").endswith("table.weight")]
    assert len(table) == 1, b["buffers"]
    assert b["device"]["reused_from"] == first
    assert b["buffers"][table[0]]["dirty_bytes"] == 0
    assert b["buffers"][table[0]]["chunks"] == a["buffers"][table[0]]["chunks"]
    assert b["device"]["dirty_bytes"] < a["device"]["dirty_bytes"] - (8 << 20) + (1 << 20)
    assert listed(snaps, tmp_path, second)["bytes_written"] < listed(snaps, tmp_path, first)["bytes_written"]


@pytest.mark.gpu
@needs_cuda
def test_a_cupy_program_restarts_to_the_same_bytes(tmp_path):
    pytest.importorskip("cupy")
    programs = copy_programs(tmp_path)
    ref, out = tmp_path / "ref", tmp_path / "out"
    ref.mkdir()
    out.mkdir()
    script = programs / "cuda" / "cupy_sgd.py"
    plain(script, ref, 200, cwd=tmp_path, env=ENV)
    kill_and_restart(script, [200], tmp_path, out, random.Random("cupy"), 200, ENV, SLOW)
    assert json.loads((ref / "final.json").read_text()) == json.loads((out / "final.json").read_text())
