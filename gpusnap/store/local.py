"""A run directory on a file system: the backend of ``--dir /path`` (local disk, NFS, Lustre).

Each verb is the system call gpusnap made before there was an interface, so the local store is
as fast and as crash-safe as it was: ``put`` and ``commit`` go through ``atomic.write_file``
(temp -> fsync -> rename, with RENAME_NOREPLACE for a commit -> fsync of the directory), ranged
reads are ``pread`` on one descriptor, the run log is ``O_APPEND`` through
``atomic.open_private`` (O_NOFOLLOW, the user's own file), the lock is ``flock``.
"""

from __future__ import annotations

import os
import pathlib

from gpusnap import atomic
from gpusnap.errors import RunDirPermission
from gpusnap.store.backend import Backend, Ranged

_pread = os.pread  # swappable: tests and tools/chaos inject EIO on reads


class LocalRanged(Ranged):
    def __init__(self, path: pathlib.Path) -> None:
        self._fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        self.size = os.fstat(self._fd).st_size

    def read(self, offset: int, nbytes: int) -> bytes:
        return _pread(self._fd, nbytes, offset)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class LocalBackend(Backend):
    def __init__(self, root) -> None:
        self.root = pathlib.Path(root)
        self.location = str(self.root)

    def path(self, key: str) -> pathlib.Path:
        return self.root / key if key else self.root

    def _parent_made(self, key: str) -> pathlib.Path:
        path = self.path(key)
        if not path.parent.is_dir():
            atomic.make_dir(path.parent)
        return path

    def put(self, key: str, parts, *, direct: bool = False) -> int:
        return atomic.write_file(self._parent_made(key), parts, direct=direct)

    def commit(self, key: str, data: bytes) -> None:
        atomic.write_file(self._parent_made(key), [data], noreplace=True)

    def copies_on_put(self, prefix: str) -> bool:
        path = self.path(prefix)
        if not path.is_dir():
            atomic.make_dir(path)
        return atomic.copies_writes(path)

    def get(self, key: str) -> bytes:
        with open(self.path(key), "rb") as f:
            return f.read()

    def open(self, key: str) -> LocalRanged:
        return LocalRanged(self.path(key))

    def size(self, key: str) -> int:
        return os.stat(self.path(key)).st_size

    def exists(self, key: str) -> bool:
        return self.path(key).exists()

    def list(self, prefix: str = "") -> list[str]:
        return os.listdir(self.path(prefix))

    def delete(self, key: str) -> None:
        atomic.remove_file(self.path(key))

    def synced(self, prefix: str, *, drop_empty: bool = False) -> None:
        atomic.fsync_dir(self.path(prefix))
        if drop_empty:
            try:
                self.path(prefix).rmdir()  # only succeeds when empty
            except OSError:
                pass

    def append(self, key: str, data: bytes) -> None:
        fd = atomic.open_private(self._parent_made(key), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)

    def lock(self, purpose: str):
        from gpusnap.store.lock import RunLock

        return RunLock(self.root, purpose).acquire()


def check_creatable(path: str) -> None:
    """Refuse a run directory that cannot be created or written, before anything is created.

    Root passes every permission check here; the store then refuses when the write fails."""
    probe = path
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    if os.path.exists(path) and not os.path.isdir(path):
        raise RunDirPermission(f"run directory {path} is not a directory")
    if not os.path.isdir(probe):
        raise RunDirPermission(f"cannot create run directory {path}: {probe} is not a directory")
    if not os.access(probe, os.W_OK | os.X_OK):
        what = "write to" if probe == path else "create"
        raise RunDirPermission(f"cannot {what} run directory {path}: {probe} is not writable")
