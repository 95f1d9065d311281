"""A supervisor killed outright leaves its socket directory behind; the next one removes it, and
never a live supervisor's, one between bind() and listen(), or anything not its own making."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

from gpusnap.launch import control

# A process that makes a real ControlServer in $TMPDIR and is then killed outright.
_KILLED = """
import os, signal
from gpusnap.launch.control import ControlServer
server = ControlServer()
print(server.dir, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def _age(path, seconds=120):
    then = time.time() - seconds
    for p in (os.path.join(path, n) for n in os.listdir(path)):
        os.utime(p, (then, then), follow_symlinks=False)
    os.utime(path, (then, then))


def _server_dir(base, name, listening):
    path = os.path.join(base, name)
    os.mkdir(path, 0o700)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(os.path.join(path, "control.sock"))
    if listening:
        sock.listen(1)
    return path, sock


def test_the_directory_a_killed_supervisor_left_goes_and_live_ones_stay(tmp_path):
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    killed = subprocess.run([sys.executable, "-c", _KILLED], env=env, capture_output=True, text=True, timeout=60)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    left = killed.stdout.strip()
    assert os.path.dirname(left) == str(tmp_path) and os.path.exists(os.path.join(left, "control.sock"))

    live, live_sock = _server_dir(tmp_path, "gpusnap-livelive", listening=True)
    binding, binding_sock = _server_dir(tmp_path, "gpusnap-bindbind", listening=False)  # young: may be about to listen
    empty = tmp_path / "gpusnap-emptyemp"  # killed between mkdtemp() and bind()
    empty.mkdir()
    other = tmp_path / "gpusnap-otherfil"  # not only what a ControlServer makes
    other.mkdir()
    (other / "control.sock").write_text("")
    (other / "notes").write_text("keep")
    unlike = tmp_path / "gpusnap-demo-abc"  # another name pattern
    unlike.mkdir()
    for path in (left, live, str(empty), str(other), str(unlike)):
        _age(path)

    assert control.sweep_stale(str(tmp_path)) == 2
    assert not os.path.exists(left) and not empty.exists()
    assert os.path.exists(live) and os.path.exists(binding) and other.exists() and unlike.exists()

    _age(binding)  # the same directory, no longer young, with still nothing listening: dead
    assert control.sweep_stale(str(tmp_path)) == 1 and not os.path.exists(binding)
    assert os.path.exists(live)
    live_sock.close()
    binding_sock.close()


def test_a_new_supervisor_sweeps_before_it_listens(tmp_path):
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    left = subprocess.run([sys.executable, "-c", _KILLED], env=env, capture_output=True, text=True, timeout=60).stdout.strip()
    _age(left)
    fresh = subprocess.run([sys.executable, "-c", _KILLED], env=env, capture_output=True, text=True, timeout=60).stdout.strip()
    assert not os.path.exists(left) and os.path.exists(fresh)
