"""A snapshot becomes durable without waiting for training to leave it a core: a stop snapshot's
writer runs at the trainee's priority on every core while the trainee idles, and a periodic one,
whose encoders run at idle priority, is paced to commit even where training and its DataLoader
workers keep every core busy (capture/trainee/pace.py). Both say how long they took to be durable."""

from __future__ import annotations

import json
import os
import signal
import time

import psutil
import pytest

from gpusnap import atomic
from gpusnap.errors import EXIT_PREEMPTED
from harness import (Run, assert_same, gpusnap, load_final, plain, programs_and_out, progress, request_snapshot,
                     wait_for)

pytestmark = pytest.mark.slow  # end-to-end runs: the full suite, not the quick loop

SCHED_IDLE = 5


def policies(pid: int) -> list[int]:
    """The scheduling policy of each thread of ``pid`` (field 41 of /proc/PID/task/TID/stat)."""
    out = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat", "rb") as f:
                out.append(int(f.read().rsplit(b")", 1)[1].split()[38]))
        except (OSError, IndexError, ValueError):
            pass
    return out


def windows_here(directory, expected: str) -> str:
    """What a stop snapshot's manifest says of its pack windows in ``directory``: none where
    every write is a copy anyway (tmpfs)."""
    return "none" if atomic.copies_writes(directory) else expected


def log(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "log.jsonl").read_text().splitlines()]


def test_a_stop_snapshot_writes_at_the_trainees_priority_on_every_core_while_the_trainee_idles(tmp_path):
    programs, out = programs_and_out(tmp_path)
    run = Run("run", "--dir", "snaps", programs / "big_state.py", out, 100_000, 192, cwd=tmp_path)
    wait_for(lambda: progress(out) >= 3, "step 3", proc=run)
    trainee = psutil.Process(run.proc.pid).children()[0]
    run.signal(signal.SIGTERM)
    writer_seen, trainee_idle = [], []
    while run.proc.poll() is None:
        try:
            children = trainee.children()
            if children:
                writer_seen.append(policies(children[0].pid))
                trainee_idle.append(set(policies(trainee.pid)) == {SCHED_IDLE})
        except (psutil.NoSuchProcess, FileNotFoundError):
            pass
        time.sleep(0.005)
    code, _, err = run.wait()
    assert code == EXIT_PREEMPTED, err
    assert any(len(seen) > 2 for seen in writer_seen)  # its encoder threads, seen at work
    assert all(SCHED_IDLE not in seen for seen in writer_seen)
    assert any(trainee_idle)
    manifest = json.loads((tmp_path / "snaps" / "snapshots" / "000001.json").read_text())
    assert manifest["writer"]["priority"] == "trainee" and manifest["writer"]["threads"] == len(os.sched_getaffinity(0))
    assert manifest["drain"]["bytes"] == 0  # training stops: nothing to drain for it
    assert 0 < manifest["write_s"] < manifest["durable_s"]
    # No optimizer steps its large buffer, so no drain region was reserved ahead for it: the
    # writer's pack windows are its own (the next test has one).
    assert manifest["writer"]["windows"] == windows_here(tmp_path, "own")


# shrinks.py trains 12 MiB of Adam state until its switch_at step; with packs of 1 MiB a snapshot
# of it fills several, and the windows (2.5 MiB) fit in its drain region.
SMALL_PACKS = {"GPUSNAP_PACK_BYTES": str(1 << 20), "GPUSNAP_CHUNK_BYTES": str(256 << 10)}


def shrinks(tmp_path, steps: int, switch_at: int):
    """shrinks.py under `gpusnap run` with SMALL_PACKS: (the Run, its OUT, a check that runs it
    again, as a requeue does, and finds the bytes of an uninterrupted run at its end)."""
    programs, out = programs_and_out(tmp_path)
    program = (programs / "shrinks.py", out, steps, switch_at)
    ref = tmp_path / "ref"
    ref.mkdir()
    plain(programs / "shrinks.py", ref, steps, switch_at, cwd=tmp_path)

    def requeued_ends_right():
        again = gpusnap("run", "--dir", "snaps", *program, cwd=tmp_path, env=SMALL_PACKS)
        assert again.returncode == 0, again.stderr
        assert_same(load_final(ref), load_final(out))

    return Run("run", "--dir", "snaps", *program, cwd=tmp_path, env=SMALL_PACKS), out, requeued_ends_right


