"""The fake GPU is strict: each test makes one bug that a real GPU would punish and asserts the
fake punishes it too (random bases, stream work only at synchronize, managed memory and device
pointers out of reach of a forked child, sticky faults, VMM access rules)."""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from device_helpers import SIGSEGV, Program, host_buffer, in_child, pattern
from gpusnap.device import AllocKind, fake
from gpusnap.device import fingerprint as fp
from gpusnap.device.calls import check
from gpusnap.device.fake import driver as cu
from gpusnap.device.fake import runtime as rt
from gpusnap.errors import CudaCallFailed

R = cu.CUresult
E = rt.cudaError_t
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RANDOM_BASES = {"GPUSNAP_FAKE_BASES": "random"}  # what these tests are about, whatever the suite's setting


@pytest.fixture
def program():
    fake.reset(devices=2, device_bytes=64 << 20)
    prog = Program(cu)
    yield prog
    prog.close()


def run_python(code: str, env: dict | None = None) -> dict:
    """Run ``code`` in a fresh interpreter; it prints one JSON object last."""
    environ = dict(os.environ, PYTHONPATH=REPO, **(env or {}))
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=environ, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_each_process_gets_device_memory_at_another_base():
    code = """
        import json
        from gpusnap.device.fake import driver as cu
        cu.cuInit(0); _, dev = cu.cuDeviceGet(0); _, ctx = cu.cuDevicePrimaryCtxRetain(dev)
        cu.cuCtxPushCurrent(ctx)
        print(json.dumps({"base": int(cu.cuMemAlloc(4096)[1]), "managed": int(cu.cuMemAllocManaged(4096, 1)[1])}))
    """
    first, second = run_python(code, RANDOM_BASES), run_python(code, RANDOM_BASES)
    assert first["base"] != second["base"] and first["managed"] != second["managed"]


def test_work_on_a_stream_happens_only_at_synchronize(program):
    data = pattern("mixed", 1 << 16)
    ptr = program.alloc(len(data))
    program.put(ptr, data)
    region, host = host_buffer(1 << 16)
    check("cuMemHostRegister", cu.cuMemHostRegister(host.ctypes.data, len(host), 0))
    stream = check("cuStreamCreate", cu.cuStreamCreate(int(cu.CUstream_flags.CU_STREAM_NON_BLOCKING)))
    check("cuMemcpyDtoHAsync", cu.cuMemcpyDtoHAsync(host.ctypes.data, ptr, len(host), stream))
    assert not host.any(), "a registered destination must not see the copy before synchronize"
    # One poll is not a synchronize: the first query of pending work says NOT_READY.
    assert cu.cuStreamQuery(stream) == (R.CUDA_ERROR_NOT_READY,)
    assert cu.cuStreamQuery(stream) == (R.CUDA_SUCCESS,)
    assert (host == data).all()
    check("cuMemHostUnregister", cu.cuMemHostUnregister(host.ctypes.data))


def test_a_missing_synchronize_is_caught_through_the_backend(program):
    backend = fake.FakeBackend()
    data = pattern("mixed", 1 << 16)
    ptr = program.alloc(len(data))
    program.put(ptr, data)
    region, host = host_buffer(len(data))
    backend.register_host(host.ctypes.data, len(host))
    backend.copy_to_host(0, ptr, host.ctypes.data, len(host))
    stale = host.copy()
    backend.synchronize(0)
    assert not stale.any() and (host == data).all()
    backend.close()


