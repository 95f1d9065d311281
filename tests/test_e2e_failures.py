"""Failure paths of a running `gpusnap run`, as a user meets them: the real CLI, the real trainee
and writer processes, real signals. Each case makes one part fail for real and asserts what the
user sees (exit status, the one-line message) and that nothing committed is lost."""

from __future__ import annotations

import json
import signal

from harness import Run, copy_programs, gpusnap, plain, progress, request_snapshot, wait_for

from gpusnap.errors import EXIT_PREEMPTED


def _counters(tmp_path):
    programs = copy_programs(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    return programs / "notorch" / "counters.py", out


def _log(tmp_path) -> list[dict]:
    """The run log's records (DIR/log.jsonl)."""
    try:
        return [json.loads(line) for line in (tmp_path / "snaps" / "log.jsonl").read_text().splitlines()]
    except FileNotFoundError:
        return []


def test_a_retention_failure_after_the_commit_is_a_warning_and_sigterm_still_exits_75(tmp_path):
    """--keep prunes after each commit. When pruning fails (here: an older manifest that no
    longer parses, so gc cannot tell what that snapshot needs), the new snapshot is still
    committed: SIGTERM exits 75, the job is requeued and continues from it."""
    counters, out = _counters(tmp_path)
    steps = 400
    run = Run("run", "--keep", "2", "--dir", "snaps", counters, out, steps, cwd=tmp_path)
    wait_for(lambda: progress(out) >= 5, "step 5", proc=run)
    first = request_snapshot(run, tmp_path / "snaps")
    # The manifest is there before its writer has pruned and reported: wait for the report.
    wait_for(lambda: any(e.get("id") == first and e["event"] in ("committed", "failed") for e in _log(tmp_path)),
             "the first writer's report", proc=run)
    damaged = tmp_path / "snaps" / "snapshots" / f"{first}.json"
    damaged.write_bytes(damaged.read_bytes()[:100])  # bit rot in an older snapshot
    run.signal(signal.SIGTERM)
    code, _, err = run.wait()

    assert code == EXIT_PREEMPTED, err
    lines = err.splitlines()
    committed = next(i for i, line in enumerate(lines) if line.startswith("gpusnap: snapshot 000002 committed at"))
    assert lines[committed + 1].startswith(
        "gpusnap: warning: retention (--keep 2) failed after the commit: gc stops: manifest of snapshot "
        f"{first} is damaged: "), err
    assert lines[committed + 2] == f"hint: move {damaged} out of the directory, then run gc again", err
    assert "failed:" not in err.replace("failed after the commit", "")
    assert [e["event"] for e in _log(tmp_path) if e.get("id") == "000002"][-1] == "committed"

    # Requeued: the same command continues from the committed snapshot, to the same end.
    again = gpusnap("run", "--keep", "2", "--dir", "snaps", counters, out, steps, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert "resuming from snapshot 000002" in again.stderr
    ref = tmp_path / "ref"
    ref.mkdir()
    plain(counters, ref, steps, cwd=tmp_path)
    assert (out / "final.json").read_text() == (ref / "final.json").read_text()
