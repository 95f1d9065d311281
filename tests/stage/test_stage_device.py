"""Device staging in the trainee, on the strict fake GPU: the bytes staged are the device's after
the program's pending work, only dirty chunks are copied, managed memory is staged by the parent
and never read by a forked child, and CUDA errors become one-line StageErrors. cuda.core
Buffers (on the fake cuda.core): listed by kind, pickled as their span of a staged range (or a
buffer of their own, over host memory), loaded as host copies, merged into the replay's Buffers
or made anew."""

from __future__ import annotations

import pickle
import sys

import numpy as np
import pytest

from device_helpers import Program, in_child
from gpusnap import knobs
from gpusnap.device import fake, tracking
from gpusnap.device.backend import ORIGINAL_ATTR, AllocKind
from gpusnap.device.calls import check
from gpusnap.device.fake import driver as cu
from gpusnap.device.registry import Registry, track, untrack
from gpusnap.errors import CaptureError, CudaCallFailed, RestoreError, StageError, StateMismatch
from gpusnap.stage import device as staging
from gpusnap.stage import sources
from gpusnap.stage.arena import trainee_arena, writer_view
from gpusnap.store import RunDir

CHUNK = 4 << 20  # knobs.CHUNK_BYTES in this process
ANY = object()


class _Every:
    def __contains__(self, name) -> bool:
        return True


def committed(*snaps):
    """A ``committed`` callback: the named snapshots are committed with every buffer staged
    (``ANY``: every snapshot is), the others are not."""
    return lambda snap: _Every() if ANY in snaps or snap in snaps else None


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


def staged_bytes(stage, index: int) -> bytes:
    a = stage.ranges[index]
    return b"".join(bytes(writer_view(trainee_arena().fd, at, min(CHUNK, a.range.nbytes - i * CHUNK)))
                    for i, at in enumerate(a.chunks) if at >= 0)


def enqueue_fill(program, ptr: int, value: int, nbytes: int):
    stream = check("cuStreamCreate", cu.cuStreamCreate(1))
    check("cuMemsetD8Async", cu.cuMemsetD8Async(ptr, value, nbytes, stream))  # the program does not wait


def stage_after_pending_work(gpu):
    """Snapshot 1 of ones (committed), then the program enqueues nines and does not wait."""
    ptr = gpu.alloc(1 << 20)
    gpu.put(ptr, np.full(1 << 20, 1, np.uint8))
    staging.stage_device_memory("000001", committed())
    enqueue_fill(gpu, ptr, 9, 1 << 20)
    return staging.stage_device_memory("000002", committed(ANY))


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
    first = staging.stage_device_memory("000001", committed(ANY))
    assert first.dirty_bytes == 3 * CHUNK and first.previous is None
    gpu.put(ptr + CHUNK, np.full(16, 5, np.uint8))
    second = staging.stage_device_memory("000002", committed("000001"))
    assert second.previous == "000001"
    assert [at >= 0 for at in second.allocations[0].chunks] == [False, True, False]
    assert second.dirty_bytes == CHUNK
    assert staged_bytes(second, 0)[:17] == b"\x05" * 16 + b"\x00"


def test_chunks_are_not_reused_from_a_snapshot_that_was_not_committed(gpu):
    ptr = gpu.alloc(2 * CHUNK)
    gpu.put(ptr, np.zeros(2 * CHUNK, np.uint8))
    staging.stage_device_memory("000001", committed())
    again = staging.stage_device_memory("000002", committed())
    assert again.previous is None and again.dirty_bytes == 2 * CHUNK


def test_chunks_are_not_reused_from_a_snapshot_removed_since(gpu):
    ptr = gpu.alloc(2 * CHUNK)
    gpu.put(ptr, np.zeros(2 * CHUNK, np.uint8))
    staging.stage_device_memory("000001", committed(ANY))
    assert staging.stage_device_memory("000002", committed("000001")).previous == "000001"
    again = staging.stage_device_memory("000003", committed())  # 000001 was pruned meanwhile
    assert again.previous is None and again.dirty_bytes == 2 * CHUNK


def test_paranoid_copies_every_chunk(gpu):
    ptr = gpu.alloc(2 * CHUNK)
    gpu.put(ptr, np.zeros(2 * CHUNK, np.uint8))
    staging.stage_device_memory("000001", committed(ANY))
    again = staging.stage_device_memory("000002", committed(ANY), paranoid=True)
    assert again.previous is None and again.dirty_bytes == 2 * CHUNK


