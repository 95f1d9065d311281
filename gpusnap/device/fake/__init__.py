"""The fake GPU: strict fake ``cuda.bindings.driver``/``runtime`` modules and ``FakeBackend``.

``install()`` puts the fake modules where ``from cuda.bindings import driver, runtime`` finds
them, so a program written for cuda-python runs unchanged on a machine without a GPU (the boot
of a run under the fake device calls it before the program's imports). ``FakeBackend`` is the
CUDA backend itself over the fake driver; only its fingerprint runs the NumPy reference (in
stream order, at synchronize) instead of the NVRTC kernel.
"""

from __future__ import annotations

import sys

from gpusnap.device import fingerprint as fp
from gpusnap.device import hostmem
from gpusnap.device.cuda import CudaBackend
from gpusnap.device.fake import driver, runtime
from gpusnap.device.fake.machine import reset  # noqa: F401  (tests: a fresh fake machine)

_MODULES = {"cuda.bindings.driver": driver, "cuda.bindings.runtime": runtime}
_saved: dict[str, object] = {}


def install() -> None:
    """Make ``cuda.bindings.driver`` and ``runtime`` the fake ones in this process."""
    import cuda.bindings

    for name, module in _MODULES.items():
        if name not in _saved:
            _saved[name] = sys.modules.get(name)
        sys.modules[name] = module
        setattr(cuda.bindings, name.rsplit(".", 1)[1], module)


def uninstall() -> None:
    import cuda.bindings

    for name, module in _saved.items():
        attr = name.rsplit(".", 1)[1]
        if module is None:
            sys.modules.pop(name, None)
            if hasattr(cuda.bindings, attr):
                delattr(cuda.bindings, attr)
        else:
            sys.modules[name] = module
            setattr(cuda.bindings, attr, module)
    _saved.clear()


class FakeBackend(CudaBackend):
    name = "fake"

    def __init__(self):
        super().__init__(driver)

    def fingerprint(self, ordinal: int, src: int, nbytes: int, chunk_bytes: int, out) -> None:
        chunks = fp.chunk_count(nbytes, chunk_bytes)
        if not chunks:
            return
        out_address = hostmem.address_of(out)

        def kernel():
            host = m.device_address(src, nbytes, "CUDA_ERROR_ILLEGAL_ADDRESS")
            prints = fp.reference(hostmem.view_at(host, nbytes), chunk_bytes)
            hostmem.view_at(out_address, prints.nbytes)[:] = prints.reshape(-1)

        with self.on(ordinal):
            m = driver._m()
            driver._enqueue(self.stream(ordinal), kernel)
