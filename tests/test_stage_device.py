"""Device staging in the trainee, on the strict fake GPU: the bytes staged are the device's after
the program's pending work, only dirty chunks are copied, managed memory is staged by the parent
and never read by a forked child, and CUDA errors become one-line StageErrors."""

from __future__ import annotations

import numpy as np
import pytest

from device_helpers import Program, in_child
from gpusnap.device import fake, tracking
from gpusnap.device.calls import check
from gpusnap.device.fake import driver as cu
from gpusnap.device.registry import Registry, track, untrack
from gpusnap.errors import CudaCallFailed, RestoreError, StageError
from gpusnap.stage import device as staging
from gpusnap.stage.arena import trainee_arena, writer_view

CHUNK = 4 << 20  # knobs.CHUNK_BYTES in this process


@pytest.fixture
def gpu(monkeypatch):
    fake.reset(devices=1, device_bytes=64 << 20)
    reg = Registry()
    track(reg, cu)
    monkeypatch.setattr(tracking, "_registry", reg)
    monkeypatch.setattr(staging, "_state", staging._State())
    staging._state.backend = fake.FakeBackend()
    program = Program(cu)
    yield program
    untrack(cu)


def staged_bytes(stage, alloc_index: int) -> bytes:
    a = stage.allocations[alloc_index]
    return b"".join(bytes(writer_view(trainee_arena().fd, at, min(CHUNK, a.nbytes - i * CHUNK)))
                    for i, at in enumerate(a.chunks) if at >= 0)


def enqueue_fill(program, ptr: int, value: int, nbytes: int):
    stream = check("cuStreamCreate", cu.cuStreamCreate(1))
    check("cuMemsetD8Async", cu.cuMemsetD8Async(ptr, value, nbytes, stream))  # the program does not wait


def stage_after_pending_work(gpu):
    """Snapshot 1 of ones (committed), then the program enqueues nines and does not wait."""
    ptr = gpu.alloc(1 << 20)
    gpu.put(ptr, np.full(1 << 20, 1, np.uint8))
    staging.stage_allocations("000001", lambda snap: False)
    enqueue_fill(gpu, ptr, 9, 1 << 20)
    return staging.stage_allocations("000002", lambda snap: True)


def test_staging_synchronizes_the_programs_pending_work(gpu):
    stage = stage_after_pending_work(gpu)
    assert stage.dirty_bytes == 1 << 20
    assert staged_bytes(stage, 0) == b"\x09" * (1 << 20)


def test_a_missing_synchronize_is_caught_by_the_fake(gpu, monkeypatch):
    # The fake runs stream work only at synchronize: without the program's sync, the
    # fingerprints see the old bytes and the changed chunk passes for clean (the snapshot would
    # hold the previous one's bytes). This is what the test above guards against.
    monkeypatch.setattr(staging, "_synchronize_program", lambda gpu, used: None)
    stage = stage_after_pending_work(gpu)
    assert stage.dirty_bytes == 0


def test_only_dirty_chunks_are_copied_once_the_previous_snapshot_is_committed(gpu):
    ptr = gpu.alloc(3 * CHUNK)
    gpu.put(ptr, np.zeros(3 * CHUNK, np.uint8))
    first = staging.stage_allocations("000001", lambda snap: True)
    assert first.dirty_bytes == 3 * CHUNK and first.previous is None
    gpu.put(ptr + CHUNK, np.full(16, 5, np.uint8))
    second = staging.stage_allocations("000002", lambda snap: snap == "000001")
    assert second.previous == "000001"
    assert [at >= 0 for at in second.allocations[0].chunks] == [False, True, False]
    assert second.dirty_bytes == CHUNK
    assert staged_bytes(second, 0)[:17] == b"\x05" * 16 + b"\x00"


