"""--quiet says only what goes wrong and why a run stops; --verbose adds requests and
connections; the default says every snapshot. The run log (DIR/log.jsonl) has everything
whatever the verbosity."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import sys
import time

import pytest
from harness import Run, copy_programs, gpusnap, progress, ref_and_out, wait_for
from harness import _env as harness_env


def _logged(run_dir) -> list[str]:
    try:
        return [json.loads(line)["event"] for line in (run_dir / "log.jsonl").read_text().splitlines() if line.strip()]
    except (OSError, ValueError):  # not there yet, or a line half written
        return []


@pytest.mark.parametrize("flag", ["--quiet", None, "--verbose"])
def test_verbosity_of_run_and_restart(tmp_path, flag):
    program = copy_programs(tmp_path) / "notorch" / "counters.py"
    _, out = ref_and_out(tmp_path)
    flags = [flag] if flag else []
    run = Run("run", *flags, "--dir", "snaps", program, out, 200, cwd=tmp_path, env={"TEST_STEP_SLEEP_S": "0.02"})
    wait_for(lambda: progress(out) >= 10, "step 10", proc=run)
    run.signal(signal.SIGUSR1)
    # The supervisor says its line before it logs the event: once logged, the line is out.
    wait_for(lambda: "committed" in _logged(tmp_path / "snaps"), "a committed snapshot in the run log", proc=run)
    run.kill_group()
    err = run.proc.stderr.read()
    restarted = gpusnap("restart", *flags, "snaps", cwd=tmp_path)
    assert restarted.returncode == 0, restarted.stderr

    said_commit = "committed at iteration" in err
    said_request = "asking for a snapshot (signal)" in err
    said_restore = "restored snapshot 000001" in restarted.stderr and "resuming from snapshot" in restarted.stderr
    assert (said_commit, said_request, said_restore) == {
        "--quiet": (False, False, False), None: (True, False, True), "--verbose": (True, True, True)}[flag], err + restarted.stderr
    if flag == "--quiet":
        assert [line for line in restarted.stderr.splitlines() if line.startswith("gpusnap:")] == []
    log = _logged(tmp_path / "snaps")
    assert "committed" in log and "request" in log


def _on_a_terminal(args, cwd, env, signal_at_step=None, out=None, timeout=120) -> tuple[int, str]:
    """Run gpusnap with its stderr on a pseudo-terminal (stdout elsewhere); SIGUSR1 to it once
    the program reached ``signal_at_step``. Returns the exit status and what the terminal got."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "gpusnap", *map(str, args)], cwd=cwd, env=harness_env(env),
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=slave)
    os.close(slave)
    got, deadline, sent = b"", time.monotonic() + timeout, signal_at_step is None
    try:
        while time.monotonic() < deadline:
            if not sent and progress(out) >= signal_at_step:
                proc.send_signal(signal.SIGUSR1)
                sent = True
            ready, _, _ = select.select([master], [], [], 0.05)
            if ready:
                try:
                    data = os.read(master, 65536)
                except OSError:  # EIO: every writer of the terminal is gone
                    data = b""
                if not data:
                    break
                got += data
            elif proc.poll() is not None:
                break
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
    return proc.wait(timeout=30), got.decode(errors="replace")


@pytest.mark.slow
@pytest.mark.more  # 50 s of writes long enough to draw the line: GPUSNAP_TEST_CORPUS=all
def test_long_writes_and_restores_show_a_status_line_on_a_terminal_only(tmp_path):
    program = copy_programs(tmp_path) / "big_state.py"
    _, out = ref_and_out(tmp_path)
    env = {"GPUSNAP_STATUS_AFTER_S": "0", "TEST_STEP_SLEEP_S": "0.05"}
    status, said = _on_a_terminal(["run", "--dir", "snaps", program, out, 30, 300], tmp_path, env, signal_at_step=5, out=out)
    assert status == 0, said
    # redrawn in place (carriage return, erase the line), then erased before the commit's line
    assert "\r\x1b[Kgpusnap: writing snapshot 000001: " in said, said
    assert "\r\x1b[Kgpusnap: snapshot 000001 committed at iteration" in said, said
    (out / "final.pt").unlink()
    status, said = _on_a_terminal(["restart", "snaps"], tmp_path, env)
    assert status == 0, said
    assert "\r\x1b[Kgpusnap: restoring snapshot 000001: read " in said and "\r\x1b[Kgpusnap: restored snapshot 000001" in said, said
    # not a terminal: whole lines only
    piped = gpusnap("restart", "snaps", cwd=tmp_path, env=env)
    assert piped.returncode == 0 and "restored snapshot 000001" in piped.stderr and "\r" not in piped.stderr, piped.stderr
