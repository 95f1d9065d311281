"""The control socket: newline-delimited JSON over a unix stream socket.

The supervisor listens on ``<private temp dir>/control.sock`` (directory 0700, socket 0600): a
socket path may hold only 107 bytes, so it cannot live inside an arbitrary run directory; the
run directory's ``supervisor.json`` says where it is. A supervisor killed outright (SIGKILL, the
OOM killer, a node's end) leaves that directory behind; the next supervisor of the same user
removes such directories (``sweep_stale``). Every message is one JSON object on one
line with an ``"op"`` key. The messages are ``gpusnap.protocol``'s, checked by the reader.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
import time

from gpusnap import protocol

# sockaddr_un.sun_path is 108 bytes including the terminating NUL.
MAX_SOCKET_PATH = 107
# A peer that sends a line longer than this is broken; drop it rather than buffer without end.
MAX_LINE_BYTES = 1 << 20
_PREFIX = "gpusnap-"
# A socket file younger than this may belong to a supervisor between bind() and listen(), whose
# socket refuses connections for that instant: never taken for a dead one.
_STALE_AFTER_S = 30.0


def encode(msg: dict) -> bytes:
    return (json.dumps(msg, separators=(",", ":")) + "\n").encode()


class Connection:
    """One accepted peer: the trainee, a writer, or a `gpusnap snap` client."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.sock.setblocking(False)
        self._buf = b""
        self._out = b""
        self.closed = False
        self.pid: int | None = None  # from its "hello"
        self.rank: int | None = None  # a rank of a distributed run: its global rank, from its "hello"
        self.close_after_flush = False  # a client answered for good

    def fileno(self) -> int:
        return self.sock.fileno()

    def read(self) -> list:
        """Messages that have arrived, as JSON decodes them (a line that is not JSON: its text,
        for ``protocol.check`` to refuse); sets ``closed`` at end of stream."""
        try:
            data = self.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return []
        except OSError:
            data = b""
        if not data:
            self.closed = True
        self._buf += data
        lines = self._buf.split(b"\n")
        self._buf = lines.pop()
        if len(self._buf) > MAX_LINE_BYTES:
            self.closed = True
        out = []
        for line in lines:
            if not line.strip():
                continue
            try:
                out.append(json.loads(line))
            except ValueError:
                out.append(line.decode(errors="replace"))
        return out

    def send(self, msg: dict) -> bool:
        """Queue ``msg`` and write what the socket takes now; False once the peer is gone."""
        if self.closed:
            return False
        self._out += encode(msg)
        return self.flush()

    def flush(self) -> bool:
        while self._out:
            try:
                n = self.sock.send(self._out)
            except (BlockingIOError, InterruptedError):
                return True
            except OSError:
                self.closed = True
                return False
            self._out = self._out[n:]
        return True

    @property
    def wants_write(self) -> bool:
        return bool(self._out) and not self.closed

    def close(self) -> None:
        self.closed = True
        try:
            self.sock.close()
        except OSError:
            pass


class ControlServer:
    """Listening socket in a private directory; ``close()`` removes both."""

    def __init__(self):
        base = tempfile.gettempdir()
        if len(os.path.join(base, "gpusnap-XXXXXXXX", "control.sock")) > MAX_SOCKET_PATH:
            base = "/tmp"  # a long $TMPDIR (some clusters) would not fit a socket path
        sweep_stale(base)
        self.dir = tempfile.mkdtemp(prefix=_PREFIX, dir=base)  # mode 0700
        self.path = os.path.join(self.dir, "control.sock")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)  # socket file created 0600
        try:
            self.sock.bind(self.path)
        finally:
            os.umask(old)
        os.chmod(self.path, 0o600)
        self.sock.listen(16)
        self.sock.setblocking(False)

    def fileno(self) -> int:
        return self.sock.fileno()

    def accept(self) -> Connection | None:
        try:
            sock, _ = self.sock.accept()
        except (BlockingIOError, InterruptedError):
            return None
        return Connection(sock)

    def close(self) -> None:
        try:
            self.sock.close()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


def sweep_stale(base: str) -> int:
    """Remove the socket directories that killed supervisors of this user left in ``base``: a
    directory whose socket refuses connections (nothing listens on it), or that never got one,
    once older than ``_STALE_AFTER_S``. Returns how many went. Never raises: what cannot be
    read or removed stays."""
    removed = 0
    now = time.time()
    try:
        entries = list(os.scandir(base))
    except OSError:
        return 0
    for entry in entries:
        suffix = entry.name[len(_PREFIX):]
        if not (entry.name.startswith(_PREFIX) and len(suffix) == 8 and "-" not in suffix):
            continue  # tempfile.mkdtemp's names: the prefix and 8 of [a-z0-9_]
        try:
            if not entry.is_dir(follow_symlinks=False) or entry.stat(follow_symlinks=False).st_uid != os.getuid():
                continue
            names = os.listdir(entry.path)
            sock_path = os.path.join(entry.path, "control.sock")
            aged = now - os.lstat(sock_path if names == ["control.sock"] else entry.path).st_mtime > _STALE_AFTER_S
            if names not in ([], ["control.sock"]) or not aged:
                continue  # not only what a ControlServer makes, or too young to judge
            if names and not _refused(sock_path):
                continue
            shutil.rmtree(entry.path)
            removed += 1
        except OSError:
            continue
    return removed


def _refused(path: str) -> bool:
    """Whether nothing listens on the unix socket at ``path``. A full backlog (EAGAIN) or any
    other answer counts as a listener."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.setblocking(False)
    try:
        probe.connect(path)
    except ConnectionRefusedError:
        return True
    except OSError:
        return False
    finally:
        probe.close()
    return False


def connect(path: str, timeout_s: float | None = 5.0) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout_s)
    sock.connect(path)
    return sock


def send(sock: socket.socket, msg: dict) -> None:
    sock.sendall(encode(msg))


def messages(sock: socket.socket):
    """Yield the messages the supervisor sends a client (``protocol.TO_CLIENT``), checked,
    until it closes; a malformed one is passed over."""
    buf = b""
    while True:
        data = sock.recv(65536)
        if not data:
            return
        buf += data
        *lines, buf = buf.split(b"\n")
        for line in lines:
            if line.strip():
                try:
                    yield protocol.check(json.loads(line), protocol.TO_CLIENT)
                except ValueError:  # not JSON, or protocol.Malformed
                    continue
