"""The trainee's side of the witness (``graph.witness``): start a recorder after each fork, feed
it from the step loop's boundaries, and write what it recorded beside the snapshot once the
snapshot is committed.

A witness is written by a thread of its own (a small atomic write, fsync included, never on the
training thread), again after each record: a run killed two iterations after a snapshot leaves
a witness of those two. A stop snapshot (SIGTERM, a spot notice) trains on while its writer
writes, until the window is recorded or ``knobs.WITNESS_STOP_S`` after the fork, then waits for
the writer and writes its witness before the process exits (``stop_due``).
"""

from __future__ import annotations

import json
import queue
import sys
import threading
import time

from gpusnap import knobs
from gpusnap.capture.trainee import session
from gpusnap.graph import witness
from gpusnap.instrument import loops

_lock = threading.Lock()
_pending: dict[str, bytes] = {}  # snapshot id -> its latest witness, until the snapshot commits
_committed: set[str] = set()
_writes: queue.Queue = queue.Queue()
_thread: threading.Thread | None = None
_stop: dict | None = None  # a stop snapshot that trains on for its witness: {"id", "until"}


def start(snap_id: str, token: str, loop, step_loops: list, stop: bool) -> bool:
    """A writer was forked for ``snap_id`` at ``loop``'s boundary: record the iterations of the
    step loops (``step_loops``, ``witness.loop_key``s; none known: ``loop``'s) that follow, under
    ``token``, which the snapshot's manifest holds too. For a stop snapshot, True when the program
    should train on (the caller then does not wait)."""
    if knobs.WITNESS_ITERATIONS <= 0 or (stop and knobs.WITNESS_STOP_S <= 0):
        return False
    global _stop
    witness.active = witness.Recorder(snap_id, _update, step_loops or [witness.loop_key(loop)], token=token)
    loops.pending = True  # every boundary, until the window is recorded
    if stop:
        _stop = {"id": snap_id, "until": time.monotonic() + knobs.WITNESS_STOP_S}
    return stop


def at_boundary(loop) -> bool:
    """The witness's part of a boundary. True while a restarted run is not yet proven: no
    snapshot is taken then (a wrong one would be what the next restart restores)."""
    w = witness.active
    if w is None:
        return False
    if w.wants_boundary() and w.watches(loop):
        item = loop_item()  # here: it looks a few frames up for the loop's own
        if not _guarded(w, w.at_boundary, item, session.iterations, loop.frame):
            return False
    return bool(w.holds_snapshots)


def _guarded(w, hook, *args) -> bool:
    """``hook(*args)``, one of the witness's hooks, inside the program's loop: a fault of the
    witness itself never reaches the program (``_drop``). False when it failed."""
    try:
        hook(*args)
    except Exception as exc:  # noqa: BLE001 - whatever the witness raised
        _drop(w, exc)
        return False
    return True


def _drop(w, exc: Exception) -> None:
    """The witness itself failed (a record it could not take): it stops, saying so. A run that
    took a snapshot keeps what it recorded so far (as a run killed early does); a restart goes on
    unverified."""
    witness.stop_watching(w)
    if isinstance(w, witness.Checker):
        what = f"checking snapshot {w.snap_id} against its witness stopped: this restart is unverified"
    else:
        what = f"the witness of snapshot {w.snap_id} stops at what it recorded"
    print(f"gpusnap: warning: {what} ({type(exc).__name__}: {exc})", file=sys.stderr, flush=True)


def wants_boundaries() -> bool:
    w = witness.active
    return (w is not None and w.wants_boundary()) or _stop is not None


def loop_item():
    """The item the running ``for`` loop handed to the body that just ended (``_iterate``'s
    local: the boundary is called from there); ``witness.NO_ITEM`` for a ``while`` loop."""
    frame = sys._getframe(1)
    for _ in range(4):
        if frame is None:
            break
        if frame.f_code is loops._iterate.__code__:
            return frame.f_locals.get(loops.LAST_ITEM, witness.NO_ITEM)
        frame = frame.f_back
    return witness.NO_ITEM


def fetched(batch) -> None:
    """A DataLoader iterator returned ``batch`` (every batch: one global lookup when idle)."""
    w = witness.active
    if w is not None:
        _guarded(w, w.fetched, batch)


def loader_made() -> None:
    w = witness.active
    if w is not None and w.loader_made():
        loops.pending = True


def stepped(optimizer) -> None:
    w = witness.active
    if w is not None:
        _guarded(w, w.stepped, optimizer, session.iterations)


def stop_due() -> bool:
    """A stop snapshot that trains on for its witness: is it time to stop training (the window
    is recorded, or its time is up) and wait for the writer?"""
    if _stop is None:
        return False
    w = witness.active
    return w is None or w.snap_id != _stop["id"] or w.window_done() or time.monotonic() >= _stop["until"]


def stopping() -> bool:
    return _stop is not None


# -- writing ---------------------------------------------------------------------------------
def _update(doc: dict) -> None:
    data = json.dumps(doc, sort_keys=True).encode()
    snap_id = doc["snapshot"]
    with _lock:
        if snap_id in _committed:
            _queue(snap_id, data)
        else:
            _pending[snap_id] = data


def committed(snap_id: str) -> None:
    """The writer committed ``snap_id`` (the waiter thread): its witness may be written now."""
    with _lock:
        _committed.add(snap_id)
        data = _pending.pop(snap_id, None)
        if data is not None:
            _queue(snap_id, data)


def failed(snap_id: str) -> None:
    with _lock:
        _pending.pop(snap_id, None)
    w = witness.active
    if w is not None and w.snap_id == snap_id:
        witness.stop_watching(w)


def _queue(snap_id: str, data: bytes) -> None:
    global _thread
    _writes.put((snap_id, data))
    if _thread is None:
        _thread = threading.Thread(target=_write_all, name="gpusnap-witness", daemon=True)
        _thread.start()


def _write_all() -> None:
    while True:
        snap_id, data = _writes.get()
        try:
            latest = {snap_id: data}
            while not _writes.empty():  # only the newest of each matters
                more_id, more = _writes.get_nowait()
                latest[more_id] = more
                _writes.task_done()
            for sid, doc in latest.items():
                try:
                    session.rundir.write_witness(sid, doc)
                except Exception as exc:  # noqa: BLE001 - a witness is extra: the snapshot stands
                    _say_once(f"gpusnap: warning: the witness of snapshot {sid} could not be written "
                              f"({getattr(exc, 'message', None) or exc}); its restart will be unverified")
        finally:
            _writes.task_done()


_said = False


def _say_once(text: str) -> None:
    global _said
    if not _said:
        _said = True
        print(text, file=sys.stderr, flush=True)


def flush() -> None:
    """Write what is queued before the process ends (atexit, and a stop snapshot's exit)."""
    if _thread is not None:
        _writes.join()
