"""Raw cuda-python device memory trained on (GPUSNAP_DEVICE=fake, or a real GPU), with failures
put into gpusnap's stall through its swappable module-level functions, as a GPU can cause them:
the first snapshot meets a device-memory source that raises as torch.cuda.memory._snapshot()
does under PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync, the second a stall step that raises
something nobody foresaw. Each must skip its snapshot with one line while training goes on; the
third commits. OUT STEPS"""

import hashlib
import sys

import numpy as np
from cuda.bindings import driver as cu
from pace import finish, progress

NBYTES = 256 << 10


def check(result):
    assert int(result[0]) == 0, result[0]
    return result[1] if len(result) == 2 else result[1:] or None


def fail_once(error: Exception, then):
    """A stall step that raises ``error`` the first time it is called, then does ``then``."""
    calls = []

    def step(*args):
        calls.append(1)
        if len(calls) == 1:
            raise error
        return then(*args)

    return step


def inject() -> None:
    try:
        from gpusnap import stage
        from gpusnap.stage import sources
    except ImportError:  # run without gpusnap on the path: nothing to break
        return
    sources.SOURCES = (*sources.SOURCES, fail_once(RuntimeError("cudaMallocAsync does not yet support _snapshot"), list))
    stage.stage_unforked = fail_once(ValueError("a failure nobody foresaw"), stage.stage_unforked)


def main(steps: int) -> None:
    check(cu.cuInit(0))
    check(cu.cuCtxSetCurrent(check(cu.cuDevicePrimaryCtxRetain(check(cu.cuDeviceGet(0))))))
    ptr = check(cu.cuMemAlloc(NBYTES))
    host = np.zeros(NBYTES, np.uint8)
    inject()
    for step in range(steps):
        host[step % NBYTES] += 1
        check(cu.cuMemcpyHtoD(ptr, host.ctypes.data, NBYTES))
        progress(step + 1)
    check(cu.cuCtxSynchronize())
    back = np.zeros(NBYTES, np.uint8)
    check(cu.cuMemcpyDtoH(back.ctypes.data, ptr, NBYTES))
    finish(digest=hashlib.sha256(back.tobytes()).hexdigest())


if __name__ == "__main__":
    main(int(sys.argv[2]))