def test_managed_memory_is_staged_by_the_parent_and_read_by_the_child_from_the_arena(gpu):
    ptr = gpu.managed(1 << 16)
    view = np.ctypeslib.as_array((np.ctypeslib.ctypes.c_uint8 * (1 << 16)).from_address(ptr))
    view[:] = 3
    stage = staging.stage_device_memory("000001", committed())
    a = stage.allocations[0]
    assert a.range.kind.value == "managed" and a.dirty_bytes == 1 << 16
    fd, at = trainee_arena().fd, a.chunks[0]
    assert in_child(lambda: bytes(writer_view(fd, at, 1 << 16)) == b"\x03" * (1 << 16)) == {"ok": True}
    assert in_child(lambda: int(view[0])) == {"signal": 11}  # the fake faults, as UVM does in a child


def test_a_cuda_error_while_staging_is_a_stage_error_with_a_hint(gpu, monkeypatch):
    gpu.alloc(1 << 16)

    def lost(*args):
        raise CudaCallFailed("cuCtxSynchronize failed", call="cuCtxSynchronize", code="CUDA_ERROR_DEVICE_UNAVAILABLE")

    monkeypatch.setattr(staging._state.backend, "synchronize", lost)
    with pytest.raises(StageError) as info:
        staging.stage_device_memory("000001", committed())
    assert info.value.message == "a GPU was lost while staging device memory (cuCtxSynchronize failed)"
    assert "restart from the last snapshot" in info.value.hint


def test_an_arena_that_cannot_be_registered_is_a_stage_error(gpu, monkeypatch):
    gpu.alloc(1 << 16)

    def refuse(address, nbytes):
        raise CudaCallFailed("cuMemHostRegister failed with CUDA_ERROR_OUT_OF_MEMORY", call="cuMemHostRegister",
                             code="CUDA_ERROR_OUT_OF_MEMORY")

    monkeypatch.setattr(staging._state.backend, "register_host", refuse)
    with pytest.raises(StageError) as info:
        staging.stage_device_memory("000001", committed())
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


def test_restored_raw_memory_lands_after_the_replays_own_pending_work_in_every_stream_order(gpu, monkeypatch):
    """The replay fills its allocation and does not wait (a "synchronous" memset, still in
    flight on the legacy stream); restore copies on gpusnap's non-blocking stream. Unless it
    synchronizes the program's work first, CUDA may run the fill last and lose the restored
    bytes: the fake picks such orders, every seed here."""
    for seed in range(16):
        fake.reset(devices=1, device_bytes=64 << 20, seed=seed)
        monkeypatch.setattr(staging, "_state", staging._State())
        staging._state.backend = fake.FakeBackend()
        program = Program(cu)
        ptr = program.alloc(1 << 16)
        check("cuMemsetD8", cu.cuMemsetD8(ptr, 0, 1 << 16))  # the replay's setup, not waited for
        entry = tracking.registry().live()[-1]
        record = {"seq": 0, "call_site": entry.call_site, "ordinal": entry.ordinal, "kind": "device",
                  "nbytes": 1 << 16, "api": "cuMemAlloc", "buffer": "raw/0"}
        assert staging.restore_allocations([record], lambda name: b"\x07" * (1 << 16)) == {0: ptr}
        assert program.get(ptr, 1 << 16).tobytes() == b"\x07" * (1 << 16), f"seed {seed}"


# ---- ranges an allocator owns (torch's caching allocator, CuPy's pool), on the fake GPU:
# one segment allocated past the registry, carved into blocks, as those allocators do.


@pytest.fixture
def blocks(gpu, monkeypatch):
    segment = int(check("cuMemAlloc", getattr(cu.cuMemAlloc, ORIGINAL_ATTR)(16 << 20)))
    listed: list = []
    monkeypatch.setattr(sources, "SOURCES", (sources.raw_ranges, lambda: list(listed)))

    def block(offset: int, nbytes: int, fill: int, own_segment: bool = False) -> sources.DeviceRange:
        gpu.put(segment + offset, np.full(nbytes, fill, np.uint8))
        r = sources.DeviceRange(sources.owned_name("torch", 0, segment + offset, nbytes), "torch",
                                AllocKind.DEVICE, 0, segment + offset, nbytes, segment=0 if own_segment else segment)
        listed.append(r)
        return r

    return block


