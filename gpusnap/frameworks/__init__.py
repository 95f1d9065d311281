"""Framework trainers whose step loops live in site-packages (transformers' Trainer, Accelerate,
Lightning): what gpusnap needs to know of each to snapshot inside their loops and restart them.

One module per framework. ``LOOP_MODULES`` maps a framework's name to the modules that hold its
step loop and the calls on the way there: they are instrumented by default, as if named by
``--instrument``, when the program imports them.
"""

from __future__ import annotations

_LIGHTNING_LOOPS = ("trainer.trainer", "trainer.call", "loops.fit_loop", "loops.training_epoch_loop")

LOOP_MODULES: dict[str, tuple[str, ...]] = {
    # Trainer.fit -> call._call_and_handle_interrupt -> Trainer._run_stage -> FitLoop.run (epochs)
    # -> _TrainingEpochLoop.run, whose `while not self.done` steps the optimizer. Both packages.
    "lightning": tuple(f"lightning.pytorch.{m}" for m in _LIGHTNING_LOOPS),
    "pytorch_lightning": tuple(f"pytorch_lightning.{m}" for m in _LIGHTNING_LOOPS),
}
