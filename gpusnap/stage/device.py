"""Device staging (pipeline step 4) and its inverse on restore, for raw cuda-python memory.

In the trainee, inside the stall (``stage_allocations``):

1. list the raw allocations the program holds (``device.tracking``'s registry);
2. synchronize the devices the program uses (``devices_in_use``: no new context anywhere), so
   that work the program enqueued and did not wait for is in the bytes staged;
3. fingerprint every store chunk of each allocation on the device and compare with the
   fingerprints of the last committed snapshot; unchanged chunks are not copied (the writer
   names them by that snapshot's chunk ids), ``--paranoid`` copies them all;
4. copy the dirty chunks device->host on gpusnap's stream into arena regions (``device`` and
   ``managed``), adjacent chunks as one copy; managed memory is copied here too, because a
   forked writer faults on it. The arena is registered with the GPU once (grown, never per
   snapshot), and the writer gets a ``DeviceStage``: plain data, no backend, no registry.

In the writer (``put_allocations``): each allocation becomes the buffer ``raw/<seq>``, its
dirty chunks read from the arena through ``writer_view`` (mapped afresh from the memfd), its
clean chunks by the previous snapshot's ids. No CUDA call is made there.

On restore (``restore_allocations``), in the replayed program at the merge: each saved
allocation is matched by (call site, ordinal, size, kind) to one the replay made, its bytes are
copied host->device into it, and the map {saved seq: new base} lets the graph's ``CUdeviceptr``
values land at the new addresses. An allocation without a match refuses the restore (exit 6).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from gpusnap import knobs
from gpusnap.device import fingerprint as fp
from gpusnap.device import open_backend, tracking
from gpusnap.device.backend import AllocKind
from gpusnap.errors import CudaCallFailed, RestoreError, StageError
from gpusnap.stage.arena import trainee_arena, writer_view

# Driver errors after which the device is gone for this process (fell off the bus, ECC, reset).
_LOST = {"CUDA_ERROR_DEVICE_UNAVAILABLE", "CUDA_ERROR_ECC_UNCORRECTABLE", "CUDA_ERROR_HARDWARE_STACK_ERROR",
         "CUDA_ERROR_ILLEGAL_ADDRESS", "CUDA_ERROR_LAUNCH_FAILED"}


@dataclass(frozen=True)
class StagedAllocation:
    """One raw allocation as the writer needs it; ``chunks[i]`` is the arena offset of store
    chunk i's staged bytes, or -1 when the chunk is clean (the previous snapshot's id serves)."""

    seq: int
    call_site: str
    ordinal: int
    kind: str
    device: int
    base: int
    nbytes: int
    api: str
    chunks: tuple
    dirty_bytes: int

    @property
    def buffer(self) -> str:
        return f"raw/{self.seq}"

    def record(self) -> dict:
        """Its entry in the manifest's ``allocations`` table."""
        return {"seq": self.seq, "call_site": self.call_site, "ordinal": self.ordinal, "kind": self.kind,
                "device": self.device, "nbytes": self.nbytes, "api": self.api, "buffer": self.buffer,
                "dirty_bytes": self.dirty_bytes}


@dataclass(frozen=True)
class DeviceStage:
    allocations: list
    previous: str | None  # the snapshot whose chunk ids the clean chunks reuse
    chunk_bytes: int
    devices: list = field(default_factory=list)
    used_bytes: dict = field(default_factory=dict)  # device -> memory the driver says is in use

    def unaccounted(self) -> dict:
        """device -> bytes in use that no tracked allocation accounts for (torch's caching
        allocator, cuda.core pools, functions bound before boot)."""
        tracked = {}
        for a in self.allocations:
            if a.kind != AllocKind.MANAGED.value:
                tracked[a.device] = tracked.get(a.device, 0) + a.nbytes
        return {device: max(0, used - tracked.get(device, 0)) for device, used in self.used_bytes.items()}

    @property
    def dirty_bytes(self) -> int:
        return sum(a.dirty_bytes for a in self.allocations)

    def pointer(self, address: int):
        """(seq, offset) of the allocation holding ``address``, or None."""
        for a in self.allocations:
            if a.base <= address < a.base + a.nbytes:
                return a.seq, address - a.base
        return None


