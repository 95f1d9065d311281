"""Every failure a user can meet, as one hierarchy.

The CLI shows a ``GpusnapError`` as one line (``gpusnap: <message>``), then ``hint: <hint>``,
and exits with the class's ``exit_code``::

    GpusnapError                      1  anything else gpusnap refuses
    ├── UsageError                    2  bad arguments: durations, signal names, missing script
    ├── RunDirError                   3  the run directory is wrong for this command
    │   ├── RunDirMismatch               ... it belongs to a different command line
    │   ├── RunDirLocked                 ... another live process holds its lock
    │   ├── RunDirPermission             ... not writable / owned by someone else / read-only mount
    │   ├── FormatVersionError           ... a file (run.json, manifest, index, pack) of a version
    │   │                                    this gpusnap does not know
    │   └── NoActiveRun                  ... `gpusnap snap`: no supervisor is running in it
    ├── StoreError                    4  reading or writing snapshot data failed
    │   ├── ChunkCorrupt                 ... a chunk's bytes do not match its name
    │   ├── ChunkMissing                 ... a manifest names a chunk no pack holds
    │   ├── NoSpace                      ... ENOSPC while writing
    │   ├── SnapshotNotFound             ... no such snapshot id / no snapshot at all
    │   ├── StoreDamaged                 ... `gpusnap verify` found damage
    │   └── ExportError                  ... a tensor cannot be written as safetensors
    ├── SnapshotError                 5  one snapshot could not be taken (training goes on)
    │   ├── HeadroomError                ... copy-on-write worst case would not fit in RAM
    │   ├── CaptureError                 ... the object graph could not be captured
    │   ├── StageError                   ... host staging (gpusnap/stage/) failed
    │   │   ├── ChildRunning                 ... a process the program started is running
    │   │   └── ArenaFull                    ... the staging arena cannot hold what is staged
    │   └── DeviceError                  ... the GPU side (gpusnap/device/) failed
    │       ├── NoDevice                     ... no driver, no CUDA device, bindings missing
    │       ├── CudaCallFailed               ... a driver/runtime call returned an error code
    │       └── KernelBuildError             ... NVRTC could not compile a gpusnap kernel
    └── RestoreError                  6  restart refused rather than restore wrong state
        ├── ReplayDiverged               ... replay never reached the saved loop position
        ├── StateMismatch                ... shape / dtype differs at an object path
        ├── ProgramChanged               ... script, sources or arguments differ
        ├── FastForwardError             ... a loop's position cannot be reproduced exactly
        └── FilesNotRestorable           ... a file the program wrote cannot be put back as it
                                             was at the snapshot (removed, too large to keep)

``gpusnap run`` itself passes the program's exit status through; see ``EXIT_*`` below and the
README's table.
"""

from __future__ import annotations

# Exit statuses of `gpusnap run` / `gpusnap restart` that are not the program's own.
EXIT_PREEMPTED = 75  # EX_TEMPFAIL: stopped by SIGTERM after a committed snapshot; requeue me
EXIT_PREEMPTED_UNSAVED = 76  # stopped by SIGTERM, but no snapshot was committed within --grace


class GpusnapError(Exception):
    exit_code = 1
    default_hint = "run with --help for usage"

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint or self.default_hint

    def __str__(self) -> str:
        return self.message


class UsageError(GpusnapError):
    exit_code = 2


class RunDirError(GpusnapError):
    exit_code = 3
    default_hint = "pass another directory with --dir"


class RunDirMismatch(RunDirError):
    pass


class RunDirLocked(RunDirError):
    default_hint = "wait for the other run to finish, or pass another --dir"


class RunDirPermission(RunDirError):
    pass


class FormatVersionError(RunDirError):
    default_hint = "use the gpusnap version that wrote this directory"


class NoActiveRun(RunDirError):
    default_hint = "start the program with `gpusnap run --dir DIR ...`, or continue it with `gpusnap restart DIR`"


class StoreError(GpusnapError):
    exit_code = 4
    default_hint = "run `gpusnap verify DIR` to see what is damaged"


class ChunkCorrupt(StoreError):
    pass


class ChunkMissing(StoreError):
    pass


class NoSpace(StoreError):
    default_hint = "free disk space or lower --keep; earlier snapshots are intact"


class SnapshotNotFound(StoreError):
    default_hint = "list the snapshots with `gpusnap ls DIR`"


class StoreDamaged(StoreError):
    pass


class ExportError(StoreError):
    default_hint = "export the other modules with --module PATH (see `gpusnap inspect DIR`)"


class SnapshotError(GpusnapError):
    exit_code = 5
    default_hint = "training goes on; earlier snapshots are intact"


class HeadroomError(SnapshotError):
    default_hint = "free host memory, or set GPUSNAP_HEADROOM_FRACTION to accept the risk"


class CaptureError(SnapshotError):
    pass


class StageError(SnapshotError):
    pass


class ChildRunning(StageError):
    default_hint = "take the snapshot once the processes the program starts itself have ended (after their join)"


class ArenaFull(StageError):
    default_hint = "raise the job's memory limit or GPUSNAP_ARENA_BYTES; this snapshot is skipped, training goes on"


class DeviceError(SnapshotError):
    pass


class NoDevice(DeviceError):
    default_hint = "check `nvidia-smi` and that cuda-bindings matches the driver's CUDA major version"


class CudaCallFailed(DeviceError):
    """``call`` returned ``code`` (its enum name, e.g. ``CUDA_ERROR_OUT_OF_MEMORY``)."""

    def __init__(self, message: str, hint: str | None = None, *, call: str = "", code: str = ""):
        super().__init__(message, hint)
        self.call = call
        self.code = code


class KernelBuildError(DeviceError):
    default_hint = "upgrade nvidia-cuda-nvrtc to the driver's CUDA version; if that does not help, report it"


class RestoreError(GpusnapError):
    exit_code = 6
    default_hint = "restart from another snapshot with --snapshot ID, or start fresh with --resume never"


class ReplayDiverged(RestoreError):
    pass


class StateMismatch(RestoreError):
    pass


class ProgramChanged(RestoreError):
    default_hint = "restore the original script, or pass --force to restore anyway"


class FastForwardError(RestoreError):
    default_hint = (
        "the loop's items depend on something replay does not reproduce (random numbers drawn "
        "between items, an iterator advanced by hand, a thread of the program's making them "
        "ahead); give the source a seeded generator of its "
        "own, restart from another snapshot with --snapshot ID, or pass --force to continue anyway"
    )


class FilesNotRestorable(RestoreError):
    """``problems``: every (path, why) that cannot be put back, for the run log; ``plan``: what
    was done before a step failed (``files.rollback.Plan``), or None when nothing was."""

    default_hint = ("restart with --force to go on with those files as they are now, or from an earlier snapshot "
                    "with --snapshot ID; a larger --files-max keeps larger files in later snapshots")

    def __init__(self, message: str, hint: str | None = None, *, problems=(), plan=None):
        super().__init__(message, hint)
        self.problems = list(problems)
        self.plan = plan
