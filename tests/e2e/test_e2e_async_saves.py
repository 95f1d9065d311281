"""A program that saves its checkpoints in the background (tests/programs/corpus/async_saves.py)
holds, between two saves, the future of the last one: an object made after setup, which the
replay does not make again. A future that was done at the snapshot restarts to the same bytes
(gpusnap/frameworks/futures.py); one whose save was still running is refused at its first use,
naming it (exit 6), never waited on for ever and never blamed on the program."""

from __future__ import annotations

import pytest

from harness import Run, assert_same, copy_programs, gpusnap, load_final, plain, progress, ref_and_out, request_snapshot, wait_for

pytestmark = pytest.mark.slow  # end-to-end runs: the full suite, not the quick loop

ENV = {"OMP_NUM_THREADS": "1"}
PACED = {**ENV, "TEST_STEP_SLEEP_S": "0.04"}


def _snapshot_and_kill(tmp_path, args, snap_at: int):
    script = copy_programs(tmp_path) / "corpus" / "async_saves.py"
    ref, out = ref_and_out(tmp_path)
    run = Run("run", "--dir", "snaps", script, out, *args, cwd=tmp_path, env=PACED)
    wait_for(lambda: progress(out) >= snap_at, f"step {snap_at}", proc=run)
    request_snapshot(run, tmp_path / "snaps")
    at = progress(out)
    wait_for(lambda: progress(out) >= at + 2, f"step {at + 2}", proc=run)
    run.kill_group()
    return script, ref, out


def test_the_future_of_a_finished_async_save_restarts_to_the_same_bytes(tmp_path):
    """torch.distributed.checkpoint's async_save at steps 10, 20, ...; the snapshot at step 15,
    the save of step 10 long done; the restart waits on that future at step 20 and saves on."""
    script, ref, out = _snapshot_and_kill(tmp_path, [], 15)
    restarted = gpusnap("restart", "snaps", cwd=tmp_path, env=ENV)
    assert restarted.returncode == 0, restarted.stderr
    plain(script, ref, cwd=tmp_path, env=ENV)
    assert_same(load_final(ref), load_final(out))
    assert sorted(p.name for p in out.glob("checkpoint-*")) == sorted(p.name for p in ref.glob("checkpoint-*"))


def test_the_future_of_a_save_still_running_at_the_snapshot_is_refused_at_its_first_use(tmp_path):
    """A ThreadPoolExecutor's save that takes 30 s, submitted at step 10, snapshotted at step 12:
    the thread that ran it is gone with the killed process, so the restart cannot wait on it."""
    _, _, out = _snapshot_and_kill(tmp_path, ["--via", "pool", "--save-s", "30"], 12)
    refused = gpusnap("restart", "snaps", cwd=tmp_path, env=ENV, timeout=120)
    assert refused.returncode == 6, refused.stderr
    assert "gpusnap: restore refused: the program stopped on `with` on the threading.Condition at " in refused.stderr
    assert "future._condition, which the snapshot could not hold" in refused.stderr
    assert "hint: a restart cannot give back an object made after setup" in refused.stderr
    assert not (out / "final.pt").exists()
