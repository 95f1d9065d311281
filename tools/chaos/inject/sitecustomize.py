"""Loaded by every Python process of a chaos run (the chaos tool puts this directory first on
PYTHONPATH). While the file named by GPUSNAP_CHAOS_FAULT holds a fault, it strikes, through
gpusnap's swappable module-level names (never by patching the OS):

  ENOSPC, EIO, EROFS   every write the snapshot store makes fails with that errno, as a full
                       disk, a failing disk or a file system remounted read-only would
                       (gpusnap/atomic.py, gpusnap/store/lock.py)
  DISK <bytes>         the run directory (the fault file's sibling ``snaps``) is a disk of that
                       size: a write fails with ENOSPC once its files would hold more
  EIO-READ <p>         each read of a pack fails with EIO with probability p (gpusnap/store/pack.py)
  FORK-<NAME>          a forked writer's first file open (its memory map, gpusnap/rawmem.py)
                       raises NAME: an errno name as OSError, or MemoryError, KeyboardInterrupt

Wrong restores, for the witness's tests (tests/e2e/test_e2e_witness.py), are named instead in
GPUSNAP_TEST_WRONG_RESTORE, and strike every restart that process tree makes:

  rng                  the random module's generator is put back one draw further than saved
  batch                fast-forward skips one batch more of every DataLoader than it should
  ulp                  one parameter is moved by one unit in the last place after the merge
  epoch                after the merge, each new DataLoader iterator starts one torch draw
                       further (the next epoch reshuffles otherwise)
  no-fetch-ahead       the batch accelerate's DataLoaderShard fetched ahead is left out of the
                       snapshot (gpusnap before it kept it): the fix switched off

Each of these waits for the module it patches to be imported (``gpusnap.onimport``), so processes
that never import it (the supervisor, DataLoader workers) pay nothing.
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
    from gpusnap import atomic, rawmem
    from gpusnap.store import local, lock

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

    def _pread(fd, n, offset, _real=local._pread):
        fault = _fault()
        if fault[:1] == ["EIO-READ"] and random.random() < float(fault[1]):
            raise _oserror("EIO")
        return _real(fd, n, offset)

    def _open(*args, _real=rawmem._open, **kwargs):
        fault = _fault()
        if os.getpid() != _process and fault and fault[0].startswith("FORK-"):
            name = fault[0][len("FORK-"):]
            if hasattr(errno, name):
                raise _oserror(name)
            raise {"MemoryError": MemoryError, "KeyboardInterrupt": KeyboardInterrupt}[name]()
        return _real(*args, **kwargs)

    atomic._write = _writes(atomic._write)
    lock._pwrite = _writes(lock._pwrite)
    local._pread = _pread
    rawmem._open = _open


# -- wrong restores (GPUSNAP_TEST_WRONG_RESTORE) -----------------------------------------


def _rng(module):
    restore = module.restore

    def restore_one_further(states):
        restore(states)
        import random

        random.random()

    module.restore = restore_one_further


def _batch(module):
    iterator_at = module.iterator_at

    def one_more(source, skip, note, ctx=None):
        from torch.utils.data import DataLoader

        return iterator_at(source, skip + 1 if isinstance(source, DataLoader) and skip else skip, note, ctx)

    module.iterator_at = one_more


def _ulp(module):
    def nudge(live_objects):
        import torch

        for obj in live_objects:
            if isinstance(obj, torch.nn.Parameter) and obj.is_floating_point() and obj.numel():
                with torch.no_grad():
                    flat = obj.view(-1)
                    flat[0] = torch.nextafter(flat[0], torch.tensor(float("inf"), dtype=obj.dtype))
                return

    module.AFTER_MERGE["nudging a parameter (test)"] = nudge


def _epoch(module):
    def shift_next_epochs(live_objects):
        import torch
        from torch.utils.data import DataLoader

        make = DataLoader.__iter__

        def shifted(self):
            torch.rand(1)
            return make(self)

        DataLoader.__iter__ = shifted

    module.AFTER_MERGE["shifting the next epoch (test)"] = shift_next_epochs


def _no_fetch_ahead(module):
    module.pickler.FETCHED_AHEAD.clear()


PATCHES = {  # a wrong restore: (the module it patches, the patch)
    "rng": ("gpusnap.graph.rng", _rng),
    "batch": ("gpusnap.restore.fastforward", _batch),
    "ulp": ("gpusnap.restore.replay", _ulp),
    "epoch": ("gpusnap.restore.replay", _epoch),
    "no-fetch-ahead": ("gpusnap.frameworks.accelerate", _no_fetch_ahead),
}
_WRONG = os.environ.get("GPUSNAP_TEST_WRONG_RESTORE")
if _WRONG in PATCHES:
    from gpusnap.onimport import after_import

    after_import(*PATCHES[_WRONG])
