"""Device staging (pipeline step 4) and its inverse on restore.

In the trainee, inside the stall (``stage_device_memory``):

1. list the device memory the program holds (``sources.device_ranges``: its raw cuda-python
   allocations, the blocks torch's caching allocator has handed out, CuPy's arrays, cuda.core's
   open Buffers);
2. synchronize the devices the program uses (``devices_in_use``: no new context anywhere), so
   that work the program enqueued and did not wait for is in the bytes staged;
3. fingerprint every store chunk of each range on the device (once per device and process,
   first checking that the kernel agrees with the fingerprint's definition on known bytes) and
   compare with the fingerprints of the last committed snapshot that wrote that range; unchanged chunks are not copied (the
   writer names them by that snapshot's chunk ids), ``--paranoid`` copies them all;
4. copy the dirty chunks device->host on gpusnap's stream into arena regions (``device`` and
   ``managed``), adjacent chunks as one copy; managed memory is copied here too, because a
   forked writer faults on it. The arena is registered with the GPU once (grown, never per
   snapshot), and the writer gets a ``DeviceStage``: plain data, no backend, no registry.

In the writer (``put_ranges``): each range becomes a buffer of its own name (``raw/<seq>`` for
raw memory, always written; a torch, CuPy or cuda.core range only where a storage, array or
Buffer of the pickled graph lies in it), its dirty chunks read from the arena through
``writer_view`` (mapped afresh from the memfd), its clean chunks by the previous snapshot's
ids. No CUDA call is made there.

On restore, in the replayed program at the merge: raw allocations (``restore_allocations``)
are matched by (call site, ordinal, size, kind) to ones the replay made and copied
host->device; the map {saved seq: new base} lets the graph's ``CUdeviceptr`` values land at the
new addresses, and an allocation without a match refuses the restore (exit 6). Tensors and
arrays come back by path: the merge copies their bytes into the live ones; cuda.core Buffers
too, through ``write_device_memory``, which boot hands the merge (restore never imports stage).
"""

from __future__ import annotations

import bisect
import ctypes
import sys
from dataclasses import dataclass, field

import numpy as np

from gpusnap import knobs
from gpusnap.device import fingerprint as fp
from gpusnap.device import open_backend, tracking
from gpusnap.device.backend import AllocKind
from gpusnap.errors import CudaCallFailed, GpusnapError, RestoreError, StageError
from gpusnap.stage.arena import trainee_arena, writer_view
from gpusnap.stage import sources
from gpusnap.stage.sources import DeviceRange, device_ranges

# Driver errors after which the device is gone for this process (fell off the bus, ECC, reset).
_LOST = {"CUDA_ERROR_DEVICE_UNAVAILABLE", "CUDA_ERROR_ECC_UNCORRECTABLE", "CUDA_ERROR_HARDWARE_STACK_ERROR",
         "CUDA_ERROR_ILLEGAL_ADDRESS", "CUDA_ERROR_LAUNCH_FAILED"}


@dataclass(frozen=True)
class StagedRange:
    """One range as the writer needs it; ``chunks[i]`` is the arena offset of store chunk i's
    staged bytes, or -1 when the chunk is clean (the previous snapshot's id serves)."""

    range: DeviceRange
    chunks: tuple
    dirty_bytes: int

    @property
    def buffer(self) -> str:
        return self.range.name

    def record(self) -> dict:
        """A raw allocation's entry in the manifest's ``allocations`` table."""
        a = self.range.allocation
        return {"seq": a.seq, "call_site": a.call_site, "ordinal": a.ordinal, "kind": a.kind.value,
                "device": a.device, "nbytes": a.nbytes, "api": a.api, "buffer": self.buffer,
                "dirty_bytes": self.dirty_bytes}


