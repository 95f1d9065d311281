"""TensorBoard's event writers (tested with tensorboard 2.21): torch.utils.tensorboard's
SummaryWriter, Lightning's TensorBoardLogger and transformers' TensorBoardCallback all write
through them.

An ``EventFileWriter`` hands each event to an ``_AsyncWriter``: a queue, a lock and a thread that
appends the queued events to the event file. Neither the lock, nor the queue's conditions, nor
the thread is captured (live-only). A writer made in setup is made again by the replay, keeps
its own, and takes the snapshot's state (the events still queued among it). One made after
setup has no counterpart in the replay, so restore takes the snapshot's, without a lock or a
thread: ``add_scalars`` makes a writer per tag as it goes, and a program that made its
SummaryWriter on first use has one too; it met a placeholder at its next event and the restart
was refused. So the snapshot keeps the thread's flush interval beside the writer's state, and
once merged, each such writer gets a new lock, a new queue with the events that were waiting,
and a new thread, started once restore has put its event file back to the bytes it held at the
snapshot (``gpusnap.files``; not for a writer closed already). It goes on appending to that file.
"""

from __future__ import annotations

import queue
import sys
import threading

from gpusnap.capture.pickling import pickler
from gpusnap.graph.load import LiveOnly
from gpusnap.restore import replay

_MODULE = "tensorboard.summary.writer.event_file_writer"
_FLUSH_SECS = "_gpusnap_flush_secs"
_DEFAULT_FLUSH_SECS = 120  # EventFileWriter's own default, for a snapshot taken before this was kept


def _flush_secs(writer) -> dict:
    """Beside an ``_AsyncWriter``'s state: how often its thread flushes (only the thread knew)."""
    secs = getattr(getattr(writer, "_worker", None), "_flush_secs", None)
    return {_FLUSH_SECS: secs} if isinstance(secs, (int, float)) else {}


def _restart_writers(objects):
    """Give each writer the snapshot held, and the replay did not, what was not captured; its
    thread starts once the files are back (it may append at once: the events still queued)."""
    module = sys.modules.get(_MODULE)
    if module is None:
        return None
    restarted = [_restart(module, writer) for writer in objects
                 if isinstance(writer, module._AsyncWriter) and isinstance(writer.__dict__.get("_worker"), LiveOnly)]
    threads = [thread for thread in restarted if thread is not None]

    def start() -> None:
        for thread in threads:
            thread.start()

    return start if threads else None


def _restart(module, writer):
    """A new queue (with the events that were waiting), lock and thread for ``writer``; the
    thread to start, None for a writer closed already."""
    held = writer.__dict__.get("_byte_queue")
    waiting = list(getattr(held, "queue", ()))
    fresh = queue.Queue(getattr(held, "maxsize", 0))
    fresh.queue.extend(waiting)  # as put() would, without waiting for room: the thread starts below
    fresh.unfinished_tasks = len(waiting)
    writer._byte_queue = fresh
    writer._lock = threading.Lock()
    writer._worker = module._AsyncWriterThread(fresh, writer._writer, writer.__dict__.get(_FLUSH_SECS, _DEFAULT_FLUSH_SECS))
    return None if writer._closed else writer._worker


pickler.EXTRA_STATE[f"{_MODULE}._AsyncWriter"] = _flush_secs
replay.AFTER_MERGE["starting the TensorBoard event writers made after setup"] = _restart_writers
