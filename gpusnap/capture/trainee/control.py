"""Snapshot requests, and the channel to the supervisor.

A request (a signal, the supervisor's ``snap``/timer/SIGTERM message, ``gpusnap.snapshot()``)
only appends to ``requests`` and sets ``loops.pending``; the snapshot happens at the next safe
point (``agent``). Events go back to the supervisor as JSON lines on a Unix socket; without one
(a program run outside `gpusnap run`, a supervisor gone) they are dropped and training goes on.

No event ever waits for the supervisor: ``emit`` only queues the line (at most ``QUEUE_MAX``;
beyond that, events are dropped and counted), and a thread of its own writes the queue to the
socket. A supervisor that stops reading (stopped, swapped out, stuck on a full disk) then stalls
that thread, never the training thread; once it reads again, a ``dropped`` event with the
count comes first. ``flush`` gives the queue a moment to drain before the process exits.
"""

from __future__ import annotations

import atexit
import json
import os
import queue
import signal
import socket
import sys
import threading
import time
import warnings

from gpusnap import protocol
from gpusnap.capture.trainee import handlers, session
from gpusnap.instrument import loops

requests: list[tuple[str, bool]] = []  # (reason, stop) in arrival order
_control = None  # socket to the supervisor
QUEUE_MAX = 1000  # events waiting for the supervisor; about 200 kB
_outbox: queue.Queue = queue.Queue(QUEUE_MAX)
_dropped = 0  # events dropped since the last one the sender wrote
_drop_lock = threading.Lock()


def connected() -> bool:
    return _control is not None


def install_signals() -> None:
    name = session.config.get("signal") or "SIGUSR1"
    signum = getattr(signal, name if name.startswith("SIG") else "SIG" + name)
    answered = {signum}

    def on_signal(sig, frame):
        if not handlers.delivering():
            request("signal")
            handlers.heard(sig, frame)

    signal.signal(signum, on_signal)
    # A rank of a torchrun job hears of SIGTERM from its supervisor; a SIGTERM of its own is
    # torchrun's agent ending the job (another rank died): it must end the rank at once.
    if session.config.get("on_term", "snapshot") == "snapshot" and not session.config.get("dist"):
        def on_term(sig, frame):
            if not handlers.delivering():
                request("term", stop=True)
                handlers.heard(sig, frame)

        signal.signal(signal.SIGTERM, on_term)
        answered.add(signal.SIGTERM)
    handlers.install(answered)  # the program's own handlers for these run after the snapshot
    # The supervisor starts us with both blocked, so that one sent while we booted waited for
    # these handlers (or, with --on-term exit, for SIGTERM's default action) instead of killing us.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signum, signal.SIGTERM})


def connect(path: str | None) -> None:
    global _control
    if not path:
        return
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError as exc:
        sock.close()
        print(f"gpusnap: no supervisor at {path} ({exc.strerror}); snapshots on signal still work", file=sys.stderr)
        return
    attach(sock)
    hello = {"op": "hello", "pid": os.getpid()}
    if session.config.get("dist"):
        hello["rank"] = int(os.environ.get("RANK", "0"))
    _send(hello)
    threading.Thread(target=_read_control, args=(sock,), name="gpusnap-control", daemon=True).start()
    atexit.register(flush)


def attach(sock) -> None:
    """Send events on ``sock`` from now on, through the sender thread."""
    global _control
    _control = sock
    threading.Thread(target=_send_forever, args=(sock,), name="gpusnap-control-send", daemon=True).start()


def _send_forever(sock) -> None:
    global _dropped
    while True:
        data = _outbox.get()
        try:
            with _drop_lock:
                dropped, _dropped = _dropped, 0
            if dropped:
                sock.sendall(_encode({"op": "event", "event": "dropped", "count": dropped}))
            sock.sendall(data)
        except OSError:
            pass  # the supervisor is gone; training goes on
        finally:
            _outbox.task_done()


def flush(timeout_s: float = 2.0) -> None:
    """Wait up to ``timeout_s`` for the queued events to be written (before the process exits:
    a stop snapshot's last events)."""
    deadline = time.monotonic() + timeout_s
    while _control is not None and _outbox.unfinished_tasks and time.monotonic() < deadline:
        time.sleep(0.005)


def _read_control(sock) -> None:
    for line in sock.makefile("r", encoding="utf-8", errors="replace"):
        if not line.strip():
            continue
        try:
            message = protocol.check(json.loads(line), protocol.TO_TRAINEE)
        except ValueError as exc:  # not JSON, or protocol.Malformed
            print(f"gpusnap: refused a malformed message from the supervisor: {exc}", file=sys.stderr, flush=True)
            continue
        if isinstance(message.get("schedule"), dict):
            session.schedule = message["schedule"]  # the next manifest records it
        if message.get("op") == "snapshot":
            request(message.get("reason", "request"), stop=bool(message.get("stop")))


def _encode(message: dict) -> bytes:
    return (json.dumps(message, default=str) + "\n").encode()


def _send(message: dict) -> None:
    global _dropped
    if _control is None:
        return
    try:
        _outbox.put_nowait(_encode(message))
    except queue.Full:  # the supervisor has stopped reading: count it, never wait for it
        with _drop_lock:
            _dropped += 1


def emit(event: str, **fields) -> None:
    _send({"op": "event", "event": event, **fields})


def request(reason: str, stop: bool = False) -> None:
    # No lock: this runs inside signal handlers, which interrupt the main thread wherever it is
    # (a lock held there would deadlock). list.append is atomic under the GIL.
    requests.append((reason, stop))
    loops.pending = True


def request_from_program(reason: str) -> bool:
    if session.rundir is None:
        warnings.warn("gpusnap.snapshot() does nothing: this program is not running under `gpusnap run`", stacklevel=3)
        return False
    request(reason)
    return True