def test_chunks_are_not_reused_from_a_snapshot_that_was_not_committed(gpu):
    ptr = gpu.alloc(2 * CHUNK)
    gpu.put(ptr, np.zeros(2 * CHUNK, np.uint8))
    staging.stage_allocations("000001", lambda snap: False)
    again = staging.stage_allocations("000002", lambda snap: False)
    assert again.previous is None and again.dirty_bytes == 2 * CHUNK


def test_chunks_are_not_reused_from_a_snapshot_removed_since(gpu):
    ptr = gpu.alloc(2 * CHUNK)
    gpu.put(ptr, np.zeros(2 * CHUNK, np.uint8))
    staging.stage_allocations("000001", lambda snap: True)
    assert staging.stage_allocations("000002", lambda snap: snap == "000001").previous == "000001"
    again = staging.stage_allocations("000003", lambda snap: False)  # 000001 was pruned meanwhile
    assert again.previous is None and again.dirty_bytes == 2 * CHUNK


def test_paranoid_copies_every_chunk(gpu):
    ptr = gpu.alloc(2 * CHUNK)
    gpu.put(ptr, np.zeros(2 * CHUNK, np.uint8))
    staging.stage_allocations("000001", lambda snap: True)
    again = staging.stage_allocations("000002", lambda snap: True, paranoid=True)
    assert again.previous is None and again.dirty_bytes == 2 * CHUNK


def test_managed_memory_is_staged_by_the_parent_and_read_by_the_child_from_the_arena(gpu):
    ptr = gpu.managed(1 << 16)
    view = np.ctypeslib.as_array((np.ctypeslib.ctypes.c_uint8 * (1 << 16)).from_address(ptr))
    view[:] = 3
    stage = staging.stage_allocations("000001", lambda snap: False)
    a = stage.allocations[0]
    assert a.kind == "managed" and a.dirty_bytes == 1 << 16
    fd, at = trainee_arena().fd, a.chunks[0]
    assert in_child(lambda: bytes(writer_view(fd, at, 1 << 16)) == b"\x03" * (1 << 16)) == {"ok": True}
    assert in_child(lambda: int(view[0])) == {"signal": 11}  # the fake faults, as UVM does in a child


def test_a_cuda_error_while_staging_is_a_stage_error_with_a_hint(gpu, monkeypatch):
    gpu.alloc(1 << 16)

    def lost(*args):
        raise CudaCallFailed("cuCtxSynchronize failed", call="cuCtxSynchronize", code="CUDA_ERROR_DEVICE_UNAVAILABLE")

    monkeypatch.setattr(staging._state.backend, "synchronize", lost)
    with pytest.raises(StageError) as info:
        staging.stage_allocations("000001", lambda snap: False)
    assert info.value.message == "a GPU was lost while staging device memory (cuCtxSynchronize failed)"
    assert "restart from the last snapshot" in info.value.hint


def test_an_arena_that_cannot_be_registered_is_a_stage_error(gpu, monkeypatch):
    gpu.alloc(1 << 16)

    def refuse(address, nbytes):
        raise CudaCallFailed("cuMemHostRegister failed with CUDA_ERROR_OUT_OF_MEMORY", call="cuMemHostRegister",
                             code="CUDA_ERROR_OUT_OF_MEMORY")

    monkeypatch.setattr(staging._state.backend, "register_host", refuse)
    with pytest.raises(StageError) as info:
        staging.stage_allocations("000001", lambda snap: False)
    assert info.value.message.startswith("the staging arena could not be registered with the GPU (")
    assert "ulimit -l" in info.value.hint


def test_restore_refuses_an_allocation_without_a_counterpart(gpu):
    gpu.alloc(1 << 16)
    record = {"seq": 0, "call_site": "train.py:12", "ordinal": 0, "kind": "device", "nbytes": 1 << 17,
              "api": "cuMemAlloc", "buffer": "raw/0"}
    with pytest.raises(RestoreError) as info:
        staging.restore_allocations([record], lambda name: b"")
    assert info.value.exit_code == 6
    assert "train.py:12" in info.value.message