@dataclass(frozen=True)
class DeviceStage:
    ranges: list  # StagedRange, in source order: raw first
    previous: str | None  # the snapshot whose chunk ids the clean chunks reuse
    chunk_bytes: int
    devices: list = field(default_factory=list)
    used_bytes: dict = field(default_factory=dict)  # device -> memory the driver says is in use
    reserved_bytes: dict = field(default_factory=dict)  # device -> cached by an allocator, free
    core: dict = field(default_factory=dict)  # the open cuda.core Buffers: sources.CORE_BUFFERS

    def __post_init__(self) -> None:
        by_device: dict[int, list] = {}
        for staged in self.ranges:
            by_device.setdefault(staged.range.device, []).append(staged)
        for found in by_device.values():
            found.sort(key=lambda staged: staged.range.base)
        object.__setattr__(self, "_by_device", by_device)
        object.__setattr__(self, "_bases", {d: [s.range.base for s in found] for d, found in by_device.items()})

    @property
    def allocations(self) -> list:
        """The raw allocations among the ranges."""
        return [staged for staged in self.ranges if staged.range.owner == "raw"]

    def unaccounted(self) -> dict:
        """device -> bytes in use that no staged range accounts for and no allocator holds in
        reserve (what cuda.core pools keep, memory of functions bound before boot, CUDA's own)."""
        known = dict(self.reserved_bytes)
        for s in self.ranges:
            if s.range.kind is not AllocKind.MANAGED:
                known[s.range.device] = known.get(s.range.device, 0) + s.range.nbytes
        return {device: max(0, used - known.get(device, 0)) for device, used in self.used_bytes.items()}

    @property
    def dirty_bytes(self) -> int:
        return sum(s.dirty_bytes for s in self.ranges)

    def containing(self, device: int, address: int, nbytes: int = 1) -> tuple[StagedRange, int] | None:
        """(staged range, offset) holding ``nbytes`` at ``address`` on ``device``, or None."""
        bases = self._bases.get(device)
        if not bases:
            return None
        i = bisect.bisect_right(bases, address) - 1
        if i < 0:
            return None
        staged = self._by_device[device][i]
        offset = address - staged.range.base
        return (staged, offset) if offset + nbytes <= staged.range.nbytes else None

    def pointer(self, address: int):
        """(seq, offset) of the raw allocation holding ``address``, or None."""
        for staged in self.allocations:
            r = staged.range
            if r.base <= address < r.base + r.nbytes:
                return r.allocation.seq, address - r.base
        return None


class _State:
    def __init__(self):
        self.backend = None
        self.fingerprints: dict = {}  # range name -> fingerprints of the bytes that snapshot ``of`` holds
        self.of: str | None = None
        self.candidate: tuple | None = None  # (snap_id, fingerprints) staged, not known committed yet
        self.registered: tuple | None = None  # (offset, nbytes) of the arena registered with the GPU
        self.trusted: dict = {}  # device -> whether its fingerprints agree with their definition
        self.said_full = False  # the warning that the fingerprints found no device memory


_state = _State()


def backend():
    if _state.backend is None:
        _state.backend = open_backend(knobs.DEVICE)
    return _state.backend


def stage_device_memory(snap_id: str, committed, paranoid: bool = False) -> DeviceStage | None:
    """Stage the program's device memory for snapshot ``snap_id``. ``committed(snap_id)`` gives
    the buffer names an earlier snapshot wrote, or None when it is not committed (or no longer
    there): only a committed snapshot's chunk ids may be reused, and only for the ranges it
    wrote. None when the program holds no device memory (nor a cuda.core Buffer over host
    memory, whose pending copies must be done too). Raises ``StageError`` (the snapshot is
    skipped, training goes on) whatever fails: a snapshot never stops the program."""
    try:
        ranges = device_ranges()
    except Exception as exc:  # noqa: BLE001 - e.g. torch's memory snapshot under backend:cudaMallocAsync
        raise StageError(f"the program's device memory could not be listed: {_why(exc)}",
                         hint="this snapshot is skipped, training goes on; please report this with the GPU "
                              "and PYTORCH_CUDA_ALLOC_CONF") from exc
    if not ranges and not sources.CORE_BUFFERS:
        return None
    if _state.candidate is not None:
        snap, prints = _state.candidate
        _state.candidate = None
        written = committed(snap)
        if written is not None:
            _state.fingerprints = {name: p for name, p in prints.items() if name in written}
            _state.of = snap
    if _state.of is not None and committed(_state.of) is None:  # pruned or collected since
        _state.fingerprints, _state.of = {}, None
    try:
        return _stage(snap_id, ranges, paranoid)
    except StageError:
        raise
    except CudaCallFailed as exc:
        raise _staging_error(exc) from exc
    except Exception as exc:  # noqa: BLE001 - NoDevice, a bindings' surprise, a bug of ours: never the program's end
        raise StageError(f"staging device memory failed: {_why(exc)}",
                         hint="this snapshot is skipped, training goes on; please report this") from exc


