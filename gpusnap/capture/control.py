"""Snapshot requests, and the channel to the supervisor.

A request (a signal, the supervisor's ``snap``/timer/SIGTERM message, ``gpusnap.snapshot()``)
only appends to ``requests`` and sets ``loops.pending``; the snapshot happens at the next safe
point (``agent``). Events go back to the supervisor as JSON lines on a Unix socket; without one
(a program run outside `gpusnap run`, a supervisor gone) they are dropped and training goes on.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
import warnings

from gpusnap.capture import session
from gpusnap.instrument import loops

requests: list[tuple[str, bool]] = []  # (reason, stop) in arrival order
_control = None  # socket to the supervisor
_send_lock = threading.Lock()


def connected() -> bool:
    return _control is not None


def install_signals() -> None:
    name = session.config.get("signal") or "SIGUSR1"
    signum = getattr(signal, name if name.startswith("SIG") else "SIG" + name)
    signal.signal(signum, lambda *_: request("signal"))
    # A rank of a torchrun job hears of SIGTERM from its supervisor; a SIGTERM of its own is
    # torchrun's agent ending the job (another rank died): it must end the rank at once.
    if session.config.get("on_term", "snapshot") == "snapshot" and not session.config.get("dist"):
        signal.signal(signal.SIGTERM, lambda *_: request("term", stop=True))


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
    _control = sock
    hello = {"op": "hello", "pid": os.getpid()}
    if session.config.get("dist"):
        hello["rank"] = int(os.environ.get("RANK", "0"))
    _send(hello)
    threading.Thread(target=_read_control, args=(sock,), name="gpusnap-control", daemon=True).start()


def _read_control(sock) -> None:
    for line in sock.makefile("r", encoding="utf-8"):
        try:
            message = json.loads(line)
        except ValueError:
            continue
        if isinstance(message.get("schedule"), dict):
            session.schedule = message["schedule"]  # the next manifest records it
        if message.get("op") == "snapshot":
            request(message.get("reason", "request"), stop=bool(message.get("stop")))


def _send(message: dict) -> None:
    if _control is None:
        return
    data = (json.dumps(message, default=str) + "\n").encode()
    with _send_lock:
        try:
            _control.sendall(data)
        except OSError:
            pass  # the supervisor is gone; training goes on


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
