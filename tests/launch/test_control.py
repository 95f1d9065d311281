"""The trainee's channel to the supervisor never stalls training: events are queued and written
by a thread of their own; a supervisor that stops reading costs dropped events (counted), not a
blocked training thread."""

from __future__ import annotations

import json
import socket
import threading

from gpusnap.capture.trainee import control


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


def test_malformed_messages_from_the_supervisor_are_refused_and_the_next_one_is_served(capfd, monkeypatch):
    ours, theirs = socket.socketpair()
    monkeypatch.setattr(control, "requests", [])
    reader = threading.Thread(target=control._read_control, args=(ours,), daemon=True)
    reader.start()
    try:
        theirs.sendall(b"{not json\n[1]\n" + b"".join(
            (json.dumps(m) + "\n").encode() for m in (
                {"op": "snapshot", "reason": "timer"},  # no "stop"
                {"op": "snapshot", "reason": 7, "stop": False},
                {"op": "schedule", "schedule": "often"},
                {"op": "shutdown"},
                {"op": "snapshot", "reason": "signal", "stop": True, "schedule": {}},
            )))
        theirs.shutdown(socket.SHUT_WR)
        reader.join(10)
        assert not reader.is_alive(), "the reader stopped at a malformed message"
    finally:
        ours.close()
        theirs.close()
    assert control.requests == [("signal", True)]
    refused = [line for line in capfd.readouterr().err.splitlines() if "refused" in line]
    assert [line.split(": ", 2)[2] for line in refused] == [
        "Expecting property name enclosed in double quotes: line 1 column 2 (char 1)",
        "not a JSON object: [1]",
        "'snapshot' without stop",
        "'snapshot' with reason=7: not str",
        "'schedule' with schedule='often': not dict",
        "unknown op 'shutdown' (known: schedule, snapshot)",
    ]
