"""One writer per run directory.

The lock is the file ``lock`` holding {host, pid, time, purpose} as JSON, plus an exclusive
``flock`` on it. The kernel drops the flock when its process dies, so a lock whose holder is gone
is stale and simply taken over; the JSON is what the message to the user shows. The lock file
descriptor is close-on-exec, so a program started by the holder does not inherit it.
"""

from __future__ import annotations

import datetime
import errno
import fcntl
import json
import os
import pathlib
import socket

from gpusnap.errors import RunDirError, RunDirLocked, RunDirPermission

LOCK_NAME = "lock"


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


# The OS calls that can fail for reasons a test cannot cause for real (ENOLCK needs an NFS mount
# without a lock daemon): tests swap them, as in gpusnap/store/atomic.py.
_open = os.open
_flock = fcntl.flock


def _refusal(exc: OSError, root: pathlib.Path) -> RunDirError:
    """One line for a lock that cannot be taken for a reason other than another holder."""
    why = exc.strerror or str(exc)
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return RunDirPermission(
            f"cannot lock {root}: {why}",
            hint="a run directory must be writable: make it so, or use one on a writable file system",
        )
    if exc.errno in (errno.ENOENT, errno.ENOTDIR):
        return RunDirError(
            f"cannot lock {root}: the directory is gone ({why})",
            hint="it was removed or unmounted meanwhile; check the path and run the command again",
        )
    if exc.errno in (errno.ENOLCK, errno.EOPNOTSUPP):
        return RunDirError(
            f"cannot lock {root}: its file system does not support file locks ({why})",
            hint="put the run directory on a local disk, or on a mount with locking enabled (NFS: not 'nolock')",
        )
    return RunDirError(f"cannot lock {root}: {why}", hint="check the run directory's disk (dmesg); earlier snapshots are untouched")


def read_holder(path: pathlib.Path) -> dict:
    try:
        with open(path, "rb") as f:
            return json.loads(f.read() or b"{}")
    except (OSError, ValueError):
        return {}


class RunLock:
    """Held from acquire until release(); usable as a context manager."""

    def __init__(self, root: pathlib.Path, purpose: str) -> None:
        self.path = root / LOCK_NAME
        self.purpose = purpose
        self._fd = -1
        self.took_over: dict | None = None  # the stale holder's record, if there was one

    def acquire(self) -> "RunLock":
        try:
            return self._acquire()
        except OSError as exc:
            raise _refusal(exc, self.path.parent) from exc

    def _acquire(self) -> "RunLock":
        while True:
            fd = _open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                _flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                h = read_holder(self.path)
                raise RunDirLocked(
                    f"{self.path.parent} is used by pid {h.get('pid', '?')} on host {h.get('host', '?')} "
                    f"since {h.get('time', '?')} ({h.get('purpose', '?')})"
                ) from None
            except OSError:
                os.close(fd)
                raise
            # The holder may have released (and unlinked) the file between our open and our
            # flock; then we hold a lock on a dead inode and must start over.
            try:
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if not same:
                os.close(fd)
                continue
            break
        try:
            previous = read_holder(self.path)
            if previous:
                self.took_over = previous
            record = {"host": socket.gethostname(), "pid": os.getpid(), "time": _now(), "purpose": self.purpose}
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(record).encode() + b"\n", 0)
            os.fsync(fd)
        except OSError:
            os.close(fd)  # closing drops the flock
            raise
        self._fd = fd
        return self

    @property
    def held(self) -> bool:
        return self._fd >= 0

    def release(self) -> None:
        if self._fd < 0:
            return
        try:
            os.unlink(self.path)
        except OSError:
            pass
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = -1

    def __enter__(self) -> "RunLock":
        return self

    def __exit__(self, *exc) -> None:
        self.release()
