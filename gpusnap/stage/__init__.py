"""Pipeline step 4: quiesce the devices and stage device memory into host memory.

This is the only step besides fork that stalls training. Its interface, in call order:

1. ``quiesce()``  — wait until every device the program uses is idle (torch.cuda.synchronize).
2. ``stage() -> dict``  — copy what changed since the last snapshot off the devices; returns
   {(device type, address, nbytes): host memoryview} for the pickler to read instead of the
   device pointer. The views must stay valid in the forked writer (MAP_SHARED, registered once).

Staged bytes live in the staging arena (``arena``): one memfd mapped MAP_SHARED in the trainee,
carved by one allocator into regions for device staging, managed memory, pinned CPU tensors and
the CPU drain, sized against host memory and the job's memory cgroup (``limits``). The trainee
reserves a snapshot's regions in the stall, ``writer_starting`` seals them into a generation
just before fork, and ``writer_done(generation)`` frees them once the writer is reaped, so a
snapshot taken while an earlier writer still reads stages elsewhere. When they do not fit the
snapshot is skipped (``ArenaFull``, a ``StageError``) and training goes on; the agent then
calls ``snapshot_skipped``.

CPU mode (what this package implements today) stages nothing in the stall: the fork itself gives
the writer a consistent copy of host memory. What it adds is after the fork: the writer *drains*
large CPU tensors into its drain region of the arena (``drain_region`` reserves it), so that the
trainee's next writes to them are not copy-on-write copies (``drain``); between snapshots, the
trainee reserves and populates the next drain region and collapses those tensors into huge pages
(``prepare``, ``hugepages``), in a background thread that a snapshot never waits for. A device
storage met by the pickler without a staged copy fails the snapshot with a ``CaptureError``
(restoring replayed device tensors would be a silent partial restore); so that this is known
before the fork, ``unstaged_device_memory()`` refuses the snapshot in the parent when the program
holds device memory that nothing stages.

Raw cuda-python allocations (the registry of ``device.tracking``) are staged by ``device``:
``stage_allocations`` in the stall, ``put_allocations`` in the writer, ``restore_allocations``
at a restart's merge.

Modules: ``device`` (raw device memory), ``arena`` (the arena, its regions, ``writer_view``), ``limits`` (host and cgroup memory),
``memory`` (raw views, madvise, page rounding), ``drain`` (the writer's copy of CPU tensors),
``prepare`` (the trainee's background work and the arena's writer-done path), ``hugepages``.
"""

from __future__ import annotations

import sys

from gpusnap.stage.device import put_allocations, restore_allocations, stage_allocations  # noqa: F401  (raw device memory)
from gpusnap.stage.arena import trainee_arena  # noqa: F401  (the trainee's arena, created on first use)
from gpusnap.stage.prepare import (  # noqa: F401  (between snapshots, and the arena's generations)
    arena_fd,
    drain_region,
    drained,
    prepare,
    preparing,
    snapshot_skipped,
    writer_done,
    writer_starting,
)


def quiesce() -> None:
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        for device in range(torch.cuda.device_count()):
            torch.cuda.synchronize(device)


def stage() -> dict:
    return {}


def unstaged_device_memory() -> str | None:
    """Why a snapshot cannot be taken, when the program holds CUDA memory that this build does
    not stage (asked in the parent, before the fork; training goes on)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return None
    held = {device: torch.cuda.memory_allocated(device) for device in range(torch.cuda.device_count())}
    held = {device: nbytes for device, nbytes in held.items() if nbytes}
    if not held:
        return None
    where = ", ".join(f"cuda:{device} {nbytes:,} bytes" for device, nbytes in held.items())
    return f"the program holds CUDA memory ({where}), which this version of gpusnap cannot stage yet"
