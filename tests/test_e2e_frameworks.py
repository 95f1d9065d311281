"""Framework trainers run their step loops in site-packages, which gpusnap does not instrument.
Until their loops are supported, a run must say so at the first optimizer step, naming the loop
and the modules on the way to it, instead of waiting silently for a safe point that never comes."""

from __future__ import annotations

import pytest
from harness import Run, programs_and_out, progress, wait_for

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
