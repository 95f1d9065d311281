"""Processes the program starts itself (``multiprocessing``/``torch.multiprocessing`` workers
that are not DataLoader workers: Hogwild training, a Pool, a Manager). Their work is their own
memory, which a snapshot of the program cannot hold, and a restart would replay the setup that
starts them. So while one runs, a snapshot is refused with one line naming where it started. The
first one started says so at once: a program that waits for them in library code
(``torch.multiprocessing.spawn`` joins its ranks so) reaches no boundary where the refusal could
be said, and its snapshots would wait, silently, until the processes end.

``install`` wraps ``multiprocessing.process.BaseProcess.start`` (every context's ``Process``
inherits it) to note each process and the program's line that started it. A forked one gets the
program's signal handlers back in place of gpusnap's (``handlers.as_the_program_had_them``), so
that SIGTERM ends it as it would without gpusnap.
"""

from __future__ import annotations

import multiprocessing.process
import os
import subprocess
import sys
import weakref

from gpusnap.capture.trainee import handlers
from gpusnap.errors import ChildRunning

_running: weakref.WeakSet = weakref.WeakSet()
_installed = False
# Frames in these directories are the machinery between the program's line and the start.
_MACHINERY = (os.path.dirname(multiprocessing.__file__), os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_DATALOADER_WORKER = "torch.utils.data._utils.worker._worker_loop"
_SPAWNED_RANK = "torch.multiprocessing.spawn._wrap"  # what torch.multiprocessing.spawn starts
# What a multiprocessing.Pool and a concurrent.futures.ProcessPoolExecutor start: a pool made once
# at setup blocks every snapshot, one made per use does not.
_POOL_WORKERS = ("multiprocessing.pool.worker", "concurrent.futures.process._process_worker")
_POOL_HINT = ("make the pool where its work is handed out (`with Pool(n) as pool:` around the map), so that its "
              "processes have ended by the next step, where snapshots are taken")
_said = False
_starting: str | None = None  # the target of the process being started now: its fork's child reads it


def install() -> None:
    global _installed
    if _installed:
        return
    _installed = True
    start = multiprocessing.process.BaseProcess.start

    def noted_start(self):
        global _starting
        target = _target_name(self)  # start() lets go of the target
        _starting = target
        try:
            start(self)
        finally:
            _starting = None
        if target != _DATALOADER_WORKER:  # their batches are the loader's: fast-forward remakes them
            self._gpusnap_site, self._gpusnap_target = _site(sys._getframe(1)), target.lstrip(".")
            _running.add(self)
            _say_started(self)

    noted_start.__wrapped__ = start
    multiprocessing.process.BaseProcess.start = noted_start
    os.register_at_fork(after_in_child=_in_started_child)


def _in_started_child() -> None:
    """A process the program starts has its signals as the program had them; a DataLoader
    worker keeps gpusnap's (a SIGTERM to the whole job must leave it to the batches of the stop
    snapshot's witness), as does what gpusnap forks itself (its writer sets its own)."""
    if _starting is not None and _starting != _DATALOADER_WORKER:
        handlers.as_the_program_had_them()


def note_launched(processes, site: str, what: str, line: str) -> None:
    """Processes a library started with ``subprocess`` (Lightning's launcher of a job's other
    ranks): refused as the program's own, and ``line`` said once."""
    for process in processes:
        process._gpusnap_site, process._gpusnap_target = site, what
        _running.add(process)
    if processes:
        _say(line)


def _say(line: str) -> None:
    global _said
    if not _said:
        _said = True
        print(line, file=sys.stderr, flush=True)


def _say_started(process) -> None:
    if _said or getattr(process, "_parent_pid", None) != os.getpid():
        return
    if process._gpusnap_target == _SPAWNED_RANK:
        line = (f"gpusnap: the program spawned processes at {process._gpusnap_site} (torch.multiprocessing.spawn): while "
                "they run, no snapshot can be taken, since a snapshot of this process cannot hold their work; to "
                "snapshot a job's ranks, launch them with `gpusnap run --nproc-per-node N` (torchrun's way)")
    else:
        line = (f"gpusnap: the program started process {process.pid} at {process._gpusnap_site} ({process._gpusnap_target}): "
                "while a process it started runs, no snapshot can be taken, since a snapshot of this process cannot hold its work")
        if process._gpusnap_target in _POOL_WORKERS:
            line += f"; {_POOL_HINT}"
    _say(line)


def _target_name(process) -> str:
    target = getattr(process, "_target", None)
    return f"{getattr(target, '__module__', '')}.{getattr(target, '__qualname__', '')}"


def _site(frame) -> str:
    while frame is not None:
        path = frame.f_code.co_filename
        if not path.startswith(_MACHINERY) and "/torch/multiprocessing/" not in path and "/concurrent/futures/" not in path:
            return f"{os.path.relpath(path) if not os.path.relpath(path).startswith('..') else path}:{frame.f_lineno}"
        frame = frame.f_back
    return "?"


def refusal() -> ChildRunning | None:
    """Why no snapshot can be taken now: a process the program started is running."""
    for process in list(_running):
        try:
            alive = process.poll() is None if isinstance(process, subprocess.Popen) else process.is_alive()
        except (AssertionError, ValueError):  # not ours to ask (a child's child), or closed
            alive = False
        if alive:
            target = process._gpusnap_target
            return ChildRunning(f"process {process.pid} that the program started at {process._gpusnap_site}"
                                f"{f' ({target})' if target else ''} is running, and a snapshot cannot hold its work",
                                hint=_POOL_HINT if target in _POOL_WORKERS else None)
        _running.discard(process)
    return None