class _State:
    backend = None
    fingerprints: dict = {}  # seq -> fingerprints of the bytes that snapshot ``of`` holds
    of: str | None = None
    candidate: tuple | None = None  # (snap_id, fingerprints) staged, not known committed yet
    registered_bytes = 0  # how much of the arena is registered with the GPU


_state = _State()


def backend():
    if _state.backend is None:
        _state.backend = open_backend(knobs.DEVICE)
    return _state.backend


def stage_allocations(snap_id: str, committed, paranoid: bool = False) -> DeviceStage | None:
    """Stage the program's raw allocations for snapshot ``snap_id``; ``committed(snap_id)``
    says whether an earlier snapshot was committed (only then may its chunk ids be reused).
    None when the program holds no raw device memory. Raises ``StageError`` (the snapshot is
    skipped, training goes on)."""
    registry = tracking.registry()
    live = registry.live() if registry is not None else []
    if not live:
        return None
    if _state.candidate is not None:
        snap, prints = _state.candidate
        _state.candidate = None
        if committed(snap):
            _state.fingerprints, _state.of = prints, snap
    if _state.of is not None and not committed(_state.of):  # pruned or collected since
        _state.fingerprints, _state.of = {}, None
    try:
        return _stage(snap_id, live, paranoid)
    except CudaCallFailed as exc:
        raise _staging_error(exc) from exc


def _staging_error(exc: CudaCallFailed) -> StageError:
    code = getattr(exc, "code", "") or ""
    if code in _LOST:
        return StageError(f"a GPU was lost while staging device memory ({exc.message})",
                          hint="this snapshot is skipped; the program will fail on that GPU too: restart from the last snapshot on a healthy one")
    return StageError(f"a CUDA error while staging device memory: {exc.message}",
                      hint="this snapshot is skipped, training goes on; the next one tries again")


def _stage(snap_id: str, live, paranoid: bool) -> DeviceStage:
    gpu = backend()
    used = gpu.devices_in_use()
    _synchronize_program(gpu, used)
    chunk_bytes = knobs.CHUNK_BYTES
    prints = {}
    for entry in live:
        prints[entry.seq] = out = np.zeros((fp.chunk_count(entry.nbytes, chunk_bytes), fp.FINGERPRINT_NBYTES), np.uint8)
        gpu.fingerprint(entry.device, entry.base, entry.nbytes, chunk_bytes, out)
    for ordinal in used:
        gpu.synchronize(ordinal)
    previous = _state.fingerprints if _state.of is not None and not paranoid else {}
    dirty = {entry.seq: fp.dirty_chunks(previous.get(entry.seq), prints[entry.seq]) for entry in live}
    spans = {entry.seq: fp.chunk_spans(entry.nbytes, chunk_bytes) for entry in live}

    def use(entry) -> str:
        return "managed" if entry.kind is AllocKind.MANAGED else "device"

    need = {"device": 0, "managed": 0}
    for entry in live:
        need[use(entry)] += sum(spans[entry.seq][i][1] for i in dirty[entry.seq])
    arena = trainee_arena()
    regions = {name: arena.reserve(nbytes, name) for name, nbytes in need.items() if nbytes}
    if regions:
        _register(gpu, arena, max(region.end for region in regions.values()))
    cursor = {name: region.offset for name, region in regions.items()}
    staged = []
    for entry in live:
        offsets = [-1] * len(spans[entry.seq])
        dirty_bytes = 0
        for run in _runs(dirty[entry.seq]):
            start = spans[entry.seq][run[0]][0]
            length = sum(spans[entry.seq][i][1] for i in run)
            at = cursor[use(entry)]
            gpu.copy_to_host(entry.device, entry.base + start, arena.address + at, length)
            for i in run:
                offsets[i] = at + spans[entry.seq][i][0] - start
            cursor[use(entry)] += length
            dirty_bytes += length
        staged.append(StagedAllocation(entry.seq, entry.call_site, entry.ordinal, entry.kind.value, entry.device,
                                       entry.base, entry.nbytes, entry.api, tuple(offsets), dirty_bytes))
    for ordinal in used:
        gpu.synchronize(ordinal)  # the staged bytes are in the arena: the writer may read them
    _state.candidate = (snap_id, prints)
    used_bytes = {ordinal: gpu.memory_used(ordinal) for ordinal in used}
    return DeviceStage(staged, _state.of if previous else None, chunk_bytes, used, used_bytes)


