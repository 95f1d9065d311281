"""Code that runs right after a module is imported, without importing the module first.

``after_import(name, callback)`` runs ``callback(module)`` at once when ``name`` is imported
already, else right after the module's own code has run, the first time the program imports it.
Importing torch (or the CUDA bindings) eagerly would cost a program that never uses it seconds;
waiting for the program's own import costs it nothing.

One finder at the front of ``sys.meta_path`` holds every callback that waits. When a module with
callbacks is imported, it asks the finders behind it for the module's spec and has the spec's
loader run the callbacks after ``exec_module``; once nothing waits, it leaves ``sys.meta_path``.
Until then each import pays one dictionary lookup. Users: the trainee's hooks on torch
(``capture.safepoints.steploop``), the frameworks' adapters, device tracking at boot, and the
chaos tool's injected faults.
"""

from __future__ import annotations

import sys
import threading

_waiting: dict[str, list] = {}  # module name -> callbacks, in the order they were asked for
_lock = threading.Lock()


def after_import(name: str, callback) -> None:
    """``callback(module)`` once module ``name`` is imported (now, if it is)."""
    with _lock:
        module = sys.modules.get(name)
        if module is None:
            _waiting.setdefault(name, []).append(callback)
            if _FINDER not in sys.meta_path:
                sys.meta_path.insert(0, _FINDER)
            return
    callback(module)


class _Finder:
    """The meta path entry: finds nothing itself; wraps the loader of a module that has callbacks."""

    def find_spec(self, fullname, path, target=None):
        if fullname not in _waiting:
            return None
        with _lock:
            callbacks = _waiting.pop(fullname, None)
        if not callbacks:
            return None
        spec = None
        try:
            for finder in list(sys.meta_path):
                if finder is not self and hasattr(finder, "find_spec"):
                    spec = finder.find_spec(fullname, path, target)
                    if spec is not None:
                        break
        finally:
            if spec is None or spec.loader is None:  # not found (or a namespace package): wait on
                with _lock:
                    _waiting[fullname] = callbacks + _waiting.get(fullname, [])
            else:
                _run_after(spec, callbacks)
                with _lock:
                    if not _waiting and self in sys.meta_path:
                        sys.meta_path.remove(self)
        return spec


def _run_after(spec, callbacks: list) -> None:
    loader = spec.loader
    exec_module = loader.exec_module

    def exec_then_call(module):
        exec_module(module)
        for callback in callbacks:
            callback(module)

    if isinstance(loader, type):  # a class as loader (builtin, frozen): never patch the class
        spec.loader = _Then(loader, exec_then_call)
    else:  # the spec's own instance: the module keeps its loader (get_source, resources)
        loader.exec_module = exec_then_call


class _Then:
    """A loader that is another with ``exec_module`` replaced."""

    def __init__(self, loader, exec_module):
        self._loader, self.exec_module = loader, exec_module

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def __getattr__(self, name):
        return getattr(self._loader, name)


_FINDER = _Finder()
