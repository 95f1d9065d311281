"""The trainee's channel to the supervisor never stalls training: events are queued and written
by a thread of their own; a supervisor that stops reading costs dropped events (counted), not a
blocked training thread."""

from __future__ import annotations

import json
import socket
import threading

from gpusnap.capture import control


def _lines(sock: socket.socket, until) -> list[dict]:
    buf, out = b"", []
    while not until(out):
        data = sock.recv(1 << 16)
        assert data, "the sender closed the socket"
        buf += data
        *lines, buf = buf.split(b"\n")
        out += [json.loads(line) for line in lines]
    return out


def test_a_supervisor_that_stops_reading_never_stalls_training():
    ours, theirs = socket.socketpair()
    sent = 20_000  # some 1.5 MB of events: far more than the socket and the queue hold
    try:
        control.attach(ours)
        emitting = threading.Thread(target=lambda: [control.emit("progress", i=i, pad="x" * 40) for i in range(sent)])
        emitting.start()
        emitting.join(60)
        assert not emitting.is_alive(), "emit() blocked on a supervisor that does not read"
        theirs.settimeout(30)
        events = _lines(theirs, lambda got: sum(e.get("count", 1) for e in got) >= sent)
    finally:
        control._control = None
        ours.close()
        theirs.close()
    dropped = [e for e in events if e["event"] == "dropped"]
    delivered = [e["i"] for e in events if e["event"] == "progress"]
    assert dropped and sum(e["count"] for e in dropped) == sent - len(delivered)
    assert delivered == sorted(delivered) and delivered[0] == 0
    assert control.QUEUE_MAX <= len(delivered) < sent
