"""Framework trainers whose step loops live in site-packages (transformers' Trainer, Accelerate,
Lightning): what gpusnap needs to know of each to snapshot inside their loops and restart them.

One module per framework; ``load()`` imports them all (boot does, before the program runs), and
each registers, without importing its framework:

- in ``LOOP_MODULES``, under the framework's name, the modules that hold its step loop and the
  calls on the way there: boot hands them to the import hook as if named by ``--instrument``,
  which instruments them when the program imports them;
- adapters for its iterators: ``restore.fastforward.ADAPTERS`` (a loop's source) and
  ``graph.iterators.ADAPTERS`` (an iterator the program advances by hand).
"""

from __future__ import annotations

import importlib
import pkgutil

LOOP_MODULES: dict[str, tuple[str, ...]] = {}


def load() -> None:
    for info in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{info.name}")


def loop_modules() -> list[str]:
    """Every framework's loop modules: boot hands them to the import hook with ``--instrument``'s."""
    return [module for modules in LOOP_MODULES.values() for module in modules]