def _why(exc: BaseException) -> str:
    """gpusnap's own message, or the exception's type and first line."""
    message = getattr(exc, "message", None) or (str(exc).splitlines() or [""])[0]
    return message if isinstance(exc, GpusnapError) else f"{type(exc).__name__}: {message}"


def _staging_error(exc: CudaCallFailed) -> StageError:
    code = getattr(exc, "code", "") or ""
    if code in _LOST:
        return StageError(f"a GPU was lost while staging device memory ({exc.message})",
                          hint="this snapshot is skipped; the program will fail on that GPU too: restart from the last snapshot on a healthy one")
    return StageError(f"a CUDA error while staging device memory: {exc.message}",
                      hint="this snapshot is skipped, training goes on; the next one tries again")


def _use(r: DeviceRange) -> str:
    return "managed" if r.kind is AllocKind.MANAGED else "device"


def _stage(snap_id: str, ranges: list, paranoid: bool) -> DeviceStage:
    gpu = backend()
    _refuse_own_contexts(gpu)
    used = gpu.devices_in_use()
    _synchronize_program(gpu, used)
    chunk_bytes = knobs.CHUNK_BYTES
    for ordinal in used:
        if _state.trusted.get(ordinal) is None:
            _state.trusted[ordinal] = _trust(gpu, ordinal)
    wanted: dict[int, list] = {}  # device -> its ranges to fingerprint, all in one launch
    for r in ranges:
        if r.nbytes >= knobs.FINGERPRINT_MIN_BYTES and _state.trusted.get(r.device):
            wanted.setdefault(r.device, []).append(r)
    try:
        tables = {device: gpu.fingerprint_ranges(device, [(r.base, r.nbytes) for r in found], chunk_bytes)
                  for device, found in wanted.items()}
    except CudaCallFailed as exc:
        if exc.code != "CUDA_ERROR_OUT_OF_MEMORY":  # the scratch buffer of a full GPU: copy every chunk
            raise
        _warn_full(exc)
        tables, wanted = {}, {}
    for ordinal in used:
        gpu.synchronize(ordinal)
    prints = {}
    for device, found in wanted.items():
        at = 0
        for r in found:
            count = fp.chunk_count(r.nbytes, chunk_bytes)
            prints[r.name] = tables[device][at : at + count]
            at += count
    previous = _state.fingerprints if _state.of is not None and not paranoid else {}
    spans = {r.name: fp.chunk_spans(r.nbytes, chunk_bytes) for r in ranges}
    dirty = {r.name: fp.dirty_chunks(previous.get(r.name), prints[r.name]) if r.name in prints else range(len(spans[r.name]))
             for r in ranges}

    plan = _Plan()
    # In address order, so that neighbouring blocks of one allocator segment become one copy.
    for r in sorted(ranges, key=lambda r: (r.device, r.base)):
        for run in _runs(dirty[r.name]):
            start = spans[r.name][run[0]][0]
            plan.add(r, run, start, sum(spans[r.name][i][1] for i in run))
    arena = trainee_arena()
    regions = {use: arena.reserve(nbytes, use) for use, nbytes in plan.need.items() if nbytes}
    if regions:
        _register(gpu, arena)
    offsets = {r.name: [-1] * len(spans[r.name]) for r in ranges}
    dirty_bytes = dict.fromkeys(offsets, 0)
    for device, use, src, at, nbytes, pieces, _ in plan.copies:
        gpu.copy_to_host(device, src, arena.address + regions[use].offset + at, nbytes)
        for r, run, start, length, piece_at in pieces:
            for i in run:
                offsets[r.name][i] = regions[use].offset + piece_at + spans[r.name][i][0] - start
            dirty_bytes[r.name] += length
    for ordinal in used:
        gpu.synchronize(ordinal)  # the staged bytes are in the arena: the writer may read them
    _state.candidate = (snap_id, prints)
    used_bytes = {ordinal: gpu.memory_used(ordinal) for ordinal in used}
    staged = [StagedRange(r, tuple(offsets[r.name]), dirty_bytes[r.name]) for r in ranges]
    return DeviceStage(staged, _state.of if previous else None, chunk_bytes, used, used_bytes, dict(sources.RESERVED),
                       dict(sources.CORE_BUFFERS))


