"""Framework trainers run their step loops in site-packages. Lightning's loop modules are
instrumented by default (gpusnap.frameworks): a `Trainer.fit` run snapshots in its step loop and
restarts to the same bytes. For a trainer whose loop is not instrumented (transformers', or one
gpusnap knows nothing of: tests/programs/frameworks/site-packages/minitrainer.py), a run must say
so at the first optimizer step, naming the loop and the modules on the way to it, instead of
waiting silently for a safe point that never comes."""

from __future__ import annotations

import os
import random
import time

import pytest
from harness import (
    Run,
    assert_same,
    copy_programs,
    gpusnap,
    interrupt,
    load_final,
    programs_and_out,
    progress,
    ref_and_out,
    snapshot_now,
    start_plain,
    wait_for,
)

SEEDS = [int(s) for s in os.environ.get("GPUSNAP_TEST_SEEDS", "1").split(",")]

FRAMEWORKS = {
    # name: (module to import, program, the loop the notice names, modules it names)
    "unknown": ("torch", "unknown_trainer.py", "site-packages/minitrainer.py:", ["minitrainer"]),
    "transformers": (
        "transformers",
        "hf_trainer.py",
        "transformers/trainer.py:",
        ["transformers.trainer"],
    ),
}


@pytest.mark.parametrize("name", FRAMEWORKS)
def test_a_framework_step_loop_is_named_at_the_first_step(tmp_path, name):
    module, program, loop, modules = FRAMEWORKS[name]
    pytest.importorskip(module)
    programs, out = programs_and_out(tmp_path)
    run = Run("run", "--dir", "snaps", programs / "frameworks" / program, out, cwd=tmp_path, env={"OMP_NUM_THREADS": "1"})
    wait_for(lambda: progress(out) >= 2, "two optimizer steps", timeout=180, proc=run)
    run.kill_group()
    err = run.proc.stderr.read()
    notices = [line for line in err.splitlines() if line.startswith("gpusnap: the optimizer steps inside a loop at")]
    assert len(notices) == 1, err
    assert loop in notices[0] and "which gpusnap does not instrument" in notices[0]
    for needed in modules:
        assert f"--instrument {needed}" in notices[0]


def test_an_instrumented_trainer_refuses_rather_than_restart_its_epoch_iterator_from_the_start(tmp_path):
    """With transformers.trainer instrumented the snapshot lands in the Trainer's step loop, but
    the epoch's iterator, advanced by next() from a range loop, is live-only: a restart would read
    the epoch from its first batch. Until it can be put back, restart refuses (exit 6)."""
    pytest.importorskip("transformers")
    programs, out = programs_and_out(tmp_path)
    program = programs / "frameworks" / "hf_trainer.py"
    env = {"OMP_NUM_THREADS": "1", "TEST_STEP_SLEEP_S": "0.05"}
    run = Run("run", "--dir", "snaps", "--instrument", "transformers.trainer", program, out, "--epochs", 8, cwd=tmp_path, env=env)
    wait_for(lambda: progress(out) >= 30, "step 30 (the second epoch)", timeout=180, proc=run)
    snapshot_now(run, tmp_path / "snaps", tmp_path)
    run.kill_group()

    refused = gpusnap("restart", "snaps", cwd=tmp_path)
    assert refused.returncode == 6, refused.stderr
    assert "locals.epoch_iterator holds a generator that the program advances itself" in refused.stderr
    assert not (out / "final.pt").exists()


@pytest.mark.parametrize("seed", SEEDS)
def test_a_lightning_fit_restarts_to_the_same_bytes(tmp_path, seed):
    """The plain command: a snapshot at a random step past the first epoch lands in Lightning's
    step loop; after kill -9, restart makes the shuffled DataLoader's iterator inside the
    trainer's CombinedLoader again, at its batch, by its index sampler (no skipped batch
    loaded), and merges the trainer's state (loop progress, optimizer, LR schedule, logged
    metrics, logger, callback). A validation run in the middle of each epoch leaves its own
    CombinedLoader iterator behind, which restart must leave alone."""
    pytest.importorskip("lightning")
    started = time.monotonic()
    rnd = random.Random(f"lightning/{seed}")
    print(f"seed {seed}")
    program = copy_programs(tmp_path) / "frameworks" / "lightning_fit.py"
    ref, out = ref_and_out(tmp_path)
    env = {"OMP_NUM_THREADS": "1"}
    reference = start_plain(program, ref, cwd=tmp_path, env=env)  # beside the run: most of each is start-up
    per_epoch, total = 20, 60  # 320 samples in batches of 16, 3 epochs

    run = Run("run", "--dir", "snaps", program, out, cwd=tmp_path, env={**env, "TEST_STEP_SLEEP_S": "0.05"})
    snap = interrupt(run, out, tmp_path / "snaps", tmp_path, rnd, total, floor=per_epoch)
    print(f"snapshot {snap['id']} at iteration {snap['iteration']}, killed at step {progress(out)}")
    assert per_epoch < snap["iteration"] <= progress(out)

    restarted = gpusnap("restart", "snaps", cwd=tmp_path, env=env)
    print(*[line for line in restarted.stderr.splitlines() if line.startswith("gpusnap:")], sep="\n")
    assert restarted.returncode == 0, restarted.stderr
    assert f"restored snapshot {snap['id']}" in restarted.stderr
    assert "again at their saved batches (by batch sampler)" in restarted.stderr
    _, err = reference.communicate(timeout=240)
    assert reference.returncode == 0 and progress(ref) == total, err
    assert_same(load_final(ref), load_final(out))
    print(f"lightning: {time.monotonic() - started:.1f} s")
