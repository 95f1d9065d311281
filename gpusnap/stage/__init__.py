"""Pipeline step 4: quiesce the devices and stage device memory into host memory.

This is the only step besides fork that stalls training. Its entry point,
``stage_device_memory(snap_id, committed, paranoid) -> DeviceStage | None``, quiesces and
stages: it synchronizes every device the program uses (only those: a context made on another
would cost that GPU memory, and every rank of a job would make one on every GPU), so that the
program's pending work is in the bytes, then copies what changed since the last snapshot off
the devices into the staging arena, for every range of device memory the program holds
(``sources``: raw cuda-python allocations, torch's CUDA storages, CuPy arrays, cuda.core
Buffers). The forked writer reads the staged bytes from the arena (``put_ranges``), and the
pickler finds the range under each device storage it meets (``DeviceStage.containing``).

Staged bytes live in the staging arena (``arena``): one memfd mapped MAP_SHARED in the trainee,
carved by one allocator into regions for device staging, managed memory, pinned CPU tensors and
the CPU drain, sized against host memory and the job's memory cgroup (``limits``). The trainee
reserves a snapshot's regions in the stall, ``writer_starting`` seals them into a generation
just before fork, and ``writer_done(generation)`` frees them once the writer is reaped, so a
snapshot taken while an earlier writer still reads stages elsewhere. When they do not fit the
snapshot is skipped (``ArenaFull``, a ``StageError``) and training goes on; the agent then
calls ``snapshot_skipped``.

Host memory needs no staging in the stall: the fork itself gives the writer a consistent copy.
What this package adds is after the fork: the writer *drains* large CPU tensors into its drain
region of the arena (``drain_region`` reserves it), so that the trainee's next writes to them
are not copy-on-write copies (``drain``); between snapshots, the trainee reserves and populates
the next drain region and collapses those tensors into huge pages (``prepare``, ``hugepages``),
in a background thread that a snapshot never waits for. A device storage the pickler meets
outside every staged range (memory no source lists) fails the snapshot with a ``CaptureError``:
keeping the replayed tensor on restore would be a silent partial restore.

Host memory that fork does not pass on (CUDA's pinned memory, do-not-fork mappings) is staged
in the stall too, by ``stage_unforked(frames)``: what the frames on the snapshot's path hold of
it, and every cuda.core Buffer over host memory, is copied into the arena's ``pinned`` region,
where the writer reads it.

Modules: ``sources`` (which device memory there is), ``device`` (staging it, writing it,
restoring raw allocations, filling cuda.core Buffers on restore), ``unforked`` (pinned and
do-not-fork host memory), ``arena`` (the arena, its regions, ``writer_view``), ``limits`` (host
and cgroup memory), ``memory`` (raw views, madvise, page rounding), ``drain`` (the writer's copy
of CPU tensors), ``prepare`` (the trainee's background work and the arena's writer-done path),
``hugepages``.
"""

from __future__ import annotations

from gpusnap.stage.device import (  # noqa: F401  (device memory)
    put_ranges,
    restore_allocations,
    stage_device_memory,
    write_device_memory,
)
from gpusnap.stage.unforked import stage_unforked  # noqa: F401  (host memory fork does not pass on)
from gpusnap.stage.arena import trainee_arena  # noqa: F401  (the trainee's arena, created on first use)
from gpusnap.stage.prepare import (  # noqa: F401  (between snapshots, and the arena's generations)
    arena_fd,
    drain_region,
    drained,
    prepare,
    preparing,
    snapshot_skipped,
    window_memory,
    window_region,
    writer_done,
    writer_starting,
)

