"""cuda.core Buffers on restore: the snapshot's bytes into the replayed program's Buffer at the
same path, or into one made for it.

A Buffer of the snapshot loads as a ``graph.load.CoreBuffer`` (its bytes on the host). Where the
replayed program holds an open Buffer at that place, ``merge_into`` copies the bytes into it; one
of another size or kind of memory is a ``StateMismatch`` naming the path (exit 6). Where it holds
none (a Buffer made during training), ``build`` makes one through the program's own cuda.core and
fills it: device memory from the memory resource of the ``Device`` the device map gives
(``graph.devicemap``), managed memory from a ``ManagedMemoryResource``, pinned or host memory from
a ``LegacyPinnedMemoryResource``. Making one needs that device set current in the thread
(``Device.set_current()``) and the GPUs cuda.core sees; without them the restart refuses,
naming the path.

The copy is the device side's: ``write(address, data, host)`` is
``stage.device.write_device_memory``, handed to the merge by boot (restore never imports stage):
it waits for the program's pending work, copies on gpusnap's stream and waits again.
"""

from __future__ import annotations

import sys

from gpusnap.errors import StateMismatch
from gpusnap.graph.devicemap import target
from gpusnap.graph.load import CoreBuffer


def is_buffer(obj) -> bool:
    core = sys.modules.get("cuda.core")
    return core is not None and isinstance(obj, core.Buffer)


def merge_into(live, snap: CoreBuffer, path, write):
    """The Buffer that stands at ``path`` once ``snap`` is merged into ``live``: ``live`` with the
    snapshot's bytes, or, where the replay's Buffer is closed, a new one."""
    if snap.kind == "closed":
        live.close()
        return live
    if live.is_closed:
        return build(snap, path, write)
    if live.size != snap.nbytes:
        raise StateMismatch(f"{path}: the snapshot holds a cuda.core Buffer of {snap.nbytes:,} bytes, "
                            f"the replayed program one of {live.size:,} bytes")
    if not snap.nbytes:
        return live
    kind = "managed" if live.is_managed else "host" if live.is_host_accessible else "device"
    if kind != ("host" if snap.host else snap.kind):
        raise StateMismatch(f"{path}: the snapshot holds a cuda.core Buffer of {snap.kind} memory, "
                            f"the replayed program one of {kind} memory")
    _fill(live, snap, path, write)
    return live


def build(snap: CoreBuffer, path, write):
    """A Buffer made for ``snap`` in this process, holding its bytes."""
    core = sys.modules.get("cuda.core")
    if core is None:
        raise StateMismatch(f"{path}: the snapshot holds a cuda.core Buffer, and the replayed program did not import cuda.core")
    if not snap.nbytes:
        buffer = core.Buffer.from_handle(0, 0)
        if snap.kind == "closed":
            buffer.close()
        return buffer
    try:
        buffer = _allocate(core, snap)
    except Exception as exc:  # noqa: BLE001 - whatever cuda.core raised: this place cannot be restored
        raise StateMismatch(f"{path}: the snapshot holds a cuda.core Buffer of {snap.nbytes:,} bytes of {snap.kind} "
                            f"memory that the replayed program does not hold, and making one failed: {_why(exc)}",
                            hint="make the Buffer before the training loop, or set its device current "
                                 "(Device(n).set_current()) before the loop") from exc
    _fill(buffer, snap, path, write)
    return buffer


def _allocate(core, snap: CoreBuffer):
    if snap.host:
        return core.LegacyPinnedMemoryResource().allocate(snap.nbytes)
    where = target(f"cuda:{snap.device}", gpus=_gpus(core))
    if where == "cpu":
        raise StateMismatch(f"cuda:{snap.device} maps to no GPU here (none visible, or GPUSNAP_DEVICE_MAP says cpu)")
    device = core.Device(int(where.partition(":")[2]))
    stream = device.create_stream()  # the allocation is stream-ordered: usable once it got there
    resource = core.ManagedMemoryResource() if snap.kind == "managed" else device.memory_resource
    buffer = resource.allocate(snap.nbytes, stream=stream)
    stream.sync()
    return buffer


def _gpus(core) -> int:
    """The GPUs cuda.core sees, as CUDA counts them (CUDA_VISIBLE_DEVICES applies):
    ``Device.get_all_devices`` asks ``cuda.core.system``, which may count through NVML."""
    count = 0
    while True:
        try:
            core.Device(count)
        except ValueError:
            return count
        count += 1


def _fill(buffer, snap: CoreBuffer, path, write) -> None:
    try:
        write(int(buffer.handle), snap.data, host=snap.host)
    except Exception as exc:  # noqa: BLE001 - a driver error while copying: never a partial restore
        raise StateMismatch(f"{path}: copying the snapshot's {snap.nbytes:,} bytes into the cuda.core Buffer failed: "
                            f"{_why(exc)}") from exc


def _why(exc: Exception) -> str:
    """gpusnap's own message, or the exception's type and text (cuda.core's CUDAError)."""
    return getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"