@pytest.mark.more  # the stop snapshot's write path: test_e2e_snapshot's SIGTERM tests; its pages ahead: here (CI's time)
def test_a_stop_snapshot_writes_its_packs_from_pages_the_trainee_allocated_ahead(tmp_path):
    """The drain region the trainee reserved and populated ahead for the next snapshot, which a
    stop snapshot does not drain into, holds its pack windows (the writer allocates no memory),
    and the run restarts from it to the bytes of an uninterrupted one."""
    run, out, requeued_ends_right = shrinks(tmp_path, 200, 190)
    wait_for(lambda: progress(out) >= 20, "step 20", proc=run)
    run.signal(signal.SIGTERM)
    code, _, err = run.wait()
    assert code == EXIT_PREEMPTED, err
    manifest = json.loads((tmp_path / "snaps" / "snapshots" / "000001.json").read_text())
    assert manifest["writer"]["windows"] == windows_here(tmp_path, "ahead")
    requeued_ends_right()


def test_a_periodic_snapshot_commits_while_training_and_its_workers_keep_every_core_busy(tmp_path):
    """At idle priority alone the writer got no CPU until the program ended (its snapshot came
    after the last step; without the pacer, it still did in 1 of 2 runs here); paced, it commits
    while training goes on, and says so at once: the run log's commit came after the last step
    in 3 of 5 runs here while the writer's starved encoders were still to end."""
    programs, out = programs_and_out(tmp_path)
    steps = 80  # 75 after the request: a writer at idle priority alone committed 60 later; paced, 15-52 later here
    run = Run("run", "--dir", "snaps", programs / "busy_workers.py", out, steps, cwd=tmp_path,
              env={"TEST_STEP_SLEEP_S": "0"})
    wait_for(lambda: progress(out) >= 5, "step 5", proc=run)
    run.signal(signal.SIGUSR1)

    def said():
        return next((e for e in log(tmp_path / "snaps") if e["event"] == "committed"), None)

    wait_for(lambda: said() or progress(out) >= steps, "the commit in the run log, or the end", proc=run, timeout=600)
    at_commit = progress(out)
    committed = wait_for(said, "the commit in the run log", proc=run)
    run.kill_group()  # the steps left only spin
    assert at_commit < steps, "the commit was said only once training was over"
    manifest = json.loads((tmp_path / "snaps" / "snapshots" / f"{committed['id']}.json").read_text())
    writer = manifest["writer"]
    print(f"committed at step {at_commit}: write {committed['write_s']} s, deadline {writer['deadline_s']} s, boosts {writer['boosts']}")
    # The pacer's contract: a writer that falls behind its line to the deadline gets encoder
    # threads at normal priority; one that never fell behind (the idle priority's crumbs were
    # enough: its hashing and writes are tens of milliseconds now) needed none, and was done in time.
    assert writer["priority"] == "idle" and (writer["boosts"] >= 1 or committed["write_s"] <= writer["deadline_s"]), writer
    assert committed["durable_s"] >= manifest["durable_s"] > 0
    listed = gpusnap("ls", "snaps", cwd=tmp_path)
    assert listed.returncode == 0 and "DURABLE" in listed.stdout.splitlines()[0]


@pytest.mark.more  # the stop snapshot's test below covers windows allocated ahead: GPUSNAP_TEST_CORPUS=all
def test_a_periodic_snapshot_after_one_that_filled_more_than_a_pack_writes_from_windows_allocated_ahead(tmp_path):
    """A periodic writer that maps its own pack windows allocates and frees them on every
    snapshot; once a snapshot has filled more than one pack, the trainee keeps the next writer's
    windows allocated ahead, and the run restarts from such a snapshot to the bytes of an
    uninterrupted one."""
    run, out, requeued_ends_right = shrinks(tmp_path, 400, 390)
    run_dir = tmp_path / "snaps"
    wait_for(lambda: progress(out) >= 10, "step 10", proc=run)
    first = request_snapshot(run, run_dir)
    after_first = progress(out)
    # The trainee readies the windows (2.5 MiB) in the steps after the first writer is done.
    wait_for(lambda: progress(out) >= after_first + 20, "steps after the first snapshot", proc=run)
    second = request_snapshot(run, run_dir)
    wait_for(lambda: (run_dir / "witness" / f"{second}.json").exists(), "the second snapshot's witness", proc=run)
    run.kill_group()
    windows = [json.loads((run_dir / "snapshots" / f"{i}.json").read_text())["writer"]["windows"] for i in (first, second)]
    assert windows == [windows_here(tmp_path, "own"), windows_here(tmp_path, "ahead")]
    requeued_ends_right()
