"""Framework trainers whose step loops live in site-packages (transformers' Trainer, Accelerate,
Lightning): what gpusnap needs to know of each to snapshot inside their loops and restart them.

One module per framework. ``LOOP_MODULES`` maps a framework's name to the modules that hold its
step loop and the calls on the way there: they are instrumented by default, as if named by
``--instrument``, when the program imports them.
"""

from __future__ import annotations

LOOP_MODULES: dict[str, tuple[str, ...]] = {}
