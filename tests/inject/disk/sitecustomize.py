"""Loaded by every Python process of a test that puts this directory first on PYTHONPATH: a
small disk without a mount. GPUSNAP_TEST_DISK="DIR:BYTES" makes every write the snapshot store
makes under DIR fail with ENOSPC once the files under DIR would hold more than BYTES, through
the store's swappable OS calls (gpusnap/store/atomic.py, gpusnap/store/lock.py), as a file
system of that size would. Where a test can mount a real small file system (tmpfs), it uses
that instead; this is the same logic for machines where mounting is not allowed."""

import errno
import os

_DISK = os.environ.get("GPUSNAP_TEST_DISK")

if _DISK:
    from gpusnap.store import atomic, lock

    _root, _, _capacity = _DISK.rpartition(":")
    _root, _capacity = os.path.realpath(_root), int(_capacity)

    def _used() -> int:
        total = 0
        for dirpath, _dirs, files in os.walk(_root):
            for name in files:
                try:
                    total += os.lstat(os.path.join(dirpath, name)).st_size
                except FileNotFoundError:
                    pass
        return total

    def _full(fd: int, nbytes: int) -> bool:
        try:
            path = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return False
        return path.startswith(_root + os.sep) and _used() + nbytes > _capacity

    def _guarded(real):
        def call(fd, data, *args):
            if _full(fd, len(data)):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return real(fd, data, *args)

        return call

    atomic._write = _guarded(atomic._write)
    lock._pwrite = _guarded(lock._pwrite)
