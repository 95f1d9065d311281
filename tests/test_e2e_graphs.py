"""Restart on object graphs with cycles, sharing and depth: a real script through the real CLI,
snapshotted at a random step, killed -9, restarted, compared byte for byte."""

from __future__ import annotations

import os
import random

import pytest
from harness import Run, assert_same, gpusnap, load_final, plain, programs_and_out, progress, snapshot_now, wait_for

SEEDS = [int(s) for s in os.environ.get("GPUSNAP_TEST_SEEDS", "1").split(",")]


@pytest.mark.parametrize("seed", SEEDS)
def test_cycles_depth_and_sharing_restart_to_the_same_bytes(tmp_path, seed):
    rnd = random.Random(f"graphs/{seed}")
    print(f"seed {seed}")
    programs, out = programs_and_out(tmp_path)
    ref = tmp_path / "ref"
    ref.mkdir()
    plain(programs / "graph_shapes.py", ref, 30, cwd=tmp_path)

    run = Run("run", "--dir", "snaps", programs / "graph_shapes.py", out, 30, cwd=tmp_path, env={"TEST_STEP_SLEEP_S": "0.05"})
    wait_for(lambda: progress(out) >= rnd.randint(5, 15), "a random step", proc=run)
    snap = snapshot_now(run, tmp_path / "snaps", tmp_path)
    wait_for(lambda: progress(out) >= min(snap["iteration"] + 3, 27), "a few more steps", proc=run)
    run.kill_group()

    restarted = gpusnap("restart", "snaps", cwd=tmp_path)
    assert restarted.returncode == 0, restarted.stderr
    assert f"restored snapshot {snap['id']}" in restarted.stderr
    assert_same(load_final(ref), load_final(out))