def test_neighbouring_blocks_are_copied_as_one_and_found_by_address(blocks, monkeypatch):
    _, b, _ = blocks(0, 1 << 20, 1), blocks((1 << 20) + 512, 1 << 20, 2), blocks(8 << 20, 1 << 20, 3)
    copies = []
    real = staging._state.backend.copy_to_host
    monkeypatch.setattr(staging._state.backend, "copy_to_host", lambda *args: copies.append(args) or real(*args))
    stage = staging.stage_device_memory("000001", committed())
    assert len(copies) == 2  # a and b with the 512 bytes between them, then c
    assert copies[0][3] == (2 << 20) + 512
    assert stage.ranges[1].chunks == ((1 << 20) + 512 + stage.ranges[0].chunks[0],)  # the gap kept in the arena too
    found, offset = stage.containing(0, b.base + 100, 16)
    assert found.range is b and offset == 100
    assert stage.containing(0, b.base + (1 << 20) - 8, 16) is None  # runs past the block's end
    assert stage.containing(1, b.base) is None
    assert staged_bytes(stage, 2) == b"\x03" * (1 << 20)  # ranges keep source order
    assert stage.allocations == []


def test_ranges_under_the_fingerprint_floor_are_copied_whole_at_every_snapshot(blocks, monkeypatch):
    monkeypatch.setattr(knobs, "FINGERPRINT_MIN_BYTES", 256 << 10)  # GPUSNAP_FINGERPRINT_MIN_BYTES
    small = blocks(0, 64 << 10, 7)
    staging.stage_device_memory("000001", committed())
    again = staging.stage_device_memory("000002", committed(ANY))
    assert again.ranges[0].range is small and again.ranges[0].dirty_bytes == 64 << 10  # no fingerprint: copied


def test_chunk_ids_are_reused_only_for_ranges_the_committed_snapshot_wrote(blocks):
    kept, dropped = blocks(0, 2 * CHUNK, 1), blocks(8 << 20, 2 * CHUNK, 2)
    staging.stage_device_memory("000001", committed())
    # Snapshot 1's graph reached only ``kept``: the writer stored it and left ``dropped`` out.
    again = staging.stage_device_memory("000002", lambda snap: {kept.name} if snap == "000001" else None)
    by_name = {s.range.name: s for s in again.ranges}
    assert again.previous == "000001"
    assert by_name[kept.name].dirty_bytes == 0
    assert by_name[dropped.name].dirty_bytes == 2 * CHUNK  # unchanged, yet no id to reuse


def test_only_the_ranges_the_graph_reaches_are_written(blocks, tmp_path):
    reached, other = blocks(0, 1 << 20, 4), blocks(4 << 20, 1 << 20, 5)
    rundir = RunDir.create(tmp_path / "run", {"command": {"kind": "script", "target": "t.py", "args": []}})
    sink = rundir.begin_snapshot("000001")
    stage = staging.stage_device_memory("000001", committed())
    buffers = staging.put_ranges(stage, trainee_arena().fd, sink, {}, {reached.name: ("float32", 4)})
    assert set(buffers) == {reached.name}
    record = buffers[reached.name]
    assert (record["kind"], record["device"], record["device_index"], record["dtype"]) == ("torch", "cuda", 0, "float32")
    sink.commit({"buffers": buffers})
    assert bytes(rundir.read_buffer(RunDir.open(tmp_path / "run").load_manifest("000001")["buffers"][reached.name])) == b"\x04" * (1 << 20)
    assert other.name not in buffers


class _Reduced:
    """Pickles as the reduction it is given: the stream the writer's pickler makes for an object."""

    def __init__(self, func, args):
        self.reduction = (func, args)

    def __reduce__(self):
        return self.reduction