def test_pinned_sources_are_read_when_the_copy_runs_pageable_ones_at_the_call(program):
    ptr = program.alloc(8)
    stream = check("cuStreamCreate", cu.cuStreamCreate(1))
    pageable = np.full(8, 1, np.uint8)
    check("cuMemcpyHtoDAsync", cu.cuMemcpyHtoDAsync(ptr, pageable, 8, stream))
    pageable[:] = 2
    check("cuStreamSynchronize", cu.cuStreamSynchronize(stream))
    assert program.get(ptr, 8).tolist() == [1] * 8
    region, pinned = host_buffer(4096)
    check("cuMemHostRegister", cu.cuMemHostRegister(pinned.ctypes.data, 4096, 0))
    pinned[:8] = 3
    check("cuMemcpyHtoDAsync", cu.cuMemcpyHtoDAsync(ptr, pinned.ctypes.data, 8, stream))
    pinned[:8] = 4  # the program changed the source before the copy ran: the device sees it
    check("cuStreamSynchronize", cu.cuStreamSynchronize(stream))
    assert program.get(ptr, 8).tolist() == [4] * 8


def test_a_device_pointer_dereferenced_on_the_host_faults(program):
    ptr = program.alloc(4096)
    program.put(ptr, pattern("counter", 4096))
    assert in_child(lambda: ctypes.string_at(ptr, 16).hex()) == {"signal": SIGSEGV}


def test_managed_memory_works_in_the_trainee_and_faults_in_a_forked_child(program):
    ptr = program.managed(4096)
    program.put(ptr, pattern("counter", 4096))
    assert ctypes.string_at(ptr, 4) == bytes([0, 1, 2, 3])  # the trainee may touch it
    assert in_child(lambda: ctypes.string_at(ptr, 4).hex()) == {"signal": SIGSEGV}
    assert in_child(lambda: 1 + 1) == {"ok": 2}  # the child itself is fine


def test_every_call_in_a_forked_child_fails_as_cuda_does(program):
    def work():
        return [cu.cuMemAlloc(16)[0].name, cu.cuInit(0)[0].name, rt.cudaMalloc(16)[0].name, rt.cudaGetDeviceCount()[0].name]

    assert in_child(work)["ok"] == ["CUDA_ERROR_NOT_INITIALIZED"] * 2 + ["cudaErrorInitializationError"] * 2
    assert cu.cuMemAlloc(16)[0] == R.CUDA_SUCCESS  # the parent goes on


def test_registered_host_memory_is_do_not_fork_until_unregistered(program):
    region, host = host_buffer(1 << 20)
    check("cuMemHostRegister", cu.cuMemHostRegister(host.ctypes.data, len(host), 0))
    assert cu.cuMemHostRegister(host.ctypes.data, 4096, 0) == (R.CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED,)
    host[:] = 7
    assert in_child(lambda: int(host[0])) == {"signal": SIGSEGV}
    check("cuMemHostUnregister", cu.cuMemHostUnregister(host.ctypes.data))
    assert in_child(lambda: int(host[0])) == {"ok": 7}


def test_memory_freed_before_the_copy_runs_is_a_sticky_illegal_address(program):
    ptr = program.alloc(4096)
    copies = check("cuStreamCreate", cu.cuStreamCreate(1))
    frees = check("cuStreamCreate", cu.cuStreamCreate(1))
    region, host = host_buffer(4096)
    check("cuMemHostRegister", cu.cuMemHostRegister(host.ctypes.data, 4096, 0))
    check("cuMemcpyDtoHAsync", cu.cuMemcpyDtoHAsync(host.ctypes.data, ptr, 4096, copies))
    check("cuMemFreeAsync", cu.cuMemFreeAsync(ptr, frees))  # no ordering between the streams
    check("cuStreamSynchronize", cu.cuStreamSynchronize(frees))
    assert cu.cuStreamSynchronize(copies) == (R.CUDA_ERROR_ILLEGAL_ADDRESS,)
    assert cu.cuMemAlloc(16) == (R.CUDA_ERROR_ILLEGAL_ADDRESS, None)  # the context is gone
    with pytest.raises(CudaCallFailed) as err:
        check("cuMemAlloc", cu.cuMemAlloc(16))
    assert str(err.value) == "cuMemAlloc failed with CUDA_ERROR_ILLEGAL_ADDRESS"
    assert "restart from the last snapshot" in err.value.hint


