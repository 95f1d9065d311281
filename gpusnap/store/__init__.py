"""The snapshot store: a run directory of manifests, indexes and packs of content-addressed,
compressed chunks. The on-disk format is docs/FORMAT.md.

Modules, in the order a snapshot passes through them: ``rundir`` (identity, manifests, lock
entry point), ``writer`` (chunk, name, compress, pack, commit), ``codec`` and ``pack`` (bytes
on disk), ``index`` (where each chunk lives), ``reader``,
``check`` (verify), ``gc`` (retention), ``export`` (safetensors). Every file is written through
``gpusnap.atomic`` (the one write helper, below the store: gpusnap's other files go through it too).

Importing this package never imports torch or numpy.
"""

from __future__ import annotations

from gpusnap.store.check import Finding
from gpusnap.store.info import FORMAT_VERSION, SnapshotInfo
from gpusnap.store.rundir import RunDir
from gpusnap.store.writer import SnapshotWriter

__all__ = ["FORMAT_VERSION", "Finding", "RunDir", "SnapshotInfo", "SnapshotWriter", "preload"]


def preload() -> None:
    """Import the compression library now (it pulls in numpy, ~0.3 s). The trainee calls this
    once before its first fork so that each forked writer does not pay the import again; the
    supervisor and the CLI never call it."""
    import blosc2  # noqa: F401
