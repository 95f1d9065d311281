"""Framework trainers run their step loops in site-packages, which gpusnap does not instrument.
Until their loops are supported, a run must say so at the first optimizer step, naming the loop
and the modules on the way to it, instead of waiting silently for a safe point that never comes."""

from __future__ import annotations

import pytest
from harness import Run, gpusnap, programs_and_out, progress, snapshot_now, wait_for

FRAMEWORKS = {
    # name: (module to import, program, the loop the notice names, modules it names)
    "transformers": (
        "transformers",
        "hf_trainer.py",
        "transformers/trainer.py:",
        ["transformers.trainer"],
    ),
    "lightning": (
        "lightning",
        "lightning_fit.py",
        "lightning/pytorch/loops/training_epoch_loop.py:",
        ["lightning.pytorch.trainer.trainer", "lightning.pytorch.loops.fit_loop", "lightning.pytorch.loops.training_epoch_loop"],
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
