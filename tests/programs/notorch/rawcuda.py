"""Raw cuda-python memory (device, managed, VMM) computed in on a GPU, state held only there:
OUT STEPS. Run with GPUSNAP_DEVICE=fake under gpusnap (no GPU needed) or on a real GPU.

Each step ends with work the program enqueued on its own stream and did not wait for, so a
snapshot that does not synchronize the device stages stale bytes. ``cursor`` is a CUdeviceptr
into the device buffer that moves every step: restore must translate it to the new base. The
VMM buffer changes one 64 KiB chunk a step, the managed one its first words only."""

import ctypes
import hashlib
import os
import sys

import numpy as np
from cuda.bindings import driver as cu
from pace import OUT, finish, progress

DEV_BYTES = int(os.environ.get("TEST_RAWCUDA_DEV_BYTES", 256 << 10))
MANAGED_BYTES = 128 << 10
VMM_BYTES = 2 << 20
CHUNK = 64 << 10


def check(result):
    assert int(result[0]) == 0, result[0]
    return result[1] if len(result) == 2 else result[1:] or None


def main(steps: int) -> None:
    check(cu.cuInit(0))
    ctx = check(cu.cuDevicePrimaryCtxRetain(check(cu.cuDeviceGet(0))))
    check(cu.cuCtxSetCurrent(ctx))
    stream = check(cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING))

    dptr = check(cu.cuMemAlloc(DEV_BYTES))
    mptr = check(cu.cuMemAllocManaged(MANAGED_BYTES, cu.CUmemAttach_flags.CU_MEM_ATTACH_GLOBAL))
    prop = cu.CUmemAllocationProp()
    prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = 0
    vptr = check(cu.cuMemAddressReserve(VMM_BYTES, 0, 0, 0))
    handle = check(cu.cuMemCreate(VMM_BYTES, prop, 0))
    check(cu.cuMemMap(vptr, VMM_BYTES, 0, handle, 0))
    access = cu.CUmemAccessDesc()
    access.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    access.location.id = 0
    access.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    check(cu.cuMemSetAccess(vptr, VMM_BYTES, [access], 1))
    with open(os.path.join(OUT, "bases"), "a") as f:
        f.write(f"{int(dptr):#x} {int(mptr):#x} {int(vptr):#x}\n")

    check(cu.cuMemsetD32(dptr, 1, DEV_BYTES // 4))
    check(cu.cuMemsetD32(vptr, 0, VMM_BYTES // 4))
    managed = np.ctypeslib.as_array((ctypes.c_uint32 * (MANAGED_BYTES // 4)).from_address(int(mptr)))
    managed[:] = 7
    cursor = cu.CUdeviceptr(int(dptr))
    host = np.empty(DEV_BYTES // 4, np.uint32)
    for step in range(steps):
        check(cu.cuStreamSynchronize(stream))  # the last step's work, before reading its result
        check(cu.cuMemcpyDtoH(host.ctypes.data, dptr, DEV_BYTES))
        host[:] = host * np.uint32(31) + np.uint32(step)
        check(cu.cuMemcpyHtoDAsync(dptr, host.ctypes.data, DEV_BYTES, stream))
        check(cu.cuMemsetD8Async(cursor, step & 0xFF, 16, stream))
        cursor = cu.CUdeviceptr(int(dptr) + 64 * ((step * 7) % 4096))
        check(cu.cuMemsetD32Async(cu.CUdeviceptr(int(vptr) + CHUNK * (step % 4)), step, CHUNK // 4, stream))
        managed[: 16] += np.uint32(step)
        progress(step + 1)

    check(cu.cuStreamSynchronize(stream))
    digests = {}
    for name, ptr, nbytes in (("device", dptr, DEV_BYTES), ("vmm", vptr, VMM_BYTES)):
        out = np.empty(nbytes, np.uint8)
        check(cu.cuMemcpyDtoH(out.ctypes.data, ptr, nbytes))
        digests[name] = hashlib.sha256(out.tobytes()).hexdigest()
    digests["managed"] = hashlib.sha256(managed.tobytes()).hexdigest()
    finish(digests=digests, cursor_offset=int(cursor) - int(dptr), head=host[:8].tolist())


if __name__ == "__main__":
    main(int(sys.argv[2]))
