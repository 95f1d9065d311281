"""The registry of raw allocations: what a program allocated through cuda-python itself.

``track(registry, driver, runtime)`` wraps the allocation and free functions of the given
modules *by module attribute*; called before the program's imports (``tracking.install``, from
boot), the program's ``from cuda.bindings import driver`` and ``driver.cuMemAlloc`` reach the wrappers. Each wrapper
calls the original, and on success records or forgets an ``Allocation``. Code that bound a
function before ``track`` ran, cuda.core's pools and Cython ``cimport`` users are not seen; the
unaccounted report covers them, not this module (cuda.core's open Buffers are found by
``stage.sources.core_ranges`` instead).

Each wrapper keeps the function it wraps as ``ORIGINAL_ATTR``; backends call through it, so
gpusnap's own allocations never appear here. The registry is read in the trainee only: the
writer gets a list of entries, never the registry (its lock may be held at fork).
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
import threading
from collections import Counter

from gpusnap.device.backend import ORIGINAL_ATTR, AllocKind, Allocation

# The program's call site is the innermost frame in neither gpusnap nor cuda-python.
_GPUSNAP_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_CUDA_PYTHON = tuple(os.sep + os.path.join("cuda", part) + os.sep for part in ("bindings", "core", "cuda"))


class Registry:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._live: dict[int, Allocation] = {}  # base -> entry
        self._seq = 0
        self._per_site: Counter[str] = Counter()
        self.vmm_handles: dict[int, int] = {}  # cuMemCreate handle -> device ordinal
        # Contexts the program made itself (cuCtxCreate) and has not destroyed: handle -> (device,
        # call site). gpusnap works in the devices' primary contexts and refuses to miss these.
        self.contexts: dict[int, tuple[int, str]] = {}

    def record(self, api: str, kind: AllocKind, device: int, base: int, nbytes: int, call_site: str) -> Allocation:
        with self._lock:
            entry = Allocation(self._seq, call_site, self._per_site[call_site], kind, device, base, nbytes, api)
            self._seq += 1
            self._per_site[call_site] += 1
            self._live[base] = entry
            return entry

    def forget(self, base: int) -> Allocation | None:
        with self._lock:
            return self._live.pop(base, None)

    def live(self) -> list[Allocation]:
        """The allocations not freed yet, in the order the program made them."""
        with self._lock:
            return sorted(self._live.values(), key=lambda entry: entry.seq)

    def containing(self, address: int) -> Allocation | None:
        for entry in self.live():
            if entry.base <= address < entry.base + entry.nbytes:
                return entry
        return None


def call_site() -> str:
    """``file:line`` of the program's call that reached the wrapper."""
    frame = sys._getframe(1)
    while frame is not None and _is_own(frame.f_code.co_filename):
        frame = frame.f_back
    return f"{frame.f_code.co_filename}:{frame.f_lineno}" if frame is not None else "?"


def _is_own(path: str) -> bool:
    return path.startswith(_GPUSNAP_DIR) or any(part in path for part in _CUDA_PYTHON)


def _wrap(module, name: str, after) -> None:
    """Replace ``module.name`` by a wrapper that calls it, then ``after(result, args)`` when the
    call succeeded. A function the module lacks (older bindings, the fake) is left alone."""
    original = getattr(module, name, None)
    if original is None or hasattr(original, ORIGINAL_ATTR):
        return

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        result = original(*args, **kwargs)
        if int(result[0]) == 0:
            after(result, _Args(original, args, kwargs))
        return result

    setattr(wrapper, ORIGINAL_ATTR, original)
    setattr(module, name, wrapper)


class _Args:
    """A call's arguments by parameter name, however the program passed them."""

    def __init__(self, fn, args, kwargs):
        self._fn, self._args, self._kwargs = fn, args, kwargs

    def __getitem__(self, name: str):
        if name in self._kwargs:
            return self._kwargs[name]
        return self._args[list(inspect.signature(self._fn).parameters).index(name)]


def _device_of(get_device) -> int:
    status, device = getattr(get_device, ORIGINAL_ATTR, get_device)()
    return int(device) if int(status) == 0 else -1


def _by(param: str):
    return lambda result, args: int(args[param])


def _pitched(height: str):
    return lambda result, args: int(result[2]) * int(args[height])


_DRIVER_ALLOCS = (
    ("cuMemAlloc", AllocKind.DEVICE, _by("bytesize")),
    ("cuMemAllocPitch", AllocKind.DEVICE, _pitched("Height")),
    ("cuMemAllocManaged", AllocKind.MANAGED, _by("bytesize")),
    ("cuMemAllocAsync", AllocKind.DEVICE, _by("bytesize")),
    ("cuMemAllocFromPoolAsync", AllocKind.DEVICE, _by("bytesize")),
)
_RUNTIME_ALLOCS = (
    ("cudaMalloc", AllocKind.DEVICE, _by("size")),
    ("cudaMallocPitch", AllocKind.DEVICE, _pitched("height")),
    ("cudaMallocManaged", AllocKind.MANAGED, _by("size")),
    ("cudaMallocAsync", AllocKind.DEVICE, _by("size")),
)
_FREES = (("cuMemFree", "dptr"), ("cuMemFreeAsync", "dptr"), ("cuMemUnmap", "ptr"), ("cudaFree", "devPtr"), ("cudaFreeAsync", "devPtr"))


def track(registry: Registry, driver=None, runtime=None) -> None:
    """Wrap the allocation and free functions of ``driver`` and ``runtime`` (either may be None)."""
    for module, allocs, get_device in ((driver, _DRIVER_ALLOCS, "cuCtxGetDevice"), (runtime, _RUNTIME_ALLOCS, "cudaGetDevice")):
        if module is None:
            continue
        for name, kind, size_of in allocs:

            def allocated(result, args, name=name, kind=kind, size_of=size_of, module=module, get_device=get_device):
                device = _device_of(getattr(module, get_device))
                registry.record(name, kind, device, int(result[1]), size_of(result, args), call_site())

            _wrap(module, name, allocated)
        for name, param in _FREES:
            _wrap(module, name, lambda result, args, param=param: registry.forget(int(args[param])))
    if driver is not None:
        # VMM: the handle knows the device; the mapping is what puts bytes at an address.
        def created(result, args):
            registry.vmm_handles[int(result[1])] = int(args["prop"].location.id)

        def mapped(result, args):
            device = registry.vmm_handles.get(int(args["handle"]), -1)
            registry.record("cuMemMap", AllocKind.VMM, device, int(args["ptr"]), int(args["size"]), call_site())

        _wrap(driver, "cuMemCreate", created)
        _wrap(driver, "cuMemMap", mapped)

        def context_made(result, args):
            registry.contexts[int(result[1])] = (int(args["dev"]), call_site())

        _wrap(driver, "cuCtxCreate", context_made)
        _wrap(driver, "cuCtxDestroy", lambda result, args: registry.contexts.pop(int(args["ctx"]), None))


def untrack(*modules) -> None:
    """Put the original functions back (tests; a run never untracks)."""
    for module in modules:
        for name, value in list(vars(module).items()):
            original = getattr(value, ORIGINAL_ATTR, None)
            if original is not None:
                setattr(module, name, original)
