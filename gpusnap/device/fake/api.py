"""What the fake ``driver`` and ``runtime`` modules share: the ``(status, outputs...)`` return
convention, and forwarding of types and enums to the real cuda-bindings module."""

from __future__ import annotations

import functools
import re

from gpusnap.device.fake.machine import CudaFault

# cuda-bindings names its functions cuXxx / cudaXxx and its types CUxxx / cudaXxx_t; a fake
# module must never hand out a real *function* (it would reach for a driver that is not there).
_FUNCTION = re.compile(r"^(cu|cuda|nvrtc)[A-Z]")


def returning(success, status_of, outputs: int):
    """Decorate a fake API function that returns its outputs (None, one value, or a tuple of
    ``outputs`` values) or raises ``CudaFault``: it returns what cuda-bindings returns, the
    status first and every output ``None`` on failure."""

    def wrap(fn):
        @functools.wraps(fn)
        def call(*args, **kwargs):
            try:
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
    """A module ``__getattr__`` that lends the real module's types, enums and constants."""

    def __getattr__(name: str):
        if _FUNCTION.match(name) or name.startswith("_"):
            raise AttributeError(f"the fake {module_name} does not model {name}")
        return getattr(real_module, name)

    return __getattr__