def test_out_of_memory_and_bad_arguments_return_status_tuples(program):
    assert cu.cuMemAlloc(65 << 20) == (R.CUDA_ERROR_OUT_OF_MEMORY, None)
    assert cu.cuMemAlloc(0) == (R.CUDA_ERROR_INVALID_VALUE, None)
    assert cu.cuMemAllocPitch(100, 10, 3) == (R.CUDA_ERROR_INVALID_VALUE, None, None)
    assert cu.cuDeviceGet(5) == (R.CUDA_ERROR_INVALID_DEVICE, None)
    ptr = program.alloc(100)
    assert cu.cuMemcpyDtoH(np.zeros(200, np.uint8), ptr, 200) == (R.CUDA_ERROR_INVALID_VALUE,)
    assert rt.cudaMalloc(65 << 20) == (E.cudaErrorMemoryAllocation, None)
    with pytest.raises(TypeError):
        cu.cuMemAlloc("16")


def test_pitch_memset_and_device_to_device(program):
    ptr, pitch = check("cuMemAllocPitch", cu.cuMemAllocPitch(100, 3, 4))
    assert pitch % 512 == 0 and pitch >= 100
    check("cuMemsetD32", cu.cuMemsetD32(ptr, 0x01020304, pitch * 3 // 4))
    other = program.alloc(pitch * 3)
    check("cuMemcpyDtoD", cu.cuMemcpyDtoD(other, ptr, pitch * 3))
    assert program.get(other, 8).tolist() == [4, 3, 2, 1, 4, 3, 2, 1]


def test_stream_ordered_allocation(program):
    stream = check("cuStreamCreate", cu.cuStreamCreate(1))
    ptr = int(check("cuMemAllocAsync", cu.cuMemAllocAsync(4096, stream)))
    check("cuMemsetD8Async", cu.cuMemsetD8Async(ptr, 9, 4096, stream))
    check("cuMemFreeAsync", cu.cuMemFreeAsync(ptr, stream))
    assert cu.cuMemGetAddressRange(ptr)[0] == R.CUDA_SUCCESS  # not freed until it runs
    check("cuStreamSynchronize", cu.cuStreamSynchronize(stream))
    assert cu.cuMemGetAddressRange(ptr)[0] == R.CUDA_ERROR_NOT_FOUND


def vmm_prop(device: int = 0):
    prop = cu.CUmemAllocationProp()
    prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = device
    return prop


def test_vmm_memory_needs_access_before_use_and_can_keep_its_address(program):
    prop = vmm_prop()
    gran = check("cuMemGetAllocationGranularity", cu.cuMemGetAllocationGranularity(prop, cu.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM))
    va = int(check("cuMemAddressReserve", cu.cuMemAddressReserve(2 * gran, 0, 0, 0)))
    handle = check("cuMemCreate", cu.cuMemCreate(2 * gran, prop, 0))
    check("cuMemMap", cu.cuMemMap(va, 2 * gran, 0, handle, 0))
    data = pattern("mixed", 4096)
    assert cu.cuMemcpyHtoD(va, data, 4096) == (R.CUDA_ERROR_INVALID_VALUE,)  # no access yet
    desc = cu.CUmemAccessDesc()
    desc.location = prop.location
    desc.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    check("cuMemSetAccess", cu.cuMemSetAccess(va, 2 * gran, [desc], 1))
    program.put(va + gran, data)
    assert (program.get(va + gran, 4096) == data).all()
    backend = fake.FakeBackend()
    assert backend.pointer(va + 5).kind is AllocKind.VMM
    check("cuMemUnmap", cu.cuMemUnmap(va, 2 * gran))
    check("cuMemRelease", cu.cuMemRelease(handle))
    check("cuMemAddressFree", cu.cuMemAddressFree(va, 2 * gran))
    # The driver grants a requested address that is free: a restore can keep a VMM address.
    again = int(check("cuMemAddressReserve", cu.cuMemAddressReserve(2 * gran, 0, va, 0)))
    assert again == va
    backend.close()


def test_runtime_calls_use_the_current_devices_primary_context():
    fake.reset(devices=2, device_bytes=64 << 20)
    assert check("cudaSetDevice", rt.cudaSetDevice(1)) is None
    ptr = check("cudaMalloc", rt.cudaMalloc(4096))
    managed = check("cudaMallocManaged", rt.cudaMallocManaged(4096, 1))
    data = pattern("counter", 4096)
    check("cudaMemcpy", rt.cudaMemcpy(ptr, data, 4096, rt.cudaMemcpyKind.cudaMemcpyHostToDevice))
    check("cudaMemcpy", rt.cudaMemcpy(managed, ptr, 4096, rt.cudaMemcpyKind.cudaMemcpyDeviceToDevice))
    check("cudaDeviceSynchronize", rt.cudaDeviceSynchronize())
    assert ctypes.string_at(managed, 4096) == data.tobytes()
    backend = fake.FakeBackend()
    assert backend.devices_in_use() == [1] and backend.pointer(ptr).device == 1
    backend.close()
    check("cudaFree", rt.cudaFree(ptr))
    assert rt.cudaFree(ptr) == (E.cudaErrorInvalidValue,)


def test_restored_bytes_land_at_another_base_in_another_process(tmp_path):
    """What restore will do: stage in one process, copy back into a new allocation in the
    next, whose base differs."""
    stage = f"""
        import json, numpy as np
        from gpusnap.device import fake
        from gpusnap.device.calls import check
        from gpusnap.device.fake import driver as cu
        backend = fake.FakeBackend()
        cu.cuInit(0); dev = check("", cu.cuDeviceGet(0)); ctx = check("", cu.cuDevicePrimaryCtxRetain(dev))
        cu.cuCtxPushCurrent(ctx)
        ptr = int(check("", cu.cuMemAlloc(1 << 20)))
        data = (np.arange(1 << 18, dtype=np.uint32) * 2654435761).astype(np.uint32)
        check("", cu.cuMemcpyHtoD(ptr, data, data.nbytes))
        check("", cu.cuCtxSynchronize())  # the copy may still be in flight, and staging uses another stream
        arena = np.zeros(1 << 20, np.uint8)
        backend.register_host(arena.ctypes.data, arena.nbytes)
        backend.copy_to_host(0, ptr, arena.ctypes.data, arena.nbytes)
        backend.synchronize(0)
        arena.tofile({str(tmp_path / "staged")!r})
        print(json.dumps({{"base": ptr}}))
    """
    restore = f"""
        import json, numpy as np
        from gpusnap.device import fake
        from gpusnap.device.calls import check
        from gpusnap.device.fake import driver as cu
        backend = fake.FakeBackend()
        cu.cuInit(0); dev = check("", cu.cuDeviceGet(0)); ctx = check("", cu.cuDevicePrimaryCtxRetain(dev))
        cu.cuCtxPushCurrent(ctx)
        ptr = int(check("", cu.cuMemAlloc(1 << 20)))
        staged = np.fromfile({str(tmp_path / "staged")!r}, dtype=np.uint8)
        backend.copy_to_device(0, ptr, staged.ctypes.data, staged.nbytes)
        backend.synchronize(0)
        back = np.zeros(1 << 20, np.uint8)
        check("", cu.cuMemcpyDtoH(back, ptr, back.nbytes))
        want = (np.arange(1 << 18, dtype=np.uint32) * 2654435761).astype(np.uint32)
        print(json.dumps({{"base": ptr, "equal": bool((back.view(np.uint32) == want).all())}}))
    """
    first, second = run_python(stage, RANDOM_BASES), run_python(restore, RANDOM_BASES)
    assert second["equal"] and second["base"] != first["base"]


def test_a_cuda_python_program_runs_unchanged_on_the_installed_fake():
    got = run_python(
        """
        import json
        from gpusnap.device import fake
        fake.install()
        import numpy as np
        from cuda.bindings import driver, runtime     # the program's own imports
        assert driver.__name__ == "gpusnap.device.fake.driver"
        err, = driver.cuInit(0)
        err, dev = driver.cuDeviceGet(0)
        err, ctx = driver.cuDevicePrimaryCtxRetain(dev)
        err, = driver.cuCtxSetCurrent(ctx)
        err, dptr = driver.cuMemAlloc(64)
        x = np.arange(16, dtype=np.float32)
        err, = driver.cuMemcpyHtoD(dptr, x, x.nbytes)
        err, managed = runtime.cudaMallocManaged(64, 1)
        err, = runtime.cudaMemcpy(managed, int(dptr), 64, runtime.cudaMemcpyKind.cudaMemcpyDefault)
        err, = runtime.cudaDeviceSynchronize()
        y = np.frombuffer((__import__("ctypes").c_char * 64).from_address(managed), dtype=np.float32)
        try:
            driver.cuCheckpointProcessLock
            modelled = True
        except AttributeError as exc:
            modelled = str(exc)
        print(json.dumps({"err": err.name, "sum": float(y.sum()), "unmodelled": modelled,
                          "type": type(dptr).__name__}))
        """
    )
    assert got == {
        "err": "cudaSuccess",
        "sum": 120.0,
        "unmodelled": "the fake cuda.bindings.driver does not model cuCheckpointProcessLock",
        "type": "CUdeviceptr",
    }


def test_events_order_work_across_streams_only_when_waited_on(program):
    data = pattern("mixed", 4096)
    src, dst = program.alloc(4096), program.alloc(4096)
    program.put(src, data)
    producer = check("cuStreamCreate", cu.cuStreamCreate(1))
    consumer = check("cuStreamCreate", cu.cuStreamCreate(1))
    ready = check("cuEventCreate", cu.cuEventCreate(0))
    check("cuMemcpyDtoDAsync", cu.cuMemcpyDtoDAsync(dst, src, 4096, producer))
    check("cuEventRecord", cu.cuEventRecord(ready, producer))
    check("cuMemsetD8Async", cu.cuMemsetD8Async(src, 0, 4096, producer))  # after the event
    region, host = host_buffer(4096)
    check("cuMemHostRegister", cu.cuMemHostRegister(host.ctypes.data, 4096, 0))
    check("cuStreamWaitEvent", cu.cuStreamWaitEvent(consumer, ready, 0))
    check("cuMemcpyDtoHAsync", cu.cuMemcpyDtoHAsync(host.ctypes.data, dst, 4096, consumer))
    check("cuStreamSynchronize", cu.cuStreamSynchronize(consumer))
    assert (host == data).all()  # the copy waited for the producer's work up to the event...
    # A synchronous copy does not wait for a non-blocking stream: the memset has not run yet.
    assert (program.get(src, 4096) == data).all()
    check("cuCtxSynchronize", cu.cuCtxSynchronize())
    assert (program.get(src, 4096) == 0).all()
    assert cu.cuEventQuery(ready) == (cu.CUresult.CUDA_SUCCESS,)
    later = check("cuEventCreate", cu.cuEventCreate(0))
    check("cuMemsetD8Async", cu.cuMemsetD8Async(dst, 1, 4096, producer))
    check("cuEventRecord", cu.cuEventRecord(later, producer))
    assert cu.cuEventQuery(later) == (cu.CUresult.CUDA_ERROR_NOT_READY,)
    check("cuEventSynchronize", cu.cuEventSynchronize(later))
    assert (program.get(dst, 4096) == 1).all()


SEEDS = range(16)  # stream orders: each seed picks one, a few seeds show every order of two ops


def last_write_wins(seed: int, how: str) -> int:
    """A fresh fake at ``seed``: a "synchronous" memset of 1 (still in flight on the legacy
    stream when it returns), then a memset of 2 on a second stream, ordered after it ``how``
    ("event", "blocking" stream) or not at all ("none"); the byte once the context is synchronized."""
    fake.reset(devices=1, device_bytes=16 << 20, seed=seed)
    program = Program(cu)
    ptr = program.alloc(16)
    flags = 0 if how == "blocking" else int(cu.CUstream_flags.CU_STREAM_NON_BLOCKING)
    other = check("cuStreamCreate", cu.cuStreamCreate(flags))
    check("cuMemsetD8", cu.cuMemsetD8(ptr, 1, 16))
    if how == "event":
        done = check("cuEventCreate", cu.cuEventCreate(0))
        check("cuEventRecord", cu.cuEventRecord(done, 0))
        check("cuStreamWaitEvent", cu.cuStreamWaitEvent(other, done, 0))
    check("cuMemsetD8Async", cu.cuMemsetD8Async(ptr, 2, 16, other))
    check("cuCtxSynchronize", cu.cuCtxSynchronize())
    value = int(program.get(ptr, 1)[0])
    program.close()
    return value


def test_unordered_streams_run_in_either_order_and_an_event_or_a_blocking_stream_orders_them():
    assert {last_write_wins(seed, "none") for seed in SEEDS} == {1, 2}, "a non-blocking stream may overtake the legacy one"
    assert {last_write_wins(seed, "event") for seed in SEEDS} == {2}
    assert {last_write_wins(seed, "blocking") for seed in SEEDS} == {2}


def test_the_order_is_the_seeds_own_so_a_failure_replays():
    orders = [last_write_wins(seed, "none") for seed in SEEDS]
    assert [last_write_wins(seed, "none") for seed in SEEDS] == orders
    fake.reset(devices=1, seed=1234)
    assert fake.seed() == 1234
    code = "from gpusnap.device.fake import driver as cu; from gpusnap.device import fake; cu.cuInit(0); print(fake.seed())"
    environ = dict(os.environ, PYTHONPATH=REPO, GPUSNAP_FAKE_SEED="4321")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environ, timeout=120)
    assert done.stdout.strip() == "4321", done.stderr  # the knob every process of a test run shares


def test_a_pageable_copy_to_the_device_may_still_be_in_flight_when_it_returns(program):
    """cuMemcpyHtoD from pageable memory returns once the bytes are staged; only later
    legacy-stream work (or a synchronize) is ordered after it, not another stream's."""
    ptr = program.alloc(4096)
    check("cuMemcpyHtoD", cu.cuMemcpyHtoD(ptr, pattern("mixed", 4096), 4096))
    region, host = host_buffer(4096)
    check("cuMemHostRegister", cu.cuMemHostRegister(host.ctypes.data, 4096, 0))
    fast = check("cuStreamCreate", cu.cuStreamCreate(int(cu.CUstream_flags.CU_STREAM_NON_BLOCKING)))
    check("cuMemcpyDtoHAsync", cu.cuMemcpyDtoHAsync(host.ctypes.data, ptr, 4096, fast))
    check("cuStreamSynchronize", cu.cuStreamSynchronize(fast))
    assert not host.any(), "the non-blocking stream read the device before the copy landed"
    assert (program.get(ptr, 4096) == pattern("mixed", 4096)).all()  # the legacy stream is ordered after it
    check("cuMemHostUnregister", cu.cuMemHostUnregister(host.ctypes.data))


def test_the_fingerprint_self_check_orders_its_own_writes_in_every_stream_order():
    for seed in SEEDS:
        fake.reset(devices=1, device_bytes=16 << 20, seed=seed)
        program = Program(cu)
        backend = fake.FakeBackend()
        assert backend.fingerprint_agrees(0), f"seed {seed}"
        backend.close()
        program.close()


def test_registration_pins_pages_and_a_page_replaced_under_it_loses_what_the_gpu_writes(program):
    """The staging arena's case: a memfd mapped shared, registered. A copy lands in the pages the
    registration pinned; a hole punched in the file replaces two of them under the mapping, and
    the GPU's next copy goes into the orphans: the file (what a writer maps) reads zeros there,
    and nothing fails. Unregistered and registered again, the range pins the new pages."""
    from gpusnap.rawmem import punch_hole

    page = mmap.PAGESIZE
    fd = os.memfd_create("pinned-pages")
    os.ftruncate(fd, 8 * page)
    shared = mmap.mmap(fd, 8 * page, flags=mmap.MAP_SHARED)
    host = np.frombuffer(shared, np.uint8)
    data = pattern("mixed", 8 * page)
    ptr = program.alloc(8 * page)
    program.put(ptr, data)
    check("cuMemHostRegister", cu.cuMemHostRegister(host.ctypes.data, 8 * page, 0))

    def copy_back() -> bytes:
        check("cuMemcpyDtoH", cu.cuMemcpyDtoH(host.ctypes.data, ptr, 8 * page))
        return os.pread(fd, 8 * page, 0)

    assert copy_back() == data.tobytes()
    punch_hole(fd, 2 * page, 2 * page)
    got = copy_back()
    assert got[: 2 * page] == data[: 2 * page].tobytes() and got[4 * page :] == data[4 * page :].tobytes()
    assert got[2 * page : 4 * page] == bytes(2 * page), "the GPU wrote into the orphaned pages"
    check("cuMemHostUnregister", cu.cuMemHostUnregister(host.ctypes.data))
    check("cuMemHostRegister", cu.cuMemHostRegister(host.ctypes.data, 8 * page, 0))
    assert copy_back() == data.tobytes()
    check("cuMemHostUnregister", cu.cuMemHostUnregister(host.ctypes.data))
    del host
    shared.close()
    os.close(fd)


def test_a_launch_with_too_few_blocks_gives_wrong_fingerprints(program):
    # The fake runs gpusnap's kernels block by block, so a grid that misses a block is caught.
    import ctypes as c

    from gpusnap.device.fake.kernels import FINGERPRINT_IMAGE

    data = pattern("mixed", 1 << 17)  # 4 chunks of 32 KiB: two tiles of 256 threads x 8 words each
    ptr, acc, table = program.alloc(len(data)), program.alloc(4 * 16), program.alloc(4 * 16)
    program.put(ptr, data)
    chunks = np.array([(ptr + i * (1 << 15), 1 << 15) for i in range(4)], dtype="<u8")  # address, length
    program.put(table, chunks.view(np.uint8).reshape(-1))
    module = check("cuModuleLoadData", cu.cuModuleLoadData(FINGERPRINT_IMAGE))
    accumulate = check("cuModuleGetFunction", cu.cuModuleGetFunction(module, b"gpusnap_fp_accumulate"))
    finalize = check("cuModuleGetFunction", cu.cuModuleGetFunction(module, b"gpusnap_fp_finalize"))
    assert cu.cuModuleLoadData(b"\x7fELF machine code") == (cu.CUresult.CUDA_ERROR_INVALID_IMAGE, None)

    def prints(blocks: int) -> np.ndarray:
        check("cuMemsetD8", cu.cuMemsetD8(acc, 0, 4 * 16))
        args = ((table, 4, 2, acc), (c.c_void_p, c.c_uint64, c.c_uint, c.c_void_p))
        check("cuLaunchKernel", cu.cuLaunchKernel(accumulate, blocks, 1, 1, 256, 1, 1, 0, 0, args, 0))
        args = ((table, 4, acc), (c.c_void_p, c.c_uint64, c.c_void_p))
        check("cuLaunchKernel", cu.cuLaunchKernel(finalize, 1, 1, 1, 256, 1, 1, 0, 0, args, 0))
        return program.get(acc, 4 * 16).reshape(4, 16)

    assert (prints(8) == fp.reference(data, 1 << 15)).all()  # 4 chunks x 2 blocks each
    assert fp.dirty_chunks(fp.reference(data, 1 << 15), prints(7)).tolist() == [3]


def test_install_and_uninstall_swap_the_modules_a_program_imports():
    import importlib

    import cuda
    import cuda.bindings

    real = importlib.import_module("cuda.bindings.driver")
    real_core = importlib.import_module("cuda.core")
    fake.install()
    try:
        assert importlib.import_module("cuda.bindings.driver") is cu and cuda.bindings.runtime is rt
        assert importlib.import_module("cuda.core") is fake.core and cuda.core is fake.core
    finally:
        fake.uninstall()
    assert importlib.import_module("cuda.bindings.driver") is real and cuda.bindings.driver is real
    assert importlib.import_module("cuda.core") is real_core and cuda.core is real_core


def test_the_fake_cuda_core_is_as_strict_as_the_fake_driver():
    core = fake.core
    fake.reset(devices=1, device_bytes=64 << 20)
    device = core.Device(0)
    with pytest.raises(core.CUDAError, match="Device 0 is not yet initialized"):
        device.create_stream()
    device.set_current()
    stream = device.create_stream()
    buffer = device.allocate(4096, stream=stream)
    pinned = core.LegacyPinnedMemoryResource().allocate(4096)
    managed = core.ManagedMemoryResource().allocate(4096, stream=stream)
    buffer.fill(9, stream=stream)
    buffer.copy_to(pinned, stream=stream)
    assert ctypes.string_at(pinned.handle, 4) == bytes(4)  # enqueued: nothing ran yet
    stream.sync()
    assert ctypes.string_at(pinned.handle, 4) == b"\x09" * 4
    assert (buffer.is_host_accessible, pinned.is_host_accessible, managed.is_managed, managed.device_id) == (False, True, True, -1)
    assert in_child(lambda: ctypes.string_at(pinned.handle, 1)) == {"signal": SIGSEGV}  # pinned: not passed on
    assert in_child(lambda: ctypes.string_at(managed.handle, 1)) == {"signal": SIGSEGV}
    assert in_child(lambda: buffer.fill(1, stream=stream)) == {"error": "CUDAError: CUDA_ERROR_NOT_INITIALIZED"}
    with pytest.raises(ValueError, match="buffer sizes mismatch"):
        buffer.copy_from(core.LegacyPinnedMemoryResource().allocate(512), stream=stream)
    buffer.close()
    with pytest.raises(RuntimeError, match="Buffer has been closed"):
        buffer.device_id


def test_a_machine_without_devices_is_no_device_with_a_hint():
    from gpusnap.errors import NoDevice

    fake.reset(devices=0)
    assert cu.cuInit(0) == (R.CUDA_ERROR_NO_DEVICE,)
    with pytest.raises(NoDevice) as err:
        fake.FakeBackend()
    assert str(err.value) == "cuInit failed with CUDA_ERROR_NO_DEVICE"
    assert err.value.hint == "no CUDA device is visible (CUDA_VISIBLE_DEVICES, container runtime)"


def test_registering_unmapped_host_memory_is_an_error_status_not_an_exception(program):
    region, host = host_buffer(1 << 16)
    address = host.ctypes.data
    del host
    region.close()
    assert cu.cuMemHostRegister(address, 1 << 16, 0) == (R.CUDA_ERROR_INVALID_VALUE,)


def test_threads_may_call_the_fake_at_once(program):
    import threading

    ctx = program.ctx
    errors = []

    def work():
        check("cuCtxSetCurrent", cu.cuCtxSetCurrent(ctx))  # each thread has its own current context
        for _ in range(200):
            status, ptr = cu.cuMemAlloc(4096)
            errors.append(status) if status != R.CUDA_SUCCESS else cu.cuMemFree(ptr)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and fake.machine.machine().devices[0].used_bytes == 0
