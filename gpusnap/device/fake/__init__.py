"""The fake GPU: strict fake ``cuda.bindings.driver``/``runtime`` and ``cuda.core`` modules, and
``FakeBackend``.

``install()`` puts the fake modules where ``from cuda.bindings import driver, runtime`` and
``from cuda.core import Device`` find them, so a program written for cuda-python runs unchanged
on a machine without a GPU (the entry point for the boot of a run on the fake device, to be
called before the program's imports). ``FakeBackend`` is the
CUDA backend itself over the fake driver, fingerprint launches included; the launched
"kernels" are NumPy emulations built on the reference (in stream order, at synchronize).
"""

from __future__ import annotations

import sys

from gpusnap.device.cuda import CudaBackend
from gpusnap.device.fake import core, driver, runtime
from gpusnap.device.fake.kernels import FINGERPRINT_IMAGE
from gpusnap.device.fake.machine import reset, seed  # noqa: F401  (tests: a fresh fake machine, its stream order)

_MODULES = {"cuda.bindings.driver": driver, "cuda.bindings.runtime": runtime, "cuda.core": core}
_saved: dict[str, object] = {}


def install() -> None:
    """Make ``cuda.bindings.driver``, ``runtime`` and ``cuda.core`` the fake ones in this process."""
    import cuda.bindings  # noqa: F401  (the parents of the modules replaced)

    for name, module in _MODULES.items():
        if name not in _saved:
            _saved[name] = sys.modules.get(name)
        sys.modules[name] = module
        parent, attr = name.rsplit(".", 1)
        setattr(sys.modules[parent], attr, module)


def uninstall() -> None:
    import cuda.bindings  # noqa: F401  (the parents of the modules put back)

    for name, module in _saved.items():
        parent, attr = name.rsplit(".", 1)
        parent = sys.modules[parent]
        if module is None:
            sys.modules.pop(name, None)
            if hasattr(parent, attr):
                delattr(parent, attr)
        else:
            sys.modules[name] = module
            setattr(parent, attr, module)
    _saved.clear()


class FakeBackend(CudaBackend):
    """The CUDA backend over the fake driver, launches included: only the kernel image is the
    fake's (its launches are NumPy emulations, ``fake/kernels.py``), so no NVRTC is needed."""

    name = "fake"

    def __init__(self):
        super().__init__(driver)

    def kernel_image(self, ordinal: int) -> bytes:
        return FINGERPRINT_IMAGE
