"""Loaded by every Python process of a test that puts this directory first on PYTHONPATH; each
fault is off unless its variable is set, and each works through a swappable module-level name of
gpusnap (never by patching the OS):

GPUSNAP_TEST_DISK="DIR:BYTES"   a small disk without a mount: every write the snapshot store
    makes under DIR fails with ENOSPC once the files under DIR would hold more than BYTES
    (gpusnap/store/atomic.py, gpusnap/store/lock.py), as a file system of that size would.
    Where a test can mount a real small file system (tmpfs), it uses that instead; this is the
    same logic for machines where mounting is not allowed.
GPUSNAP_TEST_CHILD_RAISES=NAME  in a forked writer, the first file it opens (its memory map,
    gpusnap/stage/memory.py) raises NAME: an errno name (EMFILE) as OSError, or MemoryError,
    KeyboardInterrupt.
"""

import errno
import os

_DISK = os.environ.get("GPUSNAP_TEST_DISK")
_CHILD_RAISES = os.environ.get("GPUSNAP_TEST_CHILD_RAISES")

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

if _CHILD_RAISES:
    from gpusnap.stage import memory

    _process = os.getpid()  # this process; a forked child has another pid
    _real_open = memory._open

    def _open(*args, **kwargs):
        if os.getpid() != _process:
            if hasattr(errno, _CHILD_RAISES):
                code = getattr(errno, _CHILD_RAISES)
                raise OSError(code, os.strerror(code))
            raise {"MemoryError": MemoryError, "KeyboardInterrupt": KeyboardInterrupt}[_CHILD_RAISES]()
        return _real_open(*args, **kwargs)

    memory._open = _open