def _synchronize_program(gpu, used) -> None:
    """The program's own work first: it may not have waited for what it enqueued (swappable:
    a test shows that the fake catches a staging step without it)."""
    for ordinal in used:
        gpu.synchronize(ordinal)


def _runs(indices) -> list[list[int]]:
    """Consecutive chunk indices grouped: each group is one copy."""
    runs: list[list[int]] = []
    for i in (int(i) for i in indices):
        if runs and runs[-1][-1] == i - 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return runs


def _register(gpu, arena, end: int) -> None:
    """Keep [arena start, end) registered with the GPU. The arena is sparse and may grow to
    all of host memory, and registering pins (allocates) every page, so what is registered is
    the part staging has used, grown by doubling: rarely, never per snapshot."""
    if end <= _state.registered_bytes:
        return
    nbytes = min(max(end, 2 * _state.registered_bytes), arena.capacity)
    try:
        if _state.registered_bytes:
            gpu.unregister_host(arena.address)
            _state.registered_bytes = 0
        gpu.register_host(arena.address, nbytes)
    except CudaCallFailed as exc:
        raise StageError(f"the staging arena could not be registered with the GPU ({nbytes:,} bytes): {exc.message}",
                         hint="raise the locked-memory limit (ulimit -l) or lower GPUSNAP_ARENA_BYTES; "
                              "this snapshot is skipped, training goes on") from exc
    _state.registered_bytes = nbytes


# ---- the writer (a forked child: never a CUDA call, never the registry)


def put_allocations(stage: DeviceStage, arena_fd: int, sink, previous_buffers: dict) -> dict:
    """Store every staged allocation; returns {buffer name: record} for the manifest."""
    buffers = {}
    for a in stage.allocations:
        before = (previous_buffers.get(a.buffer) or {}).get("chunks") if stage.previous else None
        pieces = []
        for i, ((start, length), at) in enumerate(zip(fp.chunk_spans(a.nbytes, stage.chunk_bytes), a.chunks)):
            if at >= 0:
                pieces.append(writer_view(arena_fd, at, length))
            elif before is not None and i < len(before) and before[i][1] == length:
                pieces.append(tuple(before[i]))
            else:
                raise StageError(f"chunk {i} of raw allocation {a.call_site} was clean, but snapshot "
                                 f"{stage.previous} does not name it",
                                 hint="run with GPUSNAP_PARANOID=1 and report this")
        buffers[a.buffer] = sink.put_chunks(pieces, dtype="uint8", typesize=1)
        buffers[a.buffer]["dirty_bytes"] = a.dirty_bytes
    return buffers


# ---- restore (the replayed trainee, at the merge)


def restore_allocations(records: list, read_buffer) -> dict:
    """Copy each saved allocation's bytes into the replayed program's matching allocation;
    returns {saved seq: new base}. ``read_buffer(name)`` gives a buffer's bytes."""
    registry = tracking.registry()
    live = registry.live() if registry is not None else []
    by_key = {(e.call_site, e.ordinal, e.nbytes, e.kind.value): e for e in live}
    matched = []
    for record in records:
        entry = by_key.get((record["call_site"], record["ordinal"], record["nbytes"], record["kind"]))
        if entry is None:
            raise RestoreError(
                f"raw {record['kind']} memory allocated at {record['call_site']} ({record['api']} call "
                f"#{record['ordinal']}, {record['nbytes']:,} bytes) has no counterpart in the replayed program",
                hint="the replay must make the same cuda-python allocations (same call sites, order and sizes) "
                     "before the resume point")
        matched.append((record, entry))
    if not matched:
        return {}
    gpu = backend()
    keep = []
    for record, entry in matched:
        data = np.frombuffer(read_buffer(record["buffer"]), np.uint8).copy()
        keep.append(data)
        try:
            gpu.copy_to_device(entry.device, entry.base, data.ctypes.data, entry.nbytes)
        except CudaCallFailed as exc:
            raise RestoreError(f"restoring raw memory of {record['call_site']} failed: {exc.message}", hint=exc.hint) from exc
    for ordinal in sorted({entry.device for _, entry in matched}):
        gpu.synchronize(ordinal)
    return {record["seq"]: entry.base for record, entry in matched}