class _Plan:
    """The device->host copies of a snapshot, laid out in the arena regions ``device`` and
    ``managed``: a dirty run that starts at most ``knobs.COPY_GAP_BYTES`` after the last one in
    the same driver allocation joins its copy, gap included (torch's allocator carves blocks out
    of one segment and rounds them up, so neighbours rarely touch), and the arena keeps the gap
    too: a few bytes for one copy instead of two. A copy never spans two driver allocations:
    the bytes between them need not be mapped."""

    def __init__(self):
        self.need = {"device": 0, "managed": 0}
        self.copies: list = []  # [device, use, src, offset in region, nbytes, pieces, unit]

    def add(self, r: DeviceRange, run: list, start: int, length: int) -> None:
        use, src = _use(r), r.base + start
        last = self.copies[-1] if self.copies else None
        gap = src - (last[2] + last[4]) if last is not None and last[6] == r.unit and last[1] == use else -1
        if 0 <= gap <= knobs.COPY_GAP_BYTES and last[3] + last[4] == self.need[use]:
            at = self.need[use] + gap
            last[4] += gap + length
            last[5].append((r, run, start, length, at))
        else:
            at = self.need[use]
            self.copies.append([r.device, use, src, at, length, [(r, run, start, length, at)], r.unit])
        self.need[use] = at + length


def _trust(gpu, ordinal: int) -> bool | None:
    """Whether ``ordinal``'s fingerprints may decide what is clean: a kernel that disagrees with
    the definition would pass changed chunks for clean ones, and one that cannot be built or
    loaded (NVRTC missing, no code for this GPU) decides nothing. Asked once per device and
    process; where the answer is no, every snapshot copies all of that device's memory, and
    says so once. None (ask again next time) where the check found no device memory to run in."""
    try:
        if gpu.fingerprint_agrees(ordinal):
            return True
        why = "disagrees with its definition"
    except CudaCallFailed as exc:
        if exc.code != "CUDA_ERROR_OUT_OF_MEMORY":
            why = f"cannot run ({exc.message})"
        else:
            _warn_full(exc)
            return None
    except Exception as exc:  # noqa: BLE001 - KernelBuildError, NoDevice (no NVRTC), whatever loading raised
        why = f"cannot be built ({_why(exc)})"
    try:
        name = f" ({gpu.device(ordinal).name})"
    except Exception:  # noqa: BLE001 - the name is only for the message
        name = ""
    print(f"gpusnap: warning: the fingerprint kernel {why} on device {ordinal}{name}: every snapshot copies all of its memory",
          file=sys.stderr, flush=True)
    print("hint: snapshots stay exact, only slower; please report this with the GPU, driver and CUDA versions",
          file=sys.stderr, flush=True)
    return False


def _warn_full(exc: CudaCallFailed) -> None:
    """Once per process: no device memory for the fingerprints (a full GPU), so a snapshot copies
    every chunk instead of failing; fingerprints come back once there is room."""
    if _state.said_full:
        return
    _state.said_full = True
    print(f"gpusnap: warning: no device memory for the dirty-chunk fingerprints ({exc.message}): "
          "snapshots copy all device memory until there is room", file=sys.stderr, flush=True)
    print("hint: snapshots stay exact, only slower; leave a few MB of the GPU free "
          "(PYTORCH_CUDA_ALLOC_CONF, torch.cuda.empty_cache())", file=sys.stderr, flush=True)


