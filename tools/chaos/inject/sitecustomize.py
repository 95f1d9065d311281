"""Loaded by every Python process of a chaos run (the chaos tool puts this directory first on
PYTHONPATH): while the file named by GPUSNAP_CHAOS_FAULT holds an errno name (ENOSPC, EIO,
EROFS), every write the snapshot store makes fails with it, as a full disk, a failing disk or a
file system remounted read-only would. The store's OS calls are module-level names
(gpusnap/store/atomic.py) for exactly this."""

import errno
import os

_FAULT = os.environ.get("GPUSNAP_CHAOS_FAULT")

if _FAULT:
    from gpusnap.store import atomic

    _real_write = atomic._write

    def _write(fd, data):
        try:
            with open(_FAULT) as f:
                name = f.read().strip()
        except FileNotFoundError:
            name = ""
        if name:
            raise OSError(getattr(errno, name), os.strerror(getattr(errno, name)))
        return _real_write(fd, data)

    atomic._write = _write
