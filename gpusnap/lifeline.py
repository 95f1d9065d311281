"""A child that must not outlive its parent: the trainee (child of the supervisor) and the writer
(child of the trainee).

A supervisor killed with SIGKILL cannot kill its trainee, and an orphaned trainee would go on
training with nobody holding the run directory's lock, so a second `gpusnap run` could take it
and two processes would write one store. A writer orphaned mid-write would go on writing a
snapshot that nobody reports. So each asks the kernel, right after fork, for SIGKILL when its
parent dies (``prctl(PR_SET_PDEATHSIG)``); a half-written snapshot is never committed (its
manifest is renamed into place last) and gc removes its debris.

Call ``arm()`` in the parent before forking (it loads libc, which a forked child should not
have to do), then ``die_with_parent(parent_pid)`` first thing in the child. Linux only; elsewhere
both do nothing.
"""

from __future__ import annotations

import ctypes
import os
import signal

import psutil

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
PR_SET_NAME = 15

_prctl = None


def arm() -> None:
    global _prctl
    if _prctl is None and os.uname().sysname == "Linux":
        _prctl = ctypes.CDLL(None, use_errno=True).prctl


def die_with_parent(parent_pid: int) -> None:
    """In a forked child: SIGKILL this process when ``parent_pid`` dies. The parent may have died
    between fork and this call, when the kernel had nobody to watch yet: then the child is
    already an orphan (its parent pid is no longer ``parent_pid``) and dies now.

    The kernel sends the signal when the *thread* that forked exits: both callers fork from
    their main thread, which lives as long as the process."""
    if _prctl is None:
        return
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:
        os.kill(os.getpid(), signal.SIGKILL)


def set_name(name: str) -> None:
    """Name this process (its ``comm``, what ``top``, ``ps -o comm`` and ``perf`` show; at most
    15 bytes): a forked writer would otherwise pass for a second copy of the program."""
    if _prctl is not None:
        _prctl(PR_SET_NAME, name.encode()[:15], 0, 0, 0)


def alive(pid) -> bool:
    """Whether process ``pid`` (from a file: anything but an int is no process) still runs. A
    zombie has ended, whoever has yet to reap it; another user's process counts."""
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:  # AccessDenied: it exists
        return True