def _refuse_own_contexts(gpu) -> None:
    """A context the program made itself (cuCtxCreate, or current in this thread and no
    device's primary one) has memory that gpusnap, working in the primary contexts, would neither
    synchronize nor reach (a kernel of one context faults on another's memory): refuse the
    snapshot, naming it, rather than miss its memory."""
    registry = tracking.registry()
    made = dict(registry.contexts) if registry is not None else {}
    current = gpu.own_context()
    if current is not None and current[0] not in made:
        made[current[0]] = (current[1], "")
    if made:
        handle, (device, site) = next(iter(made.items()))
        where = f", made at {site}" if site else ""
        raise StageError(f"the program uses a CUDA context of its own (context {handle:#x} on device {device}{where}): "
                         "gpusnap stages the memory of the devices' primary contexts only",
                         hint="let the program use the primary context (cuDevicePrimaryCtxRetain, cudaSetDevice, torch, "
                              "CuPy); this snapshot is skipped, training goes on")


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


def _register(gpu, arena) -> None:
    """Keep the arena's pinned part (``Arena.pinned``: where device staging lies, and nothing
    else) registered with the GPU, as one range. It grows rarely (by doubling), never per
    snapshot: registration pins every page at ~1-2 GB/s. Its pages are never trimmed or
    populated afterwards, so they stay the ones the GPU copies into."""
    offset, nbytes = arena.pinned
    if _state.registered == (offset, nbytes) or not nbytes:
        return
    try:
        if _state.registered is not None:
            gpu.unregister_host(arena.address + _state.registered[0])
            _state.registered = None
        gpu.register_host(arena.address + offset, nbytes)
    except CudaCallFailed as exc:
        raise StageError(f"the staging arena could not be registered with the GPU ({nbytes:,} bytes): {exc.message}",
                         hint="raise the locked-memory limit (ulimit -l) or lower GPUSNAP_ARENA_BYTES; "
                              "this snapshot is skipped, training goes on") from exc
    _state.registered = (offset, nbytes)


# ---- the writer (a forked child: never a CUDA call, never the registry)


def put_ranges(stage: DeviceStage, arena_fd: int, sink, previous_buffers: dict, wanted: dict) -> dict:
    """Store every raw range and every other range named in ``wanted`` ({name: (dtype,
    typesize)}, what the pickled graph points into); returns {buffer name: record}."""
    buffers = {}
    for staged in stage.ranges:
        r = staged.range
        if not r.always_written and r.name not in wanted:
            continue
        dtype, typesize = wanted.get(r.name, ("uint8", 1))
        before = (previous_buffers.get(r.name) or {}).get("chunks") if stage.previous else None
        pieces = []
        for i, ((start, length), at) in enumerate(zip(fp.chunk_spans(r.nbytes, stage.chunk_bytes), staged.chunks)):
            if at >= 0:
                pieces.append(writer_view(arena_fd, at, length))
            elif before is not None and i < len(before) and before[i][1] == length:
                pieces.append(tuple(before[i]))
            else:
                owner = r.allocation.call_site if r.allocation is not None else f"{r.owner} memory at {r.base:#x}"
                raise StageError(f"chunk {i} of device memory {owner} was clean, but snapshot "
                                 f"{stage.previous} does not name it",
                                 hint="run with GPUSNAP_PARANOID=1 and report this")
        record = buffers[r.name] = sink.put_chunks(pieces, dtype=dtype, typesize=typesize)
        record["dirty_bytes"] = staged.dirty_bytes
        if r.owner != "raw":  # reached by storages, arrays or Buffers of the graph, by path
            record.update(kind=r.owner, device="cuda", device_index=r.device, memory=r.kind.value)
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
    # The replay's own pending work first (a fill it enqueued and did not wait for): gpusnap's
    # stream is not ordered with the program's, and that work landing after the snapshot's
    # bytes would overwrite them.
    _synchronize_program(gpu, gpu.devices_in_use())
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


def write_device_memory(address: int, data, host: bool = False) -> None:
    """Copy ``data`` into the replayed program's memory at ``address`` (a cuda.core Buffer the
    merge fills), once the work the program enqueued on its devices is done: device or managed
    memory on gpusnap's stream, then synchronized; host memory (a pinned Buffer) by the CPU.
    Raises ``CudaCallFailed``."""
    gpu = backend()
    _synchronize_program(gpu, gpu.devices_in_use())
    source = np.frombuffer(data, np.uint8)
    if host:
        ctypes.memmove(address, source.ctypes.data, source.nbytes)
        return
    ordinal = gpu.pointer(address).device
    gpu.copy_to_device(ordinal, address, source.ctypes.data, source.nbytes)
    gpu.synchronize(ordinal)
