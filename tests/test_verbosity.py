"""--quiet says only what goes wrong and why a run stops; --verbose adds requests and
connections; the default says every snapshot. The run log (DIR/log.jsonl) has everything
whatever the verbosity."""

from __future__ import annotations

import json
import signal

import pytest
from harness import Run, copy_programs, gpusnap, progress, ref_and_out, snapshots, wait_for


@pytest.mark.parametrize("flag", ["--quiet", None, "--verbose"])
def test_verbosity_of_run_and_restart(tmp_path, flag):
    program = copy_programs(tmp_path) / "notorch" / "counters.py"
    _, out = ref_and_out(tmp_path)
    flags = [flag] if flag else []
    run = Run("run", *flags, "--dir", "snaps", program, out, 200, cwd=tmp_path, env={"TEST_STEP_SLEEP_S": "0.02"})
    wait_for(lambda: progress(out) >= 10, "step 10", proc=run)
    run.signal(signal.SIGUSR1)
    wait_for(lambda: snapshots(tmp_path / "snaps", tmp_path), "a committed snapshot", proc=run)
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
    log = [json.loads(line)["event"] for line in (tmp_path / "snaps" / "log.jsonl").read_text().splitlines()]
    assert "committed" in log and "request" in log
