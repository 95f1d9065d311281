"""The writer's watchdog, in the trainee: a writer that makes no progress for too long is hung,
and is killed so that the snapshot fails and the next one can run.

A forked writer can hang for reasons it cannot report: stopped (SIGSTOP, a debugger), blocked
forever on a lock that another trainee thread held at fork time (the classic hazard of forking
a threaded process), stuck on a file system that stopped answering. Progress is read from the
outside (psutil), so a hung writer needs no cooperation: a context switch of its main thread
(a writer that wakes briefly to move a few bytes shows in its switches), being runnable (a
writer at idle priority waits for a core while the trainee keeps them busy: slow, not hung), or
CPU time, where it comes to ``BUSY_SHARE`` of a core at least since the last progress. Not any
CPU time: the writer's helper threads wake on timers (the pacer every tick, encoders that watch
for a chunk to take over), and a writer whose pipeline waited forever while they ticked
(a CI run) counted as busy. A writer that computes forever is busy by this measure;
``--grace`` bounds a SIGTERM snapshot.
"""

from __future__ import annotations

import os
import select
import signal
import time

from gpusnap import knobs

# CPU time that counts as progress: this share of one core since the last progress, at least.
# Threads that only wake on timers take a few thousandths.
BUSY_SHARE = 0.05
_STATES = {"sleeping": "blocked", "disk-sleep": "blocked on I/O", "tracing-stop": "stopped by a tracer"}


def timeout_for(image_nbytes: int) -> float:
    """Seconds without progress after which the writer counts as hung: GPUSNAP_WRITER_TIMEOUT_S,
    or by default a minute plus one second per 50 MB of the trainee's memory (the image the
    writer reads: paging it in from swap, or writing it to a slow disk, can block the writer
    without a tick of CPU for longer when it is larger)."""
    if knobs.WRITER_TIMEOUT_S > 0:
        return knobs.WRITER_TIMEOUT_S
    return 60.0 + image_nbytes / 50e6


def _sample(process) -> tuple[str, float, tuple] | None:
    """(psutil status, CPU seconds of all its threads, its main thread's context switches),
    None once the process is gone."""
    import psutil

    try:
        with process.oneshot():
            times, switches = process.cpu_times(), process.num_ctx_switches()
            return process.status(), times.user + times.system, (switches.voluntary, switches.involuntary)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def read_report(read_fd: int, pid: int, timeout_s: float, on_line=None) -> tuple[bytes, str | None]:
    """What the writer ``pid`` sends on ``read_fd`` after its last newline, until it closes the
    pipe (its report), and why it was killed (None when it was not): after ``timeout_s`` with
    no progress it is sent SIGKILL, which closes the pipe. Each line before goes to
    ``on_line(bytes)`` (its progress)."""
    import psutil

    try:
        process = psutil.Process(pid)
    except psutil.NoSuchProcess:
        process = None
    chunks: list[bytes] = []
    hung = None
    sample_s = min(1.0, timeout_s / 4)
    last_switches = cpu_at_quiet = None
    quiet_since = time.monotonic()
    while True:
        ready, _, _ = select.select([read_fd], [], [], sample_s)
        now = time.monotonic()
        if ready:
            data = os.read(read_fd, 65536)
            if not data:
                return b"".join(chunks), hung
            chunks.append(data)
            if b"\n" in data:
                *lines, rest = b"".join(chunks).split(b"\n")
                chunks = [rest]
                for line in lines:
                    if on_line is not None:
                        on_line(line)
            quiet_since = now
            continue
        sample = _sample(process) if process is not None else None
        if sample is None or hung is not None:
            continue  # gone or killed: the end of the pipe follows
        state, cpu, switches = sample
        busy = cpu_at_quiet is None or cpu - cpu_at_quiet >= max(BUSY_SHARE * (now - quiet_since), 0.005)
        if state == psutil.STATUS_RUNNING or switches != last_switches or busy:
            last_switches, cpu_at_quiet, quiet_since = switches, cpu, now
        elif now - quiet_since >= timeout_s:
            os.kill(pid, signal.SIGKILL)
            hung = (f"the writer (pid {pid}) made no progress for {timeout_s:g} s "
                    f"({_STATES.get(state, state)}) and was killed; earlier snapshots are intact, training goes on "
                    "(GPUSNAP_WRITER_TIMEOUT_S sets the limit)")