def test_a_device_storage_travels_from_its_staged_range_to_a_cpu_tensor_placed_by_the_device_map(blocks, tmp_path):
    """The pickler's side of a CUDA storage (no CUDA here: a stand-in storage with the device,
    address and size torch's would have), the writer's range, the store, and the loader's side,
    through to the device map, which puts a tensor the replay does not hold on the CPU when
    there is no GPU."""
    import io
    import types

    import torch

    from gpusnap.capture.pickling.pickler import GraphPickler
    from gpusnap.graph.load import _rebuild_tensor, load_graph
    from gpusnap.restore import devices

    block = blocks(0, 1 << 20, 0)
    values = np.arange(1 << 18, dtype=np.float32)
    values_bytes = values.tobytes()
    cu.cuMemcpyHtoD(block.base, np.frombuffer(values_bytes, np.uint8), len(values_bytes))
    rundir = RunDir.create(tmp_path / "run", {"command": {"kind": "script", "target": "t.py", "args": []}})
    sink = rundir.begin_snapshot("000001")
    stage = staging.stage_device_memory("000001", committed())
    pickler = GraphPickler(io.BytesIO(), sink, device=stage)
    view_at = 4096  # a storage that starts inside the block, as a view made with from_blob would
    storage = types.SimpleNamespace(device=types.SimpleNamespace(type="cuda", index=0))
    key = ("cuda", block.base + view_at, (1 << 20) - view_at)
    func, args = pickler._reduce_device_storage(storage, key)
    assert args == (block.name, view_at, (1 << 20) - view_at, "cuda:0")
    assert pickler.device_wanted == {block.name: ("uint8", 1)} and pickler.storage_offsets == {key: view_at}
    buffers = staging.put_ranges(stage, trainee_arena().fd, sink, {}, pickler.device_wanted)
    sink.commit({"buffers": buffers})
    with pytest.raises(CaptureError, match="lies outside the device memory gpusnap staged"):
        pickler._reduce_device_storage(storage, ("cuda", block.base + (2 << 20), 16))

    count = ((1 << 20) - view_at) // 4
    storage_ref = _Reduced(func, args)
    stream = pickle.dumps([_Reduced(_rebuild_tensor, (storage_ref, 0, (count,), (1,), "float32", False, None, False, None)),
                           _Reduced(_rebuild_tensor, (storage_ref, 4, (2,), (1,), "float32", True, None, True, None))])
    saved = RunDir.open(tmp_path / "run").load_manifest("000001")["buffers"]
    placed: list = []
    tensor, param = load_graph(stream, lambda name: rundir.read_buffer(saved[name]), placed)
    assert tensor.device.type == "cpu" and tensor.tolist() == values[view_at // 4 :].tolist()
    assert isinstance(param, torch.nn.Parameter) and param.tolist() == values[view_at // 4 + 4 : view_at // 4 + 6].tolist()
    assert placed[0][0] is tensor and placed[1][0] is param  # the objects the graph holds
    assert [where for _, where in placed] == ["cuda:0", "cuda:0"]
    assert param.untyped_storage().data_ptr() == tensor.untyped_storage().data_ptr()
    if not torch.cuda.is_available():
        assert devices.place({}, placed) == {"cuda:0": "cpu"} and tensor.device.type == "cpu"


# ---- cuda.core Buffers, on the fake cuda.core (its allocations bypass the registry, as the real one's do)


@pytest.fixture
def core(gpu, monkeypatch):
    """The fake cuda.core as the program's, device 0 set current, and a stream of it."""
    monkeypatch.setitem(sys.modules, "cuda.core", fake.core)
    device = fake.core.Device(0)
    device.set_current()
    return device, device.create_stream()


def test_cuda_core_buffers_are_device_ranges_by_kind_and_host_ones_are_noted(core):
    device, stream = core
    weights = device.allocate(1 << 20, stream=stream)
    managed = fake.core.ManagedMemoryResource().allocate(1 << 16, stream=stream)
    pinned = fake.core.LegacyPinnedMemoryResource().allocate(1 << 16)
    closed = device.allocate(4096, stream=stream)
    closed.close()
    head = fake.core.Buffer.from_handle(weights.handle, 4096)  # a smaller Buffer at the same address
    ranges = {r.base: r for r in sources.device_ranges()}
    assert {base: (r.owner, r.kind, r.device, r.nbytes) for base, r in ranges.items()} == {
        weights.handle: ("core", AllocKind.DEVICE, 0, 1 << 20),
        managed.handle: ("core", AllocKind.MANAGED, 0, 1 << 16),  # no preferred device: the current one
    }
    assert ranges[weights.handle].name == sources.owned_name("core", 0, weights.handle, 1 << 20)
    assert sources.CORE_BUFFERS[pinned.handle] == (-1, "pinned", 1 << 16)
    assert sources.core_host_buffers() == [(pinned.handle, 1 << 16)]
    assert head.size == 4096 and not tracking.registry().live()


def test_cuda_core_buffers_travel_from_the_stage_to_host_copies_of_their_bytes(core, tmp_path):
    import ctypes
    import io

    from gpusnap.capture.pickling.pickler import GraphPickler
    from gpusnap.graph.load import load_graph
    from gpusnap.stage.unforked import stage_unforked

    device, stream = core
    weights = device.allocate(1 << 20, stream=stream)
    weights.fill(3, stream=stream)  # pending: staging waits for it
    managed = fake.core.ManagedMemoryResource().allocate(1 << 16, stream=stream)
    ctypes.memset(managed.handle, 5, 1 << 16)
    pinned = fake.core.LegacyPinnedMemoryResource().allocate(4096)
    ctypes.memset(pinned.handle, 7, 4096)
    closed = device.allocate(4096, stream=stream)
    closed.close()
    rundir = RunDir.create(tmp_path / "run", {"command": {"kind": "script", "target": "t.py", "args": []}})
    sink = rundir.begin_snapshot("000001")
    stage = staging.stage_device_memory("000001", committed())
    stream_bytes = io.BytesIO()
    pickler = GraphPickler(stream_bytes, sink, device=stage, unforked=stage_unforked([]))
    pickler.dump_graph({"w": weights, "m": managed, "p": pinned, "c": closed, "again": [weights]})
    buffers = {**pickler.buffers, **staging.put_ranges(stage, trainee_arena().fd, sink, {}, pickler.device_wanted)}
    assert set(pickler.device_wanted) == {f"core/cuda0/{weights.handle:x}/{1 << 20}", f"core/cuda0/{managed.handle:x}/{1 << 16}"}
    assert [(b["kind"], b["device"], b["memory"]) for b in buffers.values()] == [("core", "cpu", "pinned"), ("core", "cuda", "device"),
                                                                                ("core", "cuda", "managed")]
    sink.commit({"buffers": buffers})
    saved = RunDir.open(tmp_path / "run").load_manifest("000001")["buffers"]
    loaded = load_graph(stream_bytes.getvalue(), lambda name: rundir.read_buffer(saved[name]))
    assert [(b.kind, b.device, b.nbytes, bytes(b.data[:2])) for b in (loaded["w"], loaded["m"], loaded["p"], loaded["c"])] == [
        ("device", 0, 1 << 20, b"\x03\x03"), ("managed", 0, 1 << 16, b"\x05\x05"), ("pinned", -1, 4096, b"\x07\x07"),
        ("closed", -1, 0, b"")]
    assert loaded["again"][0] is loaded["w"]


def test_a_cuda_core_buffer_outside_the_staged_memory_fails_the_snapshot(core, tmp_path):
    import io

    from gpusnap.capture.pickling.pickler import GraphPickler

    device, stream = core
    device.allocate(4096, stream=stream)
    stage = staging.stage_device_memory("000001", committed())
    rundir = RunDir.create(tmp_path / "run", {"command": {"kind": "script", "target": "t.py", "args": []}})
    pickler = GraphPickler(io.BytesIO(), rundir.begin_snapshot("000001"), device=stage)
    stray = fake.core.Buffer.from_handle(0x1000, 4096)  # made after the stage: nothing staged it
    with pytest.raises(CaptureError) as info:
        pickler.dump_graph({"state": [stray]})
    assert info.value.message == "a cuda.core Buffer of 4,096 bytes at 0x1000 lies outside the memory gpusnap staged"


def _bytes_of(buffer, stream) -> bytes:
    """A device Buffer's bytes, through a pinned one."""
    import ctypes

    host = fake.core.LegacyPinnedMemoryResource().allocate(buffer.size)
    buffer.copy_to(host, stream=stream)
    stream.sync()
    return ctypes.string_at(host.handle, buffer.size)


def test_the_merge_fills_the_replays_buffers_and_makes_the_missing_ones(core):
    import ctypes

    from gpusnap.graph.load import CoreBuffer
    from gpusnap.restore.merge import Merger

    device, stream = core
    live = device.allocate(4096, stream=stream)
    live.fill(0, stream=stream)  # the replay's own pending work: done before the snapshot's bytes land
    data = bytes(range(256)) * 16
    merger = Merger(staging.write_device_memory)
    snap = {"w": CoreBuffer(memoryview(data), 0, "device", 4096), "made": CoreBuffer(data, 0, "managed", 4096),
            "pinned": CoreBuffer(data[:1024], -1, "pinned", 1024), "closed": CoreBuffer(b"", -1, "closed", 0)}
    state = merger.value({"w": live}, snap, "frame[1].locals.state")
    merger.finish()
    state = merger.settled(state)
    assert state["w"] is live and _bytes_of(live, stream) == data
    assert type(state["made"]).__name__ == "ManagedBuffer" and ctypes.string_at(state["made"].handle, 4096) == data
    assert state["pinned"].is_host_accessible and ctypes.string_at(state["pinned"].handle, 1024) == data[:1024]
    assert state["closed"].is_closed
    with pytest.raises(StateMismatch) as info:
        Merger(staging.write_device_memory).value({"w": live}, {"w": CoreBuffer(data * 2, 0, "device", 8192)}, "frame[1].locals")
    assert info.value.message == ("frame[1].locals['w']: the snapshot holds a cuda.core Buffer of 8,192 bytes, "
                                  "the replayed program one of 4,096 bytes")


def test_a_managed_buffer_that_prefers_the_host_is_staged_and_restored_through_the_current_device(core):
    """The driver names no device for managed memory that prefers the host
    (CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL -1): staging and restore go through the current one
    instead of refusing the Buffer."""
    import ctypes

    from gpusnap.graph.load import CoreBuffer
    from gpusnap.restore.merge import Merger

    device, stream = core
    options = fake.core.ManagedMemoryResourceOptions(preferred_location=-1)
    live = fake.core.ManagedMemoryResource(options).allocate(4096, stream=stream)
    ordinal = cu.CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
    assert cu.cuPointerGetAttribute(ordinal, live.handle) == (cu.CUresult.CUDA_SUCCESS, -1)
    ctypes.memset(live.handle, 9, 4096)
    stage = staging.stage_device_memory("000001", committed())
    assert [(s.range.device, s.range.kind, s.dirty_bytes) for s in stage.ranges] == [(0, AllocKind.MANAGED, 4096)]
    data = bytes(range(256)) * 16
    merger = Merger(staging.write_device_memory)
    state = merger.value({"m": live}, {"m": CoreBuffer(data, 0, "managed", 4096)}, "frame[1].locals")
    merger.finish()
    assert merger.settled(state)["m"] is live and ctypes.string_at(live.handle, 4096) == data


def test_a_buffer_the_replay_lacks_is_refused_where_its_device_was_never_set_current(core):
    import threading

    from gpusnap.graph.load import CoreBuffer
    from gpusnap.restore.merge import Merger

    refused = []

    def merge():  # another thread: cuda.core's Devices are per thread, and this one set none current
        merger = Merger(staging.write_device_memory)
        merger.value({}, {"made": CoreBuffer(bytes(4096), 0, "device", 4096)}, "frame[1].locals.state")
        try:
            merger.finish()
        except StateMismatch as exc:
            refused.append(exc)

    thread = threading.Thread(target=merge)
    thread.start()
    thread.join()
    assert refused[0].exit_code == 6
    assert refused[0].message == (
        "frame[1].locals.state['made']: the snapshot holds a cuda.core Buffer of 4,096 bytes of device memory that the "
        "replayed program does not hold, and making one failed: CUDAError: Device 0 is not yet initialized, perhaps you "
        "forgot to call .set_current() first?")


def test_a_copy_never_spans_two_driver_allocations(blocks, monkeypatch):
    blocks(0, 1 << 20, 1), blocks(1 << 20, 1 << 20, 2, own_segment=True)  # touching, yet two allocations
    copies = []
    real = staging._state.backend.copy_to_host
    monkeypatch.setattr(staging._state.backend, "copy_to_host", lambda *args: copies.append(args) or real(*args))
    stage = staging.stage_device_memory("000001", committed())
    assert [c[3] for c in copies] == [1 << 20, 1 << 20]
    assert staged_bytes(stage, 1) == b"\x02" * (1 << 20)


def test_a_kernel_that_disagrees_with_the_definition_is_never_trusted(gpu, monkeypatch, capsys):
    """Checked on known bytes once per device: a disagreeing kernel would pass changed chunks
    for clean ones, so every chunk is copied at every snapshot, and that is said once."""
    assert staging._state.backend.fingerprint_agrees(0)  # the fake's kernel emulation agrees
    monkeypatch.setattr(staging._state.backend, "fingerprint_agrees", lambda ordinal: False)
    ptr = gpu.alloc(2 * CHUNK)
    gpu.put(ptr, np.zeros(2 * CHUNK, np.uint8))
    staging.stage_device_memory("000001", committed(ANY))
    again = staging.stage_device_memory("000002", committed(ANY))
    assert again.dirty_bytes == 2 * CHUNK  # unchanged, copied all the same
    err = capsys.readouterr().err
    assert err.count("gpusnap: warning: the fingerprint kernel disagrees with its definition on device 0") == 1
    assert "hint: snapshots stay exact, only slower" in err


# ---- a snapshot never crashes the program


def test_a_kernel_that_cannot_be_built_is_never_used_and_that_is_said_once(gpu, monkeypatch, capsys):
    """NVRTC missing or failing, a module the GPU cannot load: staging copies every chunk, once
    the reason is said; it never fails the snapshot or the program."""
    from gpusnap.errors import KernelBuildError

    def broken(ordinal):
        raise KernelBuildError("NVRTC could not compile fingerprint.cu for sm_90: error: unknown")

    monkeypatch.setattr(staging._state.backend, "kernel_image", broken)
    ptr = gpu.alloc(2 * CHUNK)
    gpu.put(ptr, np.zeros(2 * CHUNK, np.uint8))
    staging.stage_device_memory("000001", committed(ANY))
    again = staging.stage_device_memory("000002", committed(ANY))
    assert again.dirty_bytes == 2 * CHUNK
    err = capsys.readouterr().err
    assert err.count("gpusnap: warning: the fingerprint kernel cannot be built (NVRTC could not compile fingerprint.cu "
                     "for sm_90: error: unknown) on device 0 (gpusnap fake device 0): every snapshot copies all of its memory") == 1
    assert err.count("\nhint: snapshots stay exact, only slower") == 1


def fill_the_device() -> list:
    """Allocate until the device has no byte left (past the registry: the program's allocator)."""
    alloc, hogs = getattr(cu.cuMemAlloc, ORIGINAL_ATTR), []
    for size in (1 << 20, 4096, 512):
        while True:
            status, ptr = alloc(size)
            if status != cu.CUresult.CUDA_SUCCESS:
                break
            hogs.append(int(ptr))
    return hogs


def test_a_full_gpu_copies_every_chunk_instead_of_failing_the_snapshot(gpu, capsys, monkeypatch):
    """No device memory left for the fingerprints' scratch buffer (the program's allocator holds
    the GPU): the snapshot copies every chunk, says so once, and later ones fingerprint again
    once there is room."""
    monkeypatch.setattr(knobs, "CHUNK_BYTES", 64 << 10)  # 128 chunks: a scratch buffer of 4 KiB
    ptr = gpu.alloc(2 * CHUNK)
    gpu.put(ptr, np.zeros(2 * CHUNK, np.uint8))
    staging.stage_device_memory("000001", committed(ANY))  # trusted, with a scratch buffer of its size
    hogs = fill_the_device()
    extra = gpu.managed(1 << 16)  # one more range: the chunk table outgrows the scratch buffer
    full = staging.stage_device_memory("000002", committed(ANY))
    assert full.dirty_bytes == 2 * CHUNK + (1 << 16)
    err = capsys.readouterr().err
    assert err.count("gpusnap: warning: no device memory for the dirty-chunk fingerprints (cuMemAlloc failed with "
                     "CUDA_ERROR_OUT_OF_MEMORY): snapshots copy all device memory until there is room") == 1
    for p in hogs:
        gpu.free(p)
    gpu.free(extra)
    later = staging.stage_device_memory("000003", committed(ANY))
    assert later.dirty_bytes == 2 * CHUNK  # fingerprinted again: nothing before had prints
    again = staging.stage_device_memory("000004", committed(ANY))
    assert again.dirty_bytes == 0


def test_a_source_that_raises_fails_the_snapshot_with_one_line(gpu, monkeypatch):
    def snapshot_unsupported():
        raise RuntimeError("cudaMallocAsync does not yet support _snapshot\nmore detail")

    monkeypatch.setattr(sources, "SOURCES", (sources.raw_ranges, snapshot_unsupported))
    with pytest.raises(StageError) as info:
        staging.stage_device_memory("000001", committed())
    assert info.value.message == ("the program's device memory could not be listed: "
                                  "RuntimeError: cudaMallocAsync does not yet support _snapshot")
    assert "training goes on" in info.value.hint


# ---- the arena's pinned pages, under every GPUSNAP_DRAIN


@pytest.mark.parametrize("drain_mode", ["keep", "release", "off"])
def test_staged_bytes_land_in_pages_the_writer_reads_under_every_drain_setting(gpu, monkeypatch, drain_mode):
    """Snapshots as the agent takes them, a writer still reading while the next one stages: its
    drain region trimmed behind it (keep), regions trimmed as writers finish (release). CUDA
    copies into the pages the arena's registration pinned; a page trimmed under it leaves the
    copy in an orphan the writer never sees (the fake models pages, not addresses), so every
    staged byte must come back through the writer's own mapping."""
    from gpusnap.rawmem import punch_hole
    from gpusnap.stage import arena as arena_module
    from gpusnap.stage import writer_done, writer_starting
    from gpusnap.stage.arena import Arena

    monkeypatch.setattr(knobs, "DRAIN", drain_mode)
    monkeypatch.setattr(arena_module, "_arena", Arena(capacity=64 << 20))
    arena = trainee_arena()
    small = gpu.alloc(1 << 20)
    step = iter(range(1, 100))

    def snapshot(extra=()):
        n = next(step)
        for ptr, nbytes in [(small, 1 << 20), *extra]:
            gpu.put(ptr, np.full(nbytes, n, np.uint8))
        stage = staging.stage_device_memory(f"{n:06d}", committed(ANY))
        for staged in stage.ranges:
            assert staged_bytes(stage, stage.ranges.index(staged)) == bytes([n]) * staged.range.nbytes, (drain_mode, n)
        region = arena.reserve(8 << 20, "drain") if drain_mode != "off" else None
        if region is not None and drain_mode == "keep":
            list(arena.populate(region))  # prepare's work between snapshots
        return writer_starting(), region

    def writer_finishes(generation, region):
        if region is not None and drain_mode == "keep":
            punch_hole(arena.fd, region.offset + (64 << 10), region.nbytes - (64 << 10))  # Drained.trim
        writer_done(generation)

    first = snapshot()
    second = snapshot()  # the first writer still reads
    writer_finishes(*first)
    big = gpu.alloc(4 << 20)
    third = snapshot([(big, 4 << 20)])  # more to stage: the staging may land where the first writer trimmed
    writer_finishes(*second)
    writer_finishes(*third)
    snapshot([(big, 4 << 20)])


def test_a_context_of_the_programs_own_refuses_the_snapshot_naming_it(gpu):
    """Memory of a context the program made itself is out of reach of the primary context that
    gpusnap works in (a kernel there faults on it, and its pending work is not synchronized):
    the snapshot is refused, naming the context, and the program's contexts are left as they were."""
    ptr = gpu.alloc(1 << 20)
    gpu.put(ptr, np.full(1 << 20, 4, np.uint8))
    own = check("cuCtxCreate", cu.cuCtxCreate(None, 0, gpu.dev))  # current in this thread now
    line = sys._getframe().f_lineno - 1
    theirs = int(check("cuMemAlloc", cu.cuMemAlloc(1 << 20)))
    check("cuMemsetD8", cu.cuMemsetD8(theirs, 5, 1 << 20))
    with pytest.raises(StageError) as info:
        staging.stage_device_memory("000001", committed())
    assert info.value.message == (f"the program uses a CUDA context of its own (context {int(own):#x} on device 0, made at "
                                  f"{__file__}:{line}): gpusnap stages the memory of the devices' primary contexts only")
    assert "this snapshot is skipped, training goes on" in info.value.hint
    assert gpu.get(theirs, 4).tolist() == [5] * 4  # its context is intact
    gpu.free(theirs)
    check("cuCtxDestroy", cu.cuCtxDestroy(own))
    assert gpu.get(ptr, 4).tolist() == [4] * 4  # and so is the primary one
    assert staging.stage_device_memory("000002", committed()).ranges[0].range.base == ptr
