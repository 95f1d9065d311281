"""Reference runs forked from an interpreter that has imported torch already.

A test compares the run under gpusnap with an uninterrupted run of the same program: that
reference is the program itself, unmodified, but its `python program.py` spends most of its
CPU importing torch (3 s of a few seconds, torch._dynamo included), and the suite runs a
hundred of them on two cores. So each pytest worker keeps a server process that imports torch
once and forks a child per reference; the child takes the request's working directory,
environment, argv and standard streams, runs the program as ``__main__`` (``runpy.run_path``)
and leaves the interpreter as `python program.py` would: atexit handlers, non-daemon threads,
the exit status of an uncaught exception or ``SystemExit``. One thing more: faulthandler is
enabled, so that a reference a test finds hung writes its stacks on SIGABRT.

What a fork cannot give the child is what the interpreter reads at its start: sys.path and
the flags (``PYTHON*``), and what torch reads when imported (thread counts, ``TORCH_*``). A
request whose environment differs there from the worker's own runs as a plain subprocess
instead, as one that asks for another interpreter does, and every reference with
``GPUSNAP_TEST_FORKSERVER=0``. The worker's own environment can change under it: a library a
test imports in-process sets variables of its own (lightning: ``TORCHINDUCTOR_CACHE_DIR``,
``PYTORCH_NVML_BASED_CUDA_CHECK``), which every program the worker starts then inherits; a
server started with them serves from then on. tests/e2e/test_e2e_restart.py checks that a
forked reference ends with the bytes of a subprocess's.

The server imports ``torch._dynamo`` too: torch imports it at the first optimizer's
construction (``torch._compile._disable_dynamo``), which nearly every program reaches, and
it costs as much CPU again as ``import torch``.

The server is single-threaded (a fork copies only the forking thread, and no lock can be
held by another), reads requests as JSON lines on its stdin and answers ``PID`` when it has
forked and ``PID STATUS`` when that child has ended, on its stdout.
"""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
import tempfile
import time

# Environment variables read when the interpreter starts or torch is imported: a request that
# sets them otherwise than the worker's own environment runs as a plain subprocess.
_AT_START = ("PYTHON", "OMP_", "MKL_", "KMP_", "TORCH", "PYTORCH", "CUDA", "LD_", "NVIDIA")
_READ_LATER = ("TORCHELASTIC_",)  # read when a process group starts (torchrun's environment for its ranks)

_SERVER = r"""
import json, os, select, sys
import torch  # noqa: F401  (what each child would otherwise import itself)
import torch._dynamo  # noqa: F401  (the same: imported by the first optimizer's constructor)

def serve():
    pending = b""
    while True:
        ready, _, _ = select.select([0], [], [], 0.01)
        while True:  # report the children that ended
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            os.write(1, f"{pid} {os.waitstatus_to_exitcode(status)}\n".encode())
        if not ready:
            continue
        data = os.read(0, 65536)
        if not data:
            return None  # the test process is gone
        pending += data
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            request = json.loads(line)
            pid = os.fork()
            if pid == 0:
                return request
            os.write(1, f"{pid}\n".encode())

request = serve()
if request is not None:
    for fd, path, flags in ((0, os.devnull, os.O_RDONLY), (1, request["stdout"], os.O_WRONLY),
                            (2, request["stderr"], os.O_WRONLY)):
        target = os.open(path, flags)
        os.dup2(target, fd)
        os.close(target)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    program = request["argv"][0]
    sys.argv = list(request["argv"])
    sys.path[0] = os.path.dirname(os.path.abspath(program))
    import faulthandler, runpy
    faulthandler.enable()  # a test that finds a reference hung sends SIGABRT for its stacks
    runpy.run_path(program, run_name="__main__")
"""


class Reference:
    """A forked reference run, as much of ``subprocess.Popen`` as the tests use."""

    def __init__(self, server: _Server, args: list[str], pid: int, stdout: str, stderr: str):
        self.server, self.args, self.pid = server, args, pid
        self._stdout, self._stderr = stdout, stderr
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.server.status(self.pid, block=False)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
            self.server.status(self.pid, block=True, timeout=0.1)
        return self.returncode

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        try:
            self.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise
        out, err = (_read_and_remove(path) for path in (self._stdout, self._stderr))
        return out, err

    def kill(self) -> None:
        try:
            os.kill(self.pid, 9)
        except ProcessLookupError:
            pass


class _Server:
    def __init__(self, env: dict):
        self.env = env
        self.proc = subprocess.Popen([sys.executable, "-c", _SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        self.ended: dict[int, int] = {}
        self.started: list[int] = []
        self._pending = b""
        atexit.register(self.close)

    def start(self, argv: list[str], cwd, env: dict) -> Reference:
        fd, stdout = tempfile.mkstemp(prefix="reference-out-")
        os.close(fd)
        fd, stderr = tempfile.mkstemp(prefix="reference-err-")
        os.close(fd)
        request = {"argv": argv, "cwd": str(cwd), "env": env, "stdout": stdout, "stderr": stderr}
        self.proc.stdin.write(json.dumps(request).encode() + b"\n")
        self.proc.stdin.flush()
        while not self.started:
            self._read(block=True, timeout=60)
        return Reference(self, argv, self.started.pop(0), stdout, stderr)

    def status(self, pid: int, block: bool, timeout: float = 0.1) -> int | None:
        if pid not in self.ended:
            self._read(block, timeout)
        return self.ended.get(pid)

    def _read(self, block: bool, timeout: float) -> None:
        import select

        ready, _, _ = select.select([self.proc.stdout], [], [], timeout if block else 0)
        if not ready:
            return
        data = os.read(self.proc.stdout.fileno(), 65536)
        if not data:
            raise RuntimeError(f"the reference fork server ended ({self.proc.wait()})")
        self._pending += data
        while b"\n" in self._pending:
            line, self._pending = self._pending.split(b"\n", 1)
            fields = line.split()
            if len(fields) == 1:
                self.started.append(int(fields[0]))
            else:
                self.ended[int(fields[0])] = int(fields[1])

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)


_servers: dict[tuple, _Server] = {}  # by what their interpreter read at its start (``_at_start``)


def start(argv: list[str], cwd, env: dict, python: str) -> Reference | subprocess.Popen:
    """Run ``python argv…`` in ``cwd`` with environment ``env``: forked from a server where
    the fork is the same program run, else as a subprocess. stdout and stderr are captured
    (text)."""
    if python != sys.executable or os.environ.get("GPUSNAP_TEST_FORKSERVER") == "0":
        return _subprocess(argv, cwd, env, python)
    wanted = _at_start(env)
    if wanted not in _servers:
        own = server_environment()
        if _at_start(own) != wanted:  # the request's own choice, not the worker's
            return _subprocess(argv, cwd, env, python)
        _servers[wanted] = _Server(own)
    return _servers[wanted].start([str(a) for a in argv], cwd, env)


def server_environment() -> dict:
    """A server's environment: the worker's as it is now, as a reference's (``harness._env``)."""
    from harness import _env

    return _env(None, step_sleep_s="0")


def _at_start(env: dict) -> tuple:
    return tuple(sorted((key, value) for key, value in env.items()
                        if key.startswith(_AT_START) and not key.startswith(_READ_LATER)))


def _subprocess(argv, cwd, env, python) -> subprocess.Popen:
    return subprocess.Popen([python, *map(str, argv)], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)


def _read_and_remove(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()
    finally:
        os.unlink(path)
