"""GpuBackend behaviour that both backends must show: the same test bodies run on the fake GPU
everywhere and on a real one where there is one (``gpu`` marker)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from device_helpers import Program, golden, host_buffer, in_child, pattern
from gpusnap.device import AllocKind
from gpusnap.device import fingerprint as fp
from gpusnap.device.calls import check
from gpusnap.errors import CudaCallFailed, NoDevice
from gpusnap.stage.unforked import vmflags


@pytest.fixture(params=["fake", pytest.param("cuda", marks=pytest.mark.gpu)])
def gpu(request):
    """(program, backend) on device 0 of the fake or the real GPU."""
    if request.param == "fake":
        from gpusnap.device import fake

        fake.reset(devices=2, device_bytes=64 << 20)
        program = Program(fake.driver)
        backend = fake.FakeBackend()
    else:
        from gpusnap.device.cuda import CudaBackend, load_driver

        try:
            cu = load_driver()
        except NoDevice as exc:
            pytest.skip(f"no CUDA here: {exc}")
        if check("cuDeviceGetCount", cu.cuDeviceGetCount()) == 0:
            pytest.skip("no CUDA device")
        program = Program(cu)
        backend = CudaBackend(cu)
    yield program, backend
    backend.close()
    program.close()


def test_only_the_devices_the_program_uses_are_in_use(gpu):
    program, backend = gpu
    assert 0 in backend.devices_in_use()
    if backend.name == "fake":
        assert backend.device_count() == 2 and backend.devices_in_use() == [0]
    info = backend.device(0)
    assert info.arch.startswith("sm_") and info.total_bytes > 0 and len(info.uuid) == 32


def test_pointer_names_the_allocation_kind_and_range(gpu):
    program, backend = gpu
    ptr = program.alloc(10_000)
    info = backend.pointer(ptr + 1234)
    print("cuMemGetAddressRange of a 10,000-byte allocation:", info.nbytes)
    assert (info.kind, info.device, info.base) == (AllocKind.DEVICE, 0, ptr)
    # The driver rounds the size up to its granularity: only the registry knows the size asked for.
    assert 10_000 <= info.nbytes < 10_000 + (2 << 20)
    managed = program.managed(4096)
    assert backend.pointer(managed).kind is AllocKind.MANAGED
    program.free(ptr)
    program.free(managed)


def test_bytes_go_to_the_device_and_come_back_through_a_registered_buffer(gpu):
    program, backend = gpu
    nbytes = 3 << 20
    region, host = host_buffer(nbytes)
    backend.register_host(host.ctypes.data, nbytes)
    data = pattern("mixed", nbytes)
    host[:] = data
    ptr = program.alloc(nbytes)
    backend.copy_to_device(0, ptr, host.ctypes.data, nbytes)
    backend.synchronize(0)
    host[:] = 0
    backend.copy_to_host(0, ptr, host.ctypes.data, nbytes)
    backend.synchronize(0)
    assert (host == data).all()
    assert (program.get(ptr, nbytes) == data).all()
    backend.unregister_host(host.ctypes.data)
    program.free(ptr)


def test_managed_memory_is_readable_in_the_trainee_after_synchronize(gpu):
    program, backend = gpu
    ptr = program.managed(8192)
    program.put(ptr, pattern("counter", 8192))
    backend.synchronize(0)
    assert bytes(backend.managed_view(ptr, 8192)) == pattern("counter", 8192).tobytes()
    # The parent may also DMA it into the arena like device memory, without touching its pages.
    region, host = host_buffer(8192)
    backend.register_host(host.ctypes.data, 8192)
    backend.copy_to_host(0, ptr, host.ctypes.data, 8192)
    backend.synchronize(0)
    assert (host == pattern("counter", 8192)).all()
    backend.unregister_host(host.ctypes.data)
    with pytest.raises(CudaCallFailed):
        backend.managed_view(program.alloc(4096), 16)  # device memory has no host view


@pytest.mark.parametrize("case", golden(), ids=lambda c: c["name"])
def test_device_fingerprints_equal_the_golden_vectors(gpu, case):
    program, backend = gpu
    data = pattern(case["pattern"], case["nbytes"])
    ptr = program.alloc(case["offset"] + case["nbytes"])
    program.put(ptr + case["offset"], data)
    chunks = fp.chunk_count(case["nbytes"], case["chunk_bytes"])
    out = np.zeros((chunks, fp.FINGERPRINT_NBYTES), np.uint8)
    backend.fingerprint(0, ptr + case["offset"], case["nbytes"], case["chunk_bytes"], out)
    backend.synchronize(0)
    assert [row.tobytes().hex() for row in out] == case["fingerprints"]
    program.free(ptr)


def test_one_changed_byte_on_the_device_makes_exactly_its_chunk_dirty(gpu):
    program, backend = gpu
    nbytes, chunk = 1 << 20, 64 << 10
    ptr = program.alloc(nbytes)
    program.put(ptr, pattern("mixed", nbytes))
    before = np.zeros((16, 16), np.uint8)
    backend.fingerprint(0, ptr, nbytes, chunk, before)
    backend.synchronize(0)
    program.put(ptr + 5 * chunk + 777, np.array([0x5A ^ pattern("mixed", nbytes)[5 * chunk + 777]], np.uint8))
    after = np.zeros_like(before)
    backend.fingerprint(0, ptr, nbytes, chunk, after)
    backend.synchronize(0)
    assert fp.dirty_chunks(before, after).tolist() == [5]


def test_a_forked_child_is_refused_with_one_line_and_a_hint(gpu):
    program, backend = gpu
    ptr = program.alloc(4096)

    def work():
        try:
            backend.copy_to_host(0, ptr, np.zeros(4096, np.uint8).ctypes.data, 4096)
        except CudaCallFailed as exc:
            return [exc.code, str(exc), exc.hint]
        return "not refused"

    got = in_child(work)["ok"]
    assert got[0] == "CUDA_ERROR_NOT_INITIALIZED"
    assert "forked child" in got[1] and "\n" not in got[1] and "forked child" in got[2]


def test_fingerprints_of_consecutive_ranges_do_not_leak_into_each_other(gpu):
    # The backend reuses its device scratch between launches: it must start from zero each time.
    program, backend = gpu
    first, second = pattern("mixed", 300_000), pattern("counter", 100_000)
    a, b = program.alloc(len(first)), program.alloc(len(second))
    program.put(a, first)
    program.put(b, second)
    for data, ptr in ((first, a), (second, b), (first, a)):
        out = np.zeros((fp.chunk_count(len(data), 65536), 16), np.uint8)
        backend.fingerprint(0, ptr, len(data), 65536, out)
        backend.synchronize(0)
        assert (out == fp.reference(data, 65536)).all()


def test_fingerprints_of_random_shapes_equal_the_reference(gpu):
    # Sizes, chunk sizes (not always multiples of 8) and start offsets drawn at random; the
    # seed is in the assertion message.
    program, backend = gpu
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    ptr = program.alloc(1 << 21)
    for _ in range(12):
        offset = rng.choice([0, 0, 8, rng.randrange(1, 64)])
        nbytes = rng.randrange(1, (1 << 21) - offset)
        least = max(1, nbytes // 1000)  # at most ~1000 chunks: the reference is a loop over them
        chunk_bytes = rng.choice([rng.randrange(least, least + 4096), rng.randrange(1, 64) * 8192, 1 << 20])
        data = np.random.default_rng(rng.randrange(1 << 30)).integers(0, 256, nbytes, dtype=np.uint8)
        program.put(ptr + offset, data)
        out = np.zeros((fp.chunk_count(nbytes, chunk_bytes), 16), np.uint8)
        backend.fingerprint(0, ptr + offset, nbytes, chunk_bytes, out)
        backend.synchronize(0)
        assert (out == fp.reference(data, chunk_bytes)).all(), f"seed {seed}: {nbytes=} {chunk_bytes=} {offset=}"


def test_one_launch_fingerprints_many_ranges_each_cut_from_its_own_start(gpu):
    # Ranges of random sizes at random places (unaligned too), some sharing an allocation, in
    # one call, as staging makes it for every tensor of a device; the seed is in the message.
    program, backend = gpu
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    ptr = program.alloc(4 << 20)
    data = np.random.default_rng(seed).integers(0, 256, 4 << 20, dtype=np.uint8)
    program.put(ptr, data)
    ranges, at = [], 0
    while at < (4 << 20) - 64:
        at += rng.choice([0, 8, rng.randrange(1, 512)])
        nbytes = min(rng.choice([rng.randrange(1, 5000), rng.randrange(1, 300_000)]), (4 << 20) - at)
        ranges.append((at, nbytes))
        at += nbytes
    chunk_bytes = rng.choice([4096, 65536, 3000])
    out = backend.fingerprint_ranges(0, [(ptr + start, n) for start, n in ranges], chunk_bytes)
    backend.synchronize(0)
    expected = np.concatenate([fp.reference(data[start : start + n], chunk_bytes) for start, n in ranges])
    assert out.shape == expected.shape and (out == expected).all(), f"seed {seed}: {len(ranges)} ranges, {chunk_bytes=}"


def test_a_forked_writer_reads_what_was_staged_into_the_registered_arena(gpu):
    """The staging arena registered with the GPU (CUDA may mark registered memory do-not-fork:
    the mapping's VmFlags are printed), device bytes copied into it, then a forked child reads
    them through a mapping of its own, as the writer does."""
    from gpusnap.stage.arena import Arena, writer_view

    program, backend = gpu
    nbytes = 2 << 20
    arena = Arena(capacity=16 << 20)
    region = arena.reserve(nbytes, "device")
    pinned_at, pinned_bytes = arena.pinned  # where device staging lies, registered as staging registers it
    backend.register_host(arena.address + pinned_at, pinned_bytes)
    print("arena VmFlags after registration:", vmflags(arena.address + pinned_at))
    data = pattern("mixed", nbytes)
    ptr = program.alloc(nbytes)
    program.put(ptr, data)
    backend.copy_to_host(0, ptr, arena.address + region.offset, nbytes)
    backend.synchronize(0)
    fd, offset = arena.fd, region.offset
    assert in_child(lambda: bytes(writer_view(fd, offset, nbytes)) == data.tobytes()) == {"ok": True}
    backend.unregister_host(arena.address + pinned_at)
    program.free(ptr)


def test_the_kernel_agrees_with_the_definition_on_the_self_check(gpu):
    _, backend = gpu
    assert backend.fingerprint_agrees(0)


def test_the_self_check_catches_a_kernel_that_miscounts(gpu, monkeypatch):
    """A kernel that leaves out the last block of its grid (as a wrong launch size would on a
    GPU) fingerprints some chunks wrong: the self-check says so."""
    _, backend = gpu
    if backend.name != "fake":
        pytest.skip("the fake's kernel emulation is what this breaks")
    from gpusnap.device import kernels
    from gpusnap.device.fake import kernels as emulated

    real = emulated._EMULATIONS[kernels.FINGERPRINT_ACCUMULATE.encode()]
    monkeypatch.setitem(emulated._EMULATIONS, kernels.FINGERPRINT_ACCUMULATE.encode(),
                        lambda m, ctx, grid, block, args: real(m, ctx, grid - 1, block, args))
    assert not backend.fingerprint_agrees(0)
