"""Restart on object graphs with cycles, sharing and depth: a real script through the real CLI,
snapshotted at a random step, killed -9, restarted, compared byte for byte."""

from __future__ import annotations

import json
import os
import random

import pytest
from harness import Run, assert_same, gpusnap, load_final, plain, programs_and_out, progress, snapshot_now, snapshots, wait_for

pytestmark = pytest.mark.slow  # end-to-end runs: the full suite, not the quick loop

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


def test_a_request_inside_an_optimizer_closure_waits_for_the_step_loop(tmp_path):
    """The only boundaries during LBFGS's first step are inside forward, called back from
    torch.optim: replay could not return there, so the snapshot lands on the script's loop."""
    programs, out = programs_and_out(tmp_path)
    ref = tmp_path / "ref"
    ref.mkdir()
    plain(programs / "closure_step.py", ref, 12, cwd=tmp_path)

    run = Run("run", "--dir", "snaps", programs / "closure_step.py", out, 12, cwd=tmp_path, env={"TEST_STEP_SLEEP_S": "0.1"})
    wait_for(lambda: snapshots(tmp_path / "snaps", tmp_path), "the program's own snapshot", proc=run)
    wait_for(lambda: progress(out) >= 5, "step 5", proc=run)
    run.kill_group()
    manifest = json.loads(gpusnap("inspect", "snaps", "--json", cwd=tmp_path).stdout)
    assert [f["function"] for f in manifest["roots"]["frames"]] == ["<module>"]
    assert manifest["iteration"] == 1

    restarted = gpusnap("restart", "snaps", cwd=tmp_path)
    assert restarted.returncode == 0, restarted.stderr
    assert_same(load_final(ref), load_final(out))
