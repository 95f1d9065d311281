"""Failure paths of a running `gpusnap run`, as a user meets them: the real CLI, the real trainee
and writer processes, real signals. Each case makes one part fail for real and asserts what the
user sees (exit status, the one-line message) and that nothing committed is lost."""

from __future__ import annotations

import json
import signal
import time

import psutil
import pytest
import harness
from harness import Run, committed_ids, copy_programs, gpusnap, plain, progress, request_snapshot, run_log

from gpusnap.errors import EXIT_PREEMPTED

pytestmark = pytest.mark.slow  # end-to-end runs: the full suite, not the quick loop


def _counters(tmp_path):
    programs = copy_programs(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    return programs / "notorch" / "counters.py", out


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
    wait_for(lambda: any(e.get("id") == first and e["event"] in ("committed", "failed") for e in run_log(tmp_path / "snaps")),
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
    assert [e["event"] for e in run_log(tmp_path / "snaps") if e.get("id") == "000002" and e["event"] in ("committed", "failed")][-1] == "committed"

    # Requeued: the same command continues from the committed snapshot, to the same end.
    again = gpusnap("run", "--keep", "2", "--dir", "snaps", counters, out, steps, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert "resuming from snapshot 000002" in again.stderr
    ref = tmp_path / "ref"
    ref.mkdir()
    plain(counters, ref, steps, cwd=tmp_path)
    assert (out / "final.json").read_text() == (ref / "final.json").read_text()


def _gone(proc: psutil.Process) -> bool:
    """Dead: exited, or a zombie nobody reaps (an orphan's new parent may be a PID 1 that never
    waits)."""
    try:
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_for(predicate, what: str, timeout: float = 120, proc=None, cleanup=()):
    """harness.wait_for; on a timeout, first kills the processes in ``cleanup`` (orphans that
    nothing else would stop)."""
    try:
        return harness.wait_for(predicate, what, timeout=timeout, proc=proc)
    except AssertionError:
        for p in cleanup:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        raise


def _caught(pid: int, signum: int) -> bool:
    """Whether process ``pid`` has a handler for ``signum`` (SigCgt in /proc/PID/status)."""
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    return False


@pytest.mark.parametrize("signum, code", [(signal.SIGUSR1, 0), (signal.SIGTERM, EXIT_PREEMPTED)])
def test_a_signal_sent_to_the_trainee_while_it_boots_waits_for_its_handler(tmp_path, signum, code):
    """Slurm's `scancel --signal` and a user's `kill` reach the trainee itself, maybe before
    gpusnap's handlers are in place: the signal is held until they are, never the default
    action that would kill the program with nothing saved."""
    # The test races the trainee's boot: on a busy machine the trainee may have its handlers
    # before the test sees it, which tests nothing, so it tries again, up to 5 times.
    for attempt in range(5):
        here = tmp_path / f"try{attempt}"
        here.mkdir()
        counters, out = _counters(here)
        run = Run("run", "--dir", "snaps", counters, out, 300, cwd=here)
        trainee = wait_for(lambda: psutil.Process(run.proc.pid).children(), "the trainee", proc=run)[0]
        early = not _caught(trainee.pid, signum)
        trainee.send_signal(signum)
        status, _, err = run.wait()
        if early:
            break
        print(f"try {attempt}: the trainee had its handler before the test could signal it")

    assert early, "5 times the trainee had its handler before the test could signal it: nothing was tested"
    assert status == code, err
    assert "gpusnap: snapshot 000001 committed at iteration" in err, err
    assert committed_ids(here / "snaps") == {"000001"}


def test_a_supervisor_killed_with_sigkill_takes_its_trainee_with_it(tmp_path):
    counters, out = _counters(tmp_path)
    run = Run("run", "--dir", "snaps", counters, out, 100_000, cwd=tmp_path)
    wait_for(lambda: progress(out) >= 3, "step 3", proc=run)
    trainee = psutil.Process(run.proc.pid).children()[0]
    run.proc.kill()  # SIGKILL to the supervisor alone: it cannot clean up
    run.proc.wait(timeout=30)
    wait_for(lambda: _gone(trainee), "the orphaned trainee to die", timeout=10, cleanup=[trainee])
    reached = progress(out)
    time.sleep(0.5)
    assert progress(out) == reached  # nothing trains on unsupervised
    # Nobody holds the run directory any more: the job can be run again.
    assert gpusnap("gc", "snaps", cwd=tmp_path).returncode == 0


def test_a_writer_orphaned_mid_write_dies_and_its_snapshot_is_never_committed(tmp_path):
    programs = copy_programs(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    snaps = tmp_path / "snaps"
    run = Run("run", "--dir", "snaps", programs / "big_state.py", out, 100_000, 400, cwd=tmp_path,
              env={"TEST_STEP_SLEEP_S": "0.02"})
    wait_for(lambda: progress(out) >= 3, "step 3", proc=run)
    trainee = psutil.Process(run.proc.pid).children()[0]
    run.signal(signal.SIGUSR1)
    writer = wait_for(lambda: trainee.children(), "the writer", proc=run)[0]
    # Mid-write: its first pack is on disk, its manifest is not.
    wait_for(lambda: list((snaps / "packs").glob("*/*.pack")) and not committed_ids(snaps), "a pack of the snapshot")
    assert writer.name() == "gpusnap-writer"  # what top and ps show, not a second copy of the program
    run.proc.kill()
    run.proc.wait(timeout=30)
    wait_for(lambda: _gone(trainee) and _gone(writer), "the trainee and its writer to die", timeout=10,
             cleanup=[trainee, writer])
    packs = list((snaps / "packs").glob("*/*.pack"))
    time.sleep(0.5)
    assert list((snaps / "packs").glob("*/*.pack")) == packs  # nothing writes on

    # What the writer left is debris, never a snapshot: nothing is committed, nothing is damage,
    # and gc removes it.
    assert committed_ids(snaps) == set()
    verified = gpusnap("verify", "snaps", "--json", cwd=tmp_path)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    report = json.loads(verified.stdout)
    assert report["findings"] == [] and {x["kind"] for x in report["leftovers"]} <= {"unindexed_pack", "temp_file"}
    assert report["leftovers"], "the writer was killed before it wrote anything"
    assert gpusnap("gc", "snaps", cwd=tmp_path).returncode == 0
    assert list((snaps / "packs").glob("*/*.pack")) == []


# How a writer hangs for real: (program and arguments after OUT, what the test does to the
# writer, the state the message names, the step after which a snapshot can commit again).
HANGS = {
    # SIGSTOP, as a debugger or a job-control mishap does.
    "stopped": (["big_state.py", 100_000, 200], "stop", "stopped", 0),
    # Pickling waits for a lock that another thread of the trainee held at fork.
    "deadlocked": (["notorch/held_lock.py", 100_000, 5, 250], None, "blocked", 250),
}


@pytest.mark.parametrize("cause", HANGS)
def test_a_hung_writer_is_killed_after_the_timeout_and_training_goes_on(tmp_path, cause):
    """A writer that makes no progress is killed by the trainee after GPUSNAP_WRITER_TIMEOUT_S:
    the snapshot fails with one line, training goes on, and the next snapshot commits."""
    (program, *args), action, state, free_after = HANGS[cause]
    programs = copy_programs(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    snaps = tmp_path / "snaps"
    run = Run("run", "--dir", "snaps", programs / program, out, *args, cwd=tmp_path,
              env={"TEST_STEP_SLEEP_S": "0.02", "GPUSNAP_WRITER_TIMEOUT_S": "3"})
    try:
        wait_for(lambda: progress(out) >= 7, "step 7", proc=run)
        trainee = psutil.Process(run.proc.pid).children()[0]
        run.signal(signal.SIGUSR1)
        writer = wait_for(lambda: trainee.children(), "the writer", proc=run)[0]
        if action == "stop":
            writer.suspend()
        hung_at = time.time()
        failed = wait_for(lambda: [e for e in run_log(tmp_path / "snaps") if e["event"] == "failed"], "the snapshot to fail",
                          timeout=60, proc=run)[0]
        assert failed["id"] == "000001"
        assert failed["message"] == (
            f"the writer (pid {writer.pid}) made no progress for 3 s ({state}) and was killed; earlier snapshots "
            "are intact, training goes on (GPUSNAP_WRITER_TIMEOUT_S sets the limit)")
        # The timeout, not anything sooner: it counts from the last progress seen, which is at
        # most one sample (a quarter of the timeout) before the hang.
        assert failed["t"] - hung_at >= 3 * 0.75
        assert _gone(writer)
        reached = max(progress(out), free_after)
        wait_for(lambda: progress(out) > reached + 3, "training to go on", proc=run)

        later = request_snapshot(run, snaps)  # the next snapshot works (it takes the free id)
        assert later == "000001"
        run.signal(signal.SIGTERM)
        code, _, err = run.wait()
    finally:
        if run.proc.poll() is None:
            run.kill_group()
    assert code == EXIT_PREEMPTED, err
    assert f"gpusnap: snapshot 000001 failed: {failed['message']}" in err.splitlines()
    verified = gpusnap("verify", "snaps", cwd=tmp_path)
    assert verified.returncode == 0, verified.stdout + verified.stderr


def test_memory_the_fork_does_not_pass_on_and_the_stall_does_not_find_fails_the_snapshot_with_a_hint(tmp_path):
    """Do-not-fork memory (CUDA's pinned memory may be) deeper in the program's objects than the
    stall looks: the writer would die reading it, so the snapshot fails with one line naming it
    and a hint, and the run ends normally."""
    programs = copy_programs(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    run = Run("run", "--dir", "snaps", programs / "notorch" / "dontfork.py", out, 150, "--deep", cwd=tmp_path)
    harness.wait_for(lambda: progress(out) >= 5, "step 5", proc=run)
    run.signal(signal.SIGUSR1)
    code, _, err = run.wait()
    assert code == 0, err
    assert progress(out) == 150
    assert "failed: CaptureError: a numpy array of 1,048,576 bytes at 0x" in err
    assert "is not in the forked writer's memory" in err
    assert "hint: this snapshot fails and training goes on" in err
    assert committed_ids(tmp_path / "snaps") == set()


@pytest.mark.parametrize("raised", ["EMFILE", "MemoryError", "KeyboardInterrupt"])
def test_an_error_in_the_fork_window_stays_in_the_writer(tmp_path, raised):
    """The writer's first file open (its memory map, right after fork) fails: the snapshot fails
    with one line, exactly one copy of the program goes on training, and it ends as an
    uninterrupted run does. Before, the error returned from fork() into the program's loop in
    the child, and two copies trained."""
    programs = copy_programs(tmp_path)
    program = programs / "notorch" / "counters.py"
    ref, out = tmp_path / "ref", tmp_path / "out"
    ref.mkdir()
    out.mkdir()
    plain(program, ref, 150, cwd=tmp_path)
    fault = tmp_path / "fault"  # the chaos tool's injector: a forked writer's first open raises
    fault.write_text(f"FORK-{raised}")
    env = {"PYTHONPATH": f"{harness.REPO / 'tools' / 'chaos' / 'inject'}:{harness.REPO}", "GPUSNAP_CHAOS_FAULT": str(fault),
           "TEST_STEP_SLEEP_S": "0.02"}
    run = Run("run", "--dir", "snaps", program, out, 150, cwd=tmp_path, env=env)
    harness.wait_for(lambda: progress(out) >= 5, "step 5", proc=run)
    trainee = psutil.Process(run.proc.pid).children()[0]
    run.signal(signal.SIGUSR1)
    harness.wait_for(lambda: "failed" in (tmp_path / "snaps" / "log.jsonl").read_text(), "the failed snapshot", proc=run)
    at = progress(out)
    harness.wait_for(lambda: progress(out) >= at + 5, "five more steps", proc=run)
    assert trainee.children() == [], "a copy of the program trains in the writer"
    code, _, err = run.wait()
    assert code == 0, err
    failed = [line for line in err.splitlines() if "failed" in line or "Traceback" in line]
    why = {"EMFILE": "OSError: [Errno 24] Too many open files", "MemoryError": "MemoryError: MemoryError",
           "KeyboardInterrupt": "KeyboardInterrupt: KeyboardInterrupt"}[raised]
    assert failed == [f"gpusnap: snapshot 000001 failed: {why}"], err
    assert committed_ids(tmp_path / "snaps") == set()
    assert (out / "final.json").read_text() == (ref / "final.json").read_text()
