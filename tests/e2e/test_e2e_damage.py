"""Damage meets restart: a restart either restores an intact snapshot or refuses, and never
restores wrong bytes. Real runs, real snapshots, real damage to the files on disk."""

from __future__ import annotations

import random

import pytest

from gpusnap.store import RunDir
from harness import (
    Run,
    assert_same,
    copy_programs,
    gpusnap,
    load_final,
    plain,
    progress,
    snapshot_now,
    wait_for,
)

pytestmark = pytest.mark.slow  # end-to-end runs: the full suite, not the quick loop


def _two_snapshots_then_killed(tmp_path):
    programs = copy_programs(tmp_path)
    ref, out = tmp_path / "ref", tmp_path / "out"
    ref.mkdir()
    out.mkdir()
    # 5 epochs of 20 steps: room for both snapshots before the end on a loaded machine
    plain(programs / "style_a.py", ref, 0, 5, cwd=tmp_path)
    run = Run("run", "--dir", "snaps", programs / "style_a.py", out, 0, 5, cwd=tmp_path, env={"TEST_STEP_SLEEP_S": "0.03"})
    wait_for(lambda: progress(out) >= 6, "step 6", proc=run)
    first = snapshot_now(run, tmp_path / "snaps", tmp_path)
    wait_for(lambda: progress(out) >= first["iteration"] + 10, "ten more steps", proc=run)
    packs_before = set((tmp_path / "snaps").rglob("*.pack"))
    second = snapshot_now(run, tmp_path / "snaps", tmp_path)
    wait_for(lambda: progress(out) >= second["iteration"] + 3, "three more steps", proc=run)
    run.kill_group()
    assert not (out / "final.pt").exists(), "the program finished before it was killed"
    new_packs = sorted(set((tmp_path / "snaps").rglob("*.pack")) - packs_before)
    assert new_packs, "the second snapshot wrote no pack of its own"
    return ref, out, first, second, new_packs


def test_restart_falls_back_past_a_damaged_snapshot_and_says_why(tmp_path):
    ref, out, first, second, new_packs = _two_snapshots_then_killed(tmp_path)
    seed = random.randrange(1 << 30)
    print(f"seed {seed}")
    rnd = random.Random(seed)
    pack = rnd.choice(new_packs)
    data = bytearray(pack.read_bytes())
    at = rnd.randrange(64, len(data))  # past the pack header: inside a chunk
    data[at] ^= 0x40
    pack.write_bytes(bytes(data))

    verified = gpusnap("verify", "snaps", cwd=tmp_path)
    assert verified.returncode == 4
    assert f"snapshot {second['id']}" in verified.stdout + verified.stderr

    restarted = gpusnap("restart", "snaps", cwd=tmp_path)
    assert restarted.returncode == 0, restarted.stderr
    assert f"skipping snapshot {second['id']}" in restarted.stderr
    assert f"restored snapshot {first['id']}" in restarted.stderr
    assert_same(load_final(ref), load_final(out))


def test_restart_from_a_named_damaged_snapshot_refuses(tmp_path):
    ref, out, first, second, new_packs = _two_snapshots_then_killed(tmp_path)
    for pack in new_packs:
        pack.unlink()
    restarted = gpusnap("restart", "snaps", "--snapshot", second["id"], cwd=tmp_path)
    assert restarted.returncode == 4, restarted.stderr
    assert second["id"] in restarted.stderr
    assert not (out / "final.pt").exists()
    # The intact one still restores.
    assert RunDir.open(tmp_path / "snaps").newest_intact()[0].id == first["id"]
