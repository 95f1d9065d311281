"""Tracking raw allocations: wrappers installed on the (fake) cuda.bindings modules record what
the program allocates, by call site and per-site ordinal, and forget what it frees; gpusnap's
own allocations stay out."""

from __future__ import annotations

import inspect

import pytest

from device_helpers import Program
from gpusnap.device import AllocKind, fake
from gpusnap.device.backend import ORIGINAL_ATTR
from gpusnap.device.calls import check
from gpusnap.device.fake import driver as cu
from gpusnap.device.fake import runtime as rt
from gpusnap.device.registry import Registry, track, untrack

HERE = __file__


@pytest.fixture
def registry():
    fake.reset(devices=2, device_bytes=64 << 20)
    reg = Registry()
    track(reg, cu, rt)
    yield reg
    untrack(cu, rt)


def line_of(text: str) -> int:
    with open(HERE) as f:
        return next(i for i, line in enumerate(f, 1) if text in line and "line_of" not in line)


def test_allocations_are_recorded_by_call_site_and_ordinal_and_frees_forget_them(registry):
    program = Program(cu)
    ptrs = [int(check("cuMemAlloc", cu.cuMemAlloc(1000 + i))) for i in range(3)]  # one site, three ordinals
    managed = int(check("cuMemAllocManaged", cu.cuMemAllocManaged(4096, 1)))
    ptr, pitch = check("cuMemAllocPitch", cu.cuMemAllocPitch(100, 7, 4))
    live = registry.live()
    site = f"{HERE}:{line_of('one site, three ordinals')}"
    assert [(e.seq, e.call_site, e.ordinal, e.nbytes, e.kind) for e in live[:3]] == [
        (i, site, i, 1000 + i, AllocKind.DEVICE) for i in range(3)
    ]
    assert [e.base for e in live[:3]] == ptrs and all(e.device == 0 and e.api == "cuMemAlloc" for e in live[:3])
    assert (live[3].kind, live[3].base, live[3].ordinal) == (AllocKind.MANAGED, managed, 0)
    assert (live[4].nbytes, live[4].api) == (pitch * 7, "cuMemAllocPitch")
    program.free(ptrs[1])
    assert [e.base for e in registry.live()] == [ptrs[0], ptrs[2], managed, int(ptr)]
    assert registry.containing(ptrs[2] + 1001).base == ptrs[2]
    assert registry.containing(ptrs[1]) is None
    program.close()


def test_runtime_allocations_are_recorded_once_with_their_device(registry):
    check("cudaSetDevice", rt.cudaSetDevice(1))
    ptr = check("cudaMalloc", rt.cudaMalloc(512))
    assert [(e.api, e.device, e.base) for e in registry.live()] == [("cudaMalloc", 1, ptr)]
    check("cudaFree", rt.cudaFree(ptr))
    assert registry.live() == []


def test_vmm_mappings_are_recorded_with_the_handles_device(registry):
    Program(cu, 1)
    prop = cu.CUmemAllocationProp()
    prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = 1
    va = int(check("cuMemAddressReserve", cu.cuMemAddressReserve(2 << 20, 0, 0, 0)))
    handle = check("cuMemCreate", cu.cuMemCreate(2 << 20, prop, 0))
    check("cuMemMap", cu.cuMemMap(va, 2 << 20, 0, handle, 0))
    [entry] = registry.live()
    assert (entry.kind, entry.device, entry.base, entry.nbytes, entry.api) == (AllocKind.VMM, 1, va, 2 << 20, "cuMemMap")
    check("cuMemUnmap", cu.cuMemUnmap(va, 2 << 20))
    assert registry.live() == []


def test_failed_calls_and_gpusnaps_own_allocations_are_not_recorded(registry):
    Program(cu)
    assert cu.cuMemAlloc(1 << 40)[0] == cu.CUresult.CUDA_ERROR_OUT_OF_MEMORY
    backend = fake.FakeBackend()
    with backend.on(0):
        backend.scratch(0, 1 << 16)
    assert registry.live() == []
    backend.close()


def test_untrack_puts_the_originals_back(registry):
    wrapper = cu.cuMemAlloc
    assert getattr(wrapper, ORIGINAL_ATTR) is not None
    untrack(cu, rt)
    assert cu.cuMemAlloc is getattr(wrapper, ORIGINAL_ATTR) and not hasattr(cu.cuMemAlloc, ORIGINAL_ATTR)
    track(registry, cu, rt)  # the fixture untracks again


def test_the_real_modules_can_be_tracked_and_untracked():
    real_driver = pytest.importorskip("cuda.bindings.driver")
    real_runtime = pytest.importorskip("cuda.bindings.runtime")
    original = real_driver.cuMemAlloc
    reg = Registry()
    track(reg, real_driver, real_runtime)
    try:
        assert getattr(real_driver.cuMemAlloc, ORIGINAL_ATTR) is original
        assert list(inspect.signature(real_driver.cuMemAlloc).parameters) == ["bytesize"]
        status = real_runtime.cudaMalloc(16)[0]  # fails without a driver: nothing is recorded
        assert int(status) != 0 or reg.live()
    finally:
        untrack(real_driver, real_runtime)
    assert real_driver.cuMemAlloc is original


@pytest.mark.gpu
def test_real_allocations_are_recorded_once():
    from gpusnap.device.cuda import load_driver
    from gpusnap.errors import NoDevice

    try:
        real_driver = load_driver()
    except NoDevice as exc:
        pytest.skip(f"no CUDA here: {exc}")
    from cuda.bindings import runtime as real_runtime

    reg = Registry()
    track(reg, real_driver, real_runtime)
    try:
        program = Program(real_driver)
        ptr = program.alloc(1 << 20)
        rt_ptr = check("cudaMalloc", real_runtime.cudaMalloc(4096))
        assert [(e.api, e.base, e.nbytes) for e in reg.live()] == [("cuMemAlloc", ptr, 1 << 20), ("cudaMalloc", rt_ptr, 4096)]
        program.free(ptr)
        check("cudaFree", real_runtime.cudaFree(rt_ptr))
        assert reg.live() == []
        program.close()
    finally:
        untrack(real_driver, real_runtime)
