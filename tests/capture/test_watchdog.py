"""The writer's watchdog (capture.writer.watchdog) against real processes: a stopped one is killed, one
that works and reports is left alone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from gpusnap.capture.writer.watchdog import read_report


def _child(code: str):
    read_fd, write_fd = os.pipe()
    proc = subprocess.Popen([sys.executable, "-c", code, str(write_fd)], pass_fds=[write_fd])
    os.close(write_fd)
    return proc, read_fd


def test_a_stopped_writer_is_killed_after_the_timeout():
    proc, read_fd = _child("import time; time.sleep(60)")
    try:
        os.kill(proc.pid, signal.SIGSTOP)
        report, hung = read_report(read_fd, proc.pid, timeout_s=1.0)
    finally:
        os.close(read_fd)
        proc.kill()
        proc.wait()
    assert report == b"" and proc.returncode == -signal.SIGKILL
    assert hung.startswith(f"the writer (pid {proc.pid}) made no progress for 1 s (stopped) and was killed"), hung


def test_a_writer_that_computes_and_reports_is_left_alone():
    code = ("import os, sys, time\nfd = int(sys.argv[1])\nend = time.monotonic() + 2.5\n"
            "while time.monotonic() < end: pass\nos.write(fd, b'progress\\nreport')")
    proc, read_fd = _child(code)
    lines = []
    try:
        report, hung = read_report(read_fd, proc.pid, timeout_s=1.0, on_line=lines.append)
    finally:
        os.close(read_fd)
        proc.wait()
    assert (report, hung, lines, proc.returncode) == (b"report", None, [b"progress"], 0)
