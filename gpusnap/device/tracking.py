"""Boot's part of the device side: the run's one ``Registry``, installed before the program runs.

``install()`` is called by boot before the program's first import. On the fake GPU
(``GPUSNAP_DEVICE=fake``) it puts the fake ``cuda.bindings`` modules in place first. Then it
tracks ``cuda.bindings.driver`` and ``runtime``: at once if they are imported already, otherwise
when the program imports them (a finder on ``sys.meta_path`` wraps the modules as they load).
Nothing is imported eagerly: importing the bindings costs ~0.2 s and a program that never uses
them must not pay it; no CUDA context is created either (``track`` only replaces attributes).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys

from gpusnap import knobs
from gpusnap.device.registry import Registry, track

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
        module = sys.modules.get(name)
        if module is not None:
            track(_registry, **{role: module})
    if not any(isinstance(finder, _TrackOnImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _TrackOnImport())
    return _registry


def _bindings_installed() -> bool:
    """Whether ``cuda.bindings`` can be imported, without importing it (a path lookup)."""
    for entry in sys.path:
        spec = importlib.machinery.PathFinder.find_spec("cuda", [entry] if entry else None)
        if spec is not None and spec.submodule_search_locations:
            if importlib.machinery.PathFinder.find_spec("cuda.bindings", list(spec.submodule_search_locations)):
                return True
    return False


class _TrackOnImport(importlib.abc.MetaPathFinder):
    """Wraps the tracked modules' loaders so that ``track`` runs right after they execute."""

    def find_spec(self, fullname, path, target=None):
        if fullname not in _MODULES or _registry is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _TrackingLoader(spec.loader, _MODULES[fullname])
                return spec
        return None


class _TrackingLoader(importlib.abc.Loader):
    def __init__(self, loader, role: str):
        self._loader, self._role = loader, role

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        track(_registry, **{self._role: module})
