"""cuda-python's error convention, turned into gpusnap errors.

Every ``cuda.bindings`` function returns a tuple: the status enum first (``CUresult``,
``cudaError_t``, ``nvrtcResult``; 0 is success), then its outputs, each ``None`` on failure.
``check`` unwraps one such tuple or raises a one-line ``CudaCallFailed`` with a hint chosen by
the status's name. One more case is not a tuple: without an NVIDIA driver the driver module
cannot load ``libcuda`` and *raises* (cuda-pathfinder's ``DynamicLibNotFoundError``) where the
runtime module returns ``cudaErrorInsufficientDriver``; ``loading`` turns both into
``NoDevice``.
"""

from __future__ import annotations

from contextlib import contextmanager

from gpusnap.errors import CudaCallFailed, NoDevice

_FORKED = "CUDA cannot be used in a forked child; only the trainee process may call it"
_BROKEN = "the program's CUDA context is broken (a kernel of the program faulted); restart from the last snapshot"
_LOST = "the GPU is gone or failing (see `nvidia-smi` and the kernel log); restart from the last snapshot on a healthy GPU"

# Hints by status name, driver and runtime spellings side by side.
_HINTS = {
    "CUDA_ERROR_OUT_OF_MEMORY": "the device is out of memory; free memory or lower the batch size",
    "cudaErrorMemoryAllocation": "the device is out of memory; free memory or lower the batch size",
    "CUDA_ERROR_NOT_INITIALIZED": _FORKED,
    "cudaErrorInitializationError": _FORKED,
    "CUDA_ERROR_NO_DEVICE": "no CUDA device is visible (CUDA_VISIBLE_DEVICES, container runtime)",
    "cudaErrorNoDevice": "no CUDA device is visible (CUDA_VISIBLE_DEVICES, container runtime)",
    "cudaErrorInsufficientDriver": "the NVIDIA driver is missing or older than cuda-bindings needs",
    "CUDA_ERROR_ILLEGAL_ADDRESS": _BROKEN,
    "cudaErrorIllegalAddress": _BROKEN,
    "CUDA_ERROR_LAUNCH_FAILED": _BROKEN,
    "cudaErrorLaunchFailure": _BROKEN,
    "CUDA_ERROR_DEVICE_UNAVAILABLE": _LOST,
    "cudaErrorDevicesUnavailable": _LOST,
    "CUDA_ERROR_ECC_UNCORRECTABLE": _LOST,
    "cudaErrorECCUncorrectable": _LOST,
    "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED": "this host range is already registered; register the staging arena once",
    "cudaErrorHostMemoryAlreadyRegistered": "this host range is already registered; register the staging arena once",
    "CUDA_ERROR_INVALID_VALUE": "a pointer or size gpusnap passed is not valid for this device; please report it",
    "cudaErrorInvalidValue": "a pointer or size gpusnap passed is not valid for this device; please report it",
}


def hint_for(status: str) -> str | None:
    """The hint for a status name, None for a status without its own."""
    return _HINTS.get(status)


def status_name(status) -> str:
    return getattr(status, "name", None) or str(status)


def check(call: str, result):
    """Unwrap ``result`` (the tuple ``call`` returned): None, its one output, or a tuple of
    outputs. A non-zero status raises ``CudaCallFailed``."""
    status = result[0]
    if int(status) != 0:
        name = status_name(status)
        raise CudaCallFailed(f"{call} failed with {name}", hint_for(name), call=call, code=name)
    if len(result) == 1:
        return None
    if len(result) == 2:
        return result[1]
    return tuple(result[1:])


@contextmanager
def loading(what: str, hint: str | None = None):
    """Around the first call into a cuda-python module: a library that cannot be loaded becomes
    ``NoDevice`` naming ``what`` (the driver, NVRTC)."""
    try:
        yield
    except (ImportError, OSError, RuntimeError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise NoDevice(f"{what} cannot be loaded: {reason}", hint) from exc
