"""The writer's watchdog (capture.writer.watchdog) against real processes: a stopped one is killed, so
is one that waits forever while a helper thread ticks, and one that works and reports is left alone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from gpusnap.capture.writer.watchdog import read_report


def _watched(code: str, timeout_s: float, before=None, on_line=None):
    """Run ``code`` as a writer (argv[1]: its report pipe), let ``read_report`` watch it:
    (report, why it was killed, its exit status, its pid). ``before(pid)`` runs first."""
    read_fd, write_fd = os.pipe()
    proc = subprocess.Popen([sys.executable, "-c", code, str(write_fd)], pass_fds=[write_fd])
    os.close(write_fd)
    try:
        if before is not None:
            before(proc.pid)
        report, hung = read_report(read_fd, proc.pid, timeout_s=timeout_s, on_line=on_line)
    except BaseException:
        proc.kill()
        raise
    finally:
        os.close(read_fd)
        proc.wait()  # the pipe's end came: killed, or done
    return report, hung, proc.returncode, proc.pid


def test_a_stopped_writer_is_killed_after_the_timeout():
    report, hung, status, pid = _watched("import time; time.sleep(60)", 1.0, before=lambda pid: os.kill(pid, signal.SIGSTOP))
    assert report == b"" and status == -signal.SIGKILL
    assert hung.startswith(f"the writer (pid {pid}) made no progress for 1 s (stopped) and was killed"), hung


def test_a_writer_that_waits_forever_while_a_helper_thread_ticks_is_killed():
    """The pacer and the encoders that watch for chunks to take over wake on timers: a writer
    whose pipeline waited forever while they ticked went on for minutes, unseen. Here a thread
    takes 2% of a core, which shows as CPU time every half second."""
    code = ("import threading, time\n"
            "def tick():\n    while True:\n        t = time.perf_counter()\n"
            "        while time.perf_counter() - t < 0.0005: pass\n        time.sleep(0.025)\n"
            "threading.Thread(target=tick, daemon=True).start()\nthreading.Event().wait(20)")  # then it ends: not killed
    report, hung, status, pid = _watched(code, 2.0)
    assert report == b"" and status == -signal.SIGKILL
    assert hung.startswith(f"the writer (pid {pid}) made no progress for 2 s (blocked) and was killed"), hung


def test_a_writer_that_computes_and_reports_is_left_alone():
    code = ("import os, sys, time\nfd = int(sys.argv[1])\nend = time.monotonic() + 2.5\n"
            "while time.monotonic() < end: pass\nos.write(fd, b'progress\\nreport')")
    lines = []
    assert _watched(code, 1.0, on_line=lines.append)[:3] == (b"report", None, 0) and lines == [b"progress"]
