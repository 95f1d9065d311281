"""Loaded by every Python process of a chaos run (the chaos tool puts this directory first on
PYTHONPATH). While the file named by GPUSNAP_CHAOS_FAULT holds a fault, it strikes, through
gpusnap's swappable module-level names (never by patching the OS):

  ENOSPC, EIO, EROFS   every write the snapshot store makes fails with that errno, as a full
                       disk, a failing disk or a file system remounted read-only would
                       (gpusnap/store/atomic.py, gpusnap/store/lock.py)
  DISK <bytes>         the run directory (the fault file's sibling ``snaps``) is a disk of that
                       size: a write fails with ENOSPC once its files would hold more
  EIO-READ <p>         each read of a pack fails with EIO with probability p (gpusnap/store/pack.py)
  FORK-<NAME>          a forked writer's first file open (its memory map, gpusnap/stage/memory.py)
                       raises NAME: an errno name as OSError, or MemoryError, KeyboardInterrupt
"""

import errno
import os
import random

_FAULT = os.environ.get("GPUSNAP_CHAOS_FAULT")


def _fault() -> list[str]:
    try:
        with open(_FAULT) as f:
            return f.read().split()
    except FileNotFoundError:
        return []


def _oserror(name: str) -> OSError:
    code = getattr(errno, name)
    return OSError(code, os.strerror(code))


if _FAULT:
    from gpusnap.stage import memory
    from gpusnap.store import atomic, lock, pack

    _snaps = os.path.join(os.path.dirname(os.path.realpath(_FAULT)), "snaps")
    _process = os.getpid()

    def _used() -> int:
        total = 0
        for dirpath, _dirs, files in os.walk(_snaps):
            for name in files:
                try:
                    total += os.lstat(os.path.join(dirpath, name)).st_size
                except FileNotFoundError:
                    pass
        return total

    def _writes(real):
        def write(fd, data, *args):
            fault = _fault()
            if fault[:1] in (["ENOSPC"], ["EIO"], ["EROFS"]):
                raise _oserror(fault[0])
            if fault[:1] == ["DISK"] and _used() + len(data) > int(fault[1]):
                raise _oserror("ENOSPC")
            return real(fd, data, *args)

        return write

    def _pread(fd, n, offset, _real=pack._pread):
        fault = _fault()
        if fault[:1] == ["EIO-READ"] and random.random() < float(fault[1]):
            raise _oserror("EIO")
        return _real(fd, n, offset)

    def _open(*args, _real=memory._open, **kwargs):
        fault = _fault()
        if os.getpid() != _process and fault and fault[0].startswith("FORK-"):
            name = fault[0][len("FORK-"):]
            if hasattr(errno, name):
                raise _oserror(name)
            raise {"MemoryError": MemoryError, "KeyboardInterrupt": KeyboardInterrupt}[name]()
        return _real(*args, **kwargs)

    atomic._write = _writes(atomic._write)
    lock._pwrite = _writes(lock._pwrite)
    pack._pread = _pread
    memory._open = _open
