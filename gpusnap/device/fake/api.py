"""What the fake ``driver`` and ``runtime`` modules share: the ``(status, outputs...)`` return
convention, and forwarding of types and enums to the real cuda-bindings module."""

from __future__ import annotations

import functools
import operator
import os
import threading

from cuda.bindings import driver as _real_driver

from gpusnap.device.fake import machine as _machine
from gpusnap.device.fake.machine import CudaFault



# One call at a time: the machine's lists are not thread-safe, and the real driver serializes
# most of these calls too. A forked child gets a fresh lock (a thread of the parent may have
# held this one at fork), so its calls fail fast with NOT_INITIALIZED instead of hanging.
_lock = threading.RLock()


def _fresh_lock() -> None:
    global _lock
    _lock = threading.RLock()


os.register_at_fork(after_in_child=_fresh_lock)


def returning(success, status_of, outputs: int):
    """Decorate a fake API function that returns its outputs (None, one value, or a tuple of
    ``outputs`` values) or raises ``CudaFault``: it returns what cuda-bindings returns, the
    status first and every output ``None`` on failure."""

    def wrap(fn):
        @functools.wraps(fn)
        def call(*args, **kwargs):
            try:
                with _lock:
                    value = fn(*args, **kwargs)
            except CudaFault as fault:
                return (status_of(fault.status), *([None] * outputs))
            if outputs == 0:
                return (success,)
            if outputs == 1:
                return (success, value)
            return (success, *value)

        call.outputs = outputs
        return call

    return wrap


def forward(real_module, module_name: str):
    """A module ``__getattr__`` that lends the real module's types, enums and constants, never
    a real function: that would reach for a driver that is not there."""

    def __getattr__(name: str):
        value = getattr(real_module, name)  # AttributeError for what the real one lacks too
        if name.startswith("_") or (callable(value) and not isinstance(value, type)):
            raise AttributeError(f"the fake {module_name} does not model {name}")
        return value

    return __getattr__


# Sizes and counts are C integers in the real bindings: "16" is a TypeError there, and here.
size = operator.index


def driver_api(outputs: int = 0):
    """``returning`` for the fake driver: CUresult statuses."""
    status = _real_driver.CUresult
    return returning(status.CUDA_SUCCESS, lambda name: getattr(status, name), outputs)


def machine() -> _machine.Machine:
    """This process's fake machine (CudaFault in a forked child or before cuInit)."""
    return _machine.machine()
