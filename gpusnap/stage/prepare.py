"""Between snapshots: the trainee readies its memory for the next drain, in the background.

After an optimizer's first step, and again on the first step after each snapshot, ``prepare``
lists the large CPU tensors the optimizers step (a few microseconds a tensor, in the training
thread) and hands the work to one thread of the trainee that runs at idle priority, so that it
uses only a core training leaves idle:

1. collapse those tensors into huge pages (``hugepages``): after a drain, the trainee's next
   write then costs one fault per 2 MiB instead of one per 4 KiB page;
2. allocate the staging pool up to their size (``HostPool.allocate``), with ``GPUSNAP_DRAIN=keep``:
   no drain then pays for fresh pages while it races the trainee.

Both are done in steps of at most a few milliseconds, and never while a writer runs: the stall
calls ``writer_starting`` before it forks, which waits for the step in progress and drops the
rest. Each pass skips what is done already, so the pass after the snapshot does only what the
snapshot undid (a huge page the trainee wrote before the drain reached it is split in two
copies; a smaller state's pool was trimmed).
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Iterator

from gpusnap import knobs
from gpusnap.stage import hugepages
from gpusnap.stage.pool import host_pool


class _Worker:
    def __init__(self):
        # Held for each step of work, so writer_starting returns only once none is running.
        self._lock = threading.Lock()
        self._writer_running = False
        self._work: Iterator | None = None
        self._new_work = threading.Condition()
        self._pending = False
        self.idle = threading.Event()  # set while the thread has nothing to do
        self._thread: threading.Thread | None = None

    def start(self, work: Iterator) -> None:
        """Run ``work`` (an iterator: each next() is one step) instead of any earlier work."""
        with self._new_work:
            self._work, self._pending = work, True
            self.idle.clear()
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="gpusnap-prepare", daemon=True)
                self._thread.start()
            self._new_work.notify()

    def writer_starting(self) -> None:
        with self._lock:
            self._writer_running = True

    def writer_done(self) -> None:
        self._writer_running = False

    def _run(self) -> None:
        try:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))  # this thread only
        except (AttributeError, OSError):
            pass
        while True:
            with self._new_work:
                while not self._pending:
                    self.idle.set()
                    self._new_work.wait()
                work, self._pending = self._work, False
            while work is not None:
                with self._lock:
                    if self._writer_running or work is not self._work:
                        break
                    try:
                        next(work)
                    except StopIteration:
                        break
                    except Exception:  # noqa: BLE001 - best effort: a failed step costs speed only
                        break


_worker = _Worker()


def prepare(optimizers) -> None:
    """In the trainee, after an optimizer step: start readying the memory the next drain
    copies first (the optimizers' large CPU tensors)."""
    import psutil

    from gpusnap.stage.drain import optimizer_storages

    storages = optimizer_storages(optimizers, knobs.DRAIN_MIN_BYTES)
    steps = []
    if knobs.HUGEPAGES == "on":
        steps.append(hugepages.collapse(storages.items()))
    wanted = sum(storages.values())
    if knobs.DRAIN == "keep" and wanted <= psutil.virtual_memory().available * 0.5:  # never crowd out the trainee
        steps.append(host_pool().allocate(wanted))
    _worker.start(itertools.chain(*steps))


def writer_starting() -> None:
    """In the stall, before fork: from here until ``writer_done`` nothing is prepared."""
    _worker.writer_starting()


def writer_done() -> None:
    _worker.writer_done()
