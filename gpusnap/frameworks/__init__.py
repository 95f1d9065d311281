"""Framework trainers whose step loops live in site-packages (transformers' Trainer, Accelerate,
Lightning): what gpusnap needs to know of each to snapshot inside their loops and restart them.

One module per framework. ``LOOP_MODULES`` maps a framework's name to the modules that hold its
step loop and the calls on the way there: they are instrumented by default, as if named by
``--instrument``, when the program imports them. The first of them that the program imports
loads the framework's support module (``SUPPORT``), whose ``register()`` tells the pickler and
the replay about the framework's objects: a program that does not use the framework pays
nothing for it.
"""

from __future__ import annotations

import importlib

_LIGHTNING_LOOPS = ("trainer.trainer", "trainer.call", "loops.fit_loop", "loops.training_epoch_loop")

LOOP_MODULES: dict[str, tuple[str, ...]] = {
    # Trainer.fit -> call._call_and_handle_interrupt -> Trainer._run_stage -> FitLoop.run (epochs)
    # -> _TrainingEpochLoop.run, whose `while not self.done` steps the optimizer. Both packages.
    "lightning": tuple(f"lightning.pytorch.{m}" for m in _LIGHTNING_LOOPS),
    "pytorch_lightning": tuple(f"pytorch_lightning.{m}" for m in _LIGHTNING_LOOPS),
}
# Framework name -> its support module in this package, where that has another name.
SUPPORT = {"pytorch_lightning": "lightning"}
_registered: set[str] = set()


def on_import(fullname: str) -> None:
    """Called by the import hook for each module it instruments."""
    for name, modules in LOOP_MODULES.items():
        if fullname in modules and name not in _registered:
            _registered.add(name)
            support = f"{__name__}.{SUPPORT.get(name, name)}"
            try:
                module = importlib.import_module(support)
            except ModuleNotFoundError as exc:
                if exc.name != support:
                    raise
                continue  # nothing to register: instrumenting its loops is all it needs
            module.register()
