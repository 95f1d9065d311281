"""Boot's part of the device side: the run's one ``Registry``, installed before the program runs.

``install()`` is called by boot before the program's first import. On the fake GPU
(``GPUSNAP_DEVICE=fake``) it puts the fake ``cuda.bindings`` modules in place first. Then it
tracks ``cuda.bindings.driver`` and ``runtime``: at once if they are imported already, otherwise
right after the program imports them (``onimport.after_import``).
Nothing is imported eagerly: importing the bindings costs ~0.2 s and a program that never uses
them must not pay it; no CUDA context is created either (``track`` only replaces attributes).
"""

from __future__ import annotations

import importlib.machinery
import sys

from gpusnap import knobs
from gpusnap.device.registry import Registry, track
from gpusnap.onimport import after_import

_MODULES = {"cuda.bindings.driver": "driver", "cuda.bindings.runtime": "runtime"}
_registry: Registry | None = None


def registry() -> Registry | None:
    """The run's registry; None when boot did not install tracking (cuda-python is absent)."""
    return _registry


def install() -> Registry | None:
    global _registry
    if knobs.DEVICE == "fake":
        from gpusnap.device import fake

        fake.install()
    elif not _bindings_installed():
        return None
    _registry = Registry()
    for name, role in _MODULES.items():
        after_import(name, lambda module, role=role: track(_registry, **{role: module}))
    return _registry


def _bindings_installed() -> bool:
    """Whether ``cuda.bindings`` can be imported, without importing it (a path lookup)."""
    for entry in sys.path:
        spec = importlib.machinery.PathFinder.find_spec("cuda", [entry] if entry else None)
        if spec is not None and spec.submodule_search_locations:
            if importlib.machinery.PathFinder.find_spec("cuda.bindings", list(spec.submodule_search_locations)):
                return True
    return False
