"""`gpusnap run` snapshots real programs: the bytes of the right iteration, on signal, timer and
SIGTERM, through writer failures, with live-only objects listed."""

from __future__ import annotations

import json
import os
import signal

import psutil
import pytest
import torch
from harness import (
    Run, assert_same, committed_ids, copy_programs, gpusnap, load_final, plain, programs_and_out, progress, snapshot_now, snapshots, wait_for,
)

from gpusnap.errors import EXIT_PREEMPTED
from gpusnap.restore import load
from gpusnap.store import RunDir

pytestmark = pytest.mark.slow  # end-to-end runs: the full suite, not the quick loop


@pytest.mark.parametrize("workers", [0, 2])
def test_snapshot_holds_the_bytes_of_its_iteration(tmp_path, workers):
    programs, out = programs_and_out(tmp_path)
    run = Run("run", "--dir", "snaps", programs / "style_a.py", out, workers, 2, "--states", cwd=tmp_path)
    wait_for(lambda: progress(out) >= 6, "step 6", proc=run)
    snap = snapshot_now(run, tmp_path / "snaps", tmp_path)
    assert run.wait()[0] == 0

    manifest, roots = load(tmp_path / "snaps", snap["id"])
    main = roots["globals"]["__main__"]
    expected = torch.load(out / "states" / f"{manifest['iteration']}.pt")
    assert main["step"] == manifest["iteration"] == snap["iteration"]
    assert_same(expected["model"], main["model"].state_dict(), "model")
    assert_same(expected["optimizer"], main["optimizer"].state_dict(), "optimizer")
    tensors = [b for b in manifest["buffers"].values() if b["kind"] == "torch"]
    assert tensors and all(b["device"] == "cpu" and b["device_index"] is None for b in tensors)


def test_timer_snapshots_do_not_change_what_the_program_computes_or_logs(tmp_path):
    """The program logs its warnings (logging.captureWarnings), each shown once per place: a
    snapshot's fork once set a filter through catch_warnings, which let every one show again
    after each snapshot."""
    script = copy_programs(tmp_path) / "corpus" / "warn_once.py"
    (tmp_path / "ref").mkdir()
    (tmp_path / "out").mkdir()
    plain(script, tmp_path / "ref", "--epochs", "8", cwd=tmp_path)
    result = gpusnap("run", "--every", "1s", "--dir", "snaps", script, tmp_path / "out", "--epochs", "8",
                     cwd=tmp_path, env={"TEST_STEP_SLEEP_S": "0.05"})
    assert result.returncode == 0, result.stderr
    assert len(snapshots(tmp_path / "snaps", tmp_path)) >= 2, result.stderr
    assert_same(load_final(tmp_path / "ref"), load_final(tmp_path / "out"))


def test_sigterm_snapshots_then_exits_with_the_preempted_code(tmp_path):
    programs = copy_programs(tmp_path)
    (tmp_path / "ref").mkdir()
    out = tmp_path / "out"
    out.mkdir()
    plain(programs / "style_a.py", tmp_path / "ref", 0, 2, cwd=tmp_path)
    run = Run("run", "--dir", "snaps", programs / "style_a.py", out, 0, 2, cwd=tmp_path)
    wait_for(lambda: progress(out) >= 8, "step 8", proc=run)
    run.signal(signal.SIGTERM)
    code, _, err = run.wait()
    assert code == EXIT_PREEMPTED, err
    taken = snapshots(tmp_path / "snaps", tmp_path)
    assert len(taken) == 1 and taken[0]["iteration"] >= 8
    assert not (out / "final.pt").exists()
    # The same command again continues the run (requeue): same bytes as never interrupted.
    again = gpusnap("run", "--dir", "snaps", programs / "style_a.py", out, 0, 2, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert_same(load_final(tmp_path / "ref"), load_final(out))


# Sent to the supervisor alone (test_sigterm_snapshots_then_exits_with_the_preempted_code's path):
# the full set runs the three (CI's time).
@pytest.mark.parametrize("handler,to", [(h, t) if t == "job" else pytest.param(h, t, marks=pytest.mark.more)
                                        for t in ("job", "supervisor") for h in ("flag", "exit-in-handler", "chain")])
def test_a_program_s_own_sigterm_handler_runs_after_the_stop_snapshot_and_the_requeue_finishes(tmp_path, handler, to):
    """A script that handles preemption itself (its SIGTERM handler sets a flag, or exits at
    once). Sent to the whole job, as a scheduler does, the signal reached the program's handler
    too, and the flag went into the stop snapshot: the requeued run stopped at the flag again,
    exit 0, "verified", without finishing. gpusnap's handler stays; the program's runs after the
    snapshot's fork, once the witness is recorded, and its own stop ends the process with the
    preempted code. A handler that calls the one it found (gpusnap's, as Lightning's does) runs
    once: that call asks for nothing."""
    args = {"flag": [], "exit-in-handler": ["--exit-in-handler"], "chain": ["--chain"]}[handler]
    programs, out, code, err = _signal_graceful_exit(tmp_path, args, signal.SIGTERM, to)
    assert code == EXIT_PREEMPTED, err
    assert not (out / "final.pt").exists()
    if handler == "chain":
        handled = (out / "handled.txt").read_text() if to == "job" else ""
        assert handled == ("SIGTERM\n" if to == "job" else ""), handled
    again = gpusnap("run", "--dir", "snaps", programs / "corpus" / "graceful_exit.py", out, *args, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert " verified: " in again.stderr, again.stderr  # the handler ran after the witness: not "unverified"
    assert_same(load_final(tmp_path / "ref"), load_final(out))


# Sent to the supervisor alone, the program never hears it: a plain snapshot, as
# test_snapshot_holds_the_bytes_of_its_iteration takes (the full set runs that case too).
@pytest.mark.parametrize("to", ["job", pytest.param("supervisor", marks=pytest.mark.more)])
def test_a_program_s_own_snapshot_signal_handler_runs_after_the_snapshot_which_restarts_without_its_flag(tmp_path, to):
    """SLURM's `--signal=USR1@90` warns the job before its time limit; a script handles it itself
    (its SIGUSR1 handler, chained to the one it found, sets a flag; at the epoch's end it saves a
    checkpoint of its own and exits 0). SIGUSR1 is gpusnap's snapshot signal: the snapshot is
    taken, the program's handler runs once after its fork, and the program stops as it chose to
    (sent to the supervisor alone, the program never hears it). The snapshot holds the state before the signal: restarting from it finishes the run, verified."""
    _, out, code, err = _signal_graceful_exit(tmp_path, ["--signal", "USR1", "--chain"], signal.SIGUSR1, to)
    assert code == 0, err
    assert "committed" in err
    if to == "supervisor":  # the program never heard it, and finished
        assert not (out / "handled.txt").exists()
        assert_same(load_final(tmp_path / "ref"), load_final(out))
        (out / "final.pt").unlink()
    else:  # the program's own stop
        assert (out / "preempted.pt").exists() and not (out / "final.pt").exists()
        assert (out / "handled.txt").read_text() == "SIGUSR1\n"
    again = gpusnap("restart", "snaps", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert " verified: " in again.stderr, again.stderr
    assert_same(load_final(tmp_path / "ref"), load_final(out))


def _signal_graceful_exit(tmp_path, args, signum, to):
    """Run ``graceful_exit.py`` plainly into ``ref`` and under gpusnap into ``out``; at step 12
    send ``signum`` to the whole job (as a scheduler does) or to the supervisor alone. Returns
    the programs' folder, ``out``, and the run's exit code and stderr."""
    programs, out = programs_and_out(tmp_path)
    (tmp_path / "ref").mkdir()
    plain(programs / "corpus" / "graceful_exit.py", tmp_path / "ref", *args, cwd=tmp_path)
    run = Run("run", "--dir", "snaps", programs / "corpus" / "graceful_exit.py", out, *args, cwd=tmp_path,
              env={"TEST_STEP_SLEEP_S": "0.04"})
    wait_for(lambda: progress(out) >= 12, "step 12", proc=run)
    if to == "job":
        os.killpg(run.proc.pid, signum)
    else:
        run.signal(signum)
    code, _, err = run.wait()
    return programs, out, code, err


def test_a_writer_killed_mid_write_leaves_training_and_earlier_snapshots_alone(tmp_path):
    programs, out = programs_and_out(tmp_path)
    run = Run("run", "--dir", "snaps", programs / "big_state.py", out, 200, 256, cwd=tmp_path,
              env={"TEST_STEP_SLEEP_S": "0.02"})
    wait_for(lambda: progress(out) >= 3, "step 3", proc=run)
    first = snapshot_now(run, tmp_path / "snaps", tmp_path)

    trainee = psutil.Process(run.proc.pid).children()[0]
    # The first writer lives on for a moment after its manifest commits: let it go first.
    wait_for(lambda: not trainee.children(), "the first writer to exit", proc=run)
    run.signal(signal.SIGUSR1)
    writer = wait_for(lambda: trainee.children(), "the writer process", proc=run)[0]
    writer.kill()
    code, _, err = run.wait()
    assert code == 0, err
    assert "failed" in err and "killed by signal 9" in err
    assert (out / "final.pt").exists()
    ids = [s["id"] for s in snapshots(tmp_path / "snaps", tmp_path)]
    assert first["id"] in ids
    verified = gpusnap("verify", "snaps", cwd=tmp_path)
    assert verified.returncode == 0, verified.stdout + verified.stderr


def test_live_only_objects_are_listed_with_their_paths(tmp_path):
    programs, out = programs_and_out(tmp_path)
    run = Run("run", "--dir", "snaps", programs / "holds_live.py", out, 300, cwd=tmp_path)
    wait_for(lambda: progress(out) >= 5, "step 5", proc=run)
    snap = snapshot_now(run, tmp_path / "snaps", tmp_path)
    run.signal(signal.SIGTERM)
    run.wait()
    live = {e["path"]: e["type"] for e in RunDir.open(tmp_path / "snaps").manifest(snap["id"])["live_only"]}
    assert live["globals[__main__].server"] == "socket.socket"
    assert live["globals[__main__].guard"] == "_thread.lock"
    shown = gpusnap("inspect", "snaps", snap["id"], cwd=tmp_path)
    assert "globals[__main__].server" in shown.stdout and "socket.socket" in shown.stdout


def test_program_can_ask_for_a_snapshot(tmp_path):
    programs = copy_programs(tmp_path)
    (tmp_path / "out").mkdir()
    result = gpusnap("run", "--dir", "snaps", programs / "asks_itself.py", tmp_path / "out", 20, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert load_final(tmp_path / "out")["asked"] is True
    manifest = RunDir.open(tmp_path / "snaps").manifest()
    assert manifest["reason"] == "program"


def test_what_the_program_printed_before_a_snapshot_is_out_when_it_is_killed_after(tmp_path):
    """stdout into a pipe (a job's log) is block-buffered: a program killed after a snapshot took
    with it the lines its buffer held, and the restarted run goes on from the snapshot, after
    them, so the log never had them. The stall flushes the program's stdout and stderr."""
    programs, out = programs_and_out(tmp_path)
    buffered = {"TEST_STEP_SLEEP_S": "0.03", "PYTHONUNBUFFERED": ""}  # (empty: unset, as a user's shell has it)
    run = Run("run", "--dir", "snaps", programs / "notorch" / "prints.py", out, 200, cwd=tmp_path, env=buffered)
    wait_for(lambda: progress(out) >= 5, "step 5", proc=run)
    snap = snapshot_now(run, tmp_path / "snaps", tmp_path)
    run.kill_group()
    printed = [line for line in run.proc.stdout.read().splitlines() if line.startswith("step ")]
    assert [int(line.split()[1]) for line in printed][:snap["iteration"]] == list(range(1, snap["iteration"] + 1)), printed


def test_snapshot_outside_gpusnap_warns_and_does_nothing(tmp_path):
    programs = copy_programs(tmp_path)
    (tmp_path / "out").mkdir()
    result = plain(programs / "asks_itself.py", tmp_path / "out", 8, cwd=tmp_path)
    assert load_final(tmp_path / "out")["asked"] is False
    assert "not running under `gpusnap run`" in result.stderr


def test_a_snapshot_that_would_not_fit_in_memory_is_skipped(tmp_path):
    programs, out = programs_and_out(tmp_path)
    run = Run("run", "--dir", "snaps", programs / "style_f.py", out, 200, cwd=tmp_path,
              env={"GPUSNAP_HEADROOM_FRACTION": "0.0001"})
    wait_for(lambda: progress(out) >= 3, "step 3", proc=run)
    run.signal(signal.SIGUSR1)
    code, _, err = run.wait()
    assert code == 0
    assert "snapshot skipped" in err and "copy-on-write worst case" in err
    assert snapshots(tmp_path / "snaps", tmp_path) == []


def test_a_restarted_run_takes_snapshot_after_snapshot(tmp_path):
    """A restarted trainee decompressed its snapshot with blosc2. Had it used blosc2's thread
    pool, its forked writers would inherit a pool fork broke, and about one multi-threaded write
    in five hung until the watchdog killed it. Eight snapshots in a row must each commit fast."""
    programs, out = programs_and_out(tmp_path)
    snaps = tmp_path / "snaps"
    run = Run("run", "--dir", "snaps", programs / "big_state.py", out, 100_000, 48, cwd=tmp_path)
    wait_for(lambda: progress(out) >= 3, "step 3", proc=run)
    snapshot_now(run, snaps, tmp_path)
    run.kill_group()
    (out / "progress").unlink()
    run = Run("restart", "snaps", cwd=tmp_path)
    wait_for(lambda: progress(out), "the restarted run's first step", proc=run)
    try:
        for k in range(8):
            before = committed_ids(snaps)
            run.signal(signal.SIGUSR1)
            wait_for(lambda: committed_ids(snaps) - before, f"snapshot {k + 1} of the restarted run", timeout=30, proc=run)
    finally:
        run.kill_group()


def trainee_pid(run: Run) -> int:
    return psutil.Process(run.proc.pid).children()[0].pid


def staging_arena_bytes(run: Run) -> int:
    """Bytes allocated in the trainee's staging arena (its memfd), 0 when it has none."""
    fds = f"/proc/{trainee_pid(run)}/fd"
    for fd in os.listdir(fds):
        try:
            if os.readlink(f"{fds}/{fd}").startswith("/memfd:gpusnap-arena"):
                return os.stat(f"{fds}/{fd}").st_blocks * 512
        except FileNotFoundError:
            continue
    return 0


def in_huge_pages(run: Run, storages: list) -> list[bool]:
    """For each (address, nbytes) of the trainee: is its first whole huge page a huge page?
    Read from the page tables (pagemap, kpageflags: needs root, else the test skips)."""
    from gpusnap.stage import hugepages

    pid, found = trainee_pid(run), []
    try:
        with open(f"/proc/{pid}/pagemap", "rb") as pagemap, open("/proc/kpageflags", "rb") as kpageflags:
            for storage in storages:
                lo, _ = hugepages.huge_spans([storage])[0]
                pagemap.seek(lo // 4096 * 8)
                entry = int.from_bytes(pagemap.read(8), "little")
                pfn = entry & ((1 << 55) - 1)
                if not entry >> 63 or not pfn:
                    pytest.skip("page frame numbers are hidden (not root)")
                kpageflags.seek(pfn * 8)
                found.append(bool(int.from_bytes(kpageflags.read(8), "little") >> 22 & 1))  # KPF_THP
    except PermissionError:
        pytest.skip("no access to /proc/kpageflags (not root)")
    return found


def kernel_collapses_huge_pages() -> bool:
    from gpusnap.stage import hugepages

    probe = torch.zeros(2 * hugepages.HUGE_PAGE // 4)
    return any(hugepages.collapse([(probe.untyped_storage().data_ptr(), probe.untyped_storage().nbytes())]))


def thp_always() -> bool:
    with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
        return "[always]" in f.read()


DRAIN_MODES = {
    "large tensors drained": {},  # big, wide_t (and wide, alias, alias_strided through them)
    "every tensor drained": {"GPUSNAP_DRAIN_MIN_BYTES": "1"},
    "drain released after": {"GPUSNAP_DRAIN": "release"},
    "no huge pages": {"GPUSNAP_HUGEPAGES": "off"},
    "no drain": {"GPUSNAP_DRAIN": "off"},
}
REGION_KEPT = ("large tensors drained", "every tensor drained", "no huge pages")


# The drain's other settings are rarer paths to the same regions (GPUSNAP_TEST_CORPUS=all runs them).
MORE_MODES = ("every tensor drained", "drain released after", "no huge pages")


@pytest.mark.parametrize("mode", [pytest.param(m, marks=pytest.mark.more) if m in MORE_MODES else m for m in DRAIN_MODES])
def test_buffers_written_right_after_the_boundary_hold_the_bytes_of_their_iteration(tmp_path, mode):
    """The trainee writes its large buffers first thing after fork while the writer drains them
    to its region of the staging arena, and numpy arrays alias a tensor (one strided, one under
    a tensor): the snapshot holds the boundary's bytes, whoever reached each page first. Two
    snapshots, so the second drain reuses the region pages the first one filled."""
    programs, out = programs_and_out(tmp_path)
    run = Run("run", "--dir", "snaps", programs / "shared_views.py", out, 400, cwd=tmp_path,
              env={"TEST_STEP_SLEEP_S": "0.02", **DRAIN_MODES[mode]})
    wait_for(lambda: progress(out) >= 5, "step 5", proc=run)
    # Before any snapshot, the trainee has readied what Adam steps (first weight 4 MiB,
    # exp_avg, exp_avg_sq; the rest is under 256 KiB): their drain region in the arena, unless
    # its pages are not kept, and huge pages under them (one whole huge page at least in each),
    # unless off.
    if mode in REGION_KEPT:
        wait_for(lambda: staging_arena_bytes(run) >= 3 * (4 << 20), "the drain region allocated ahead", proc=run)
    else:
        assert staging_arena_bytes(run) == 0
    adam = json.loads((out / "adam_storages.json").read_text())
    if mode in ("no huge pages", "no drain"):
        if not thp_always():
            assert in_huge_pages(run, adam) == [False] * 3
    elif kernel_collapses_huge_pages():
        wait_for(lambda: in_huge_pages(run, adam) == [True] * 3, "huge pages under Adam's tensors", proc=run)
    # Else this process could not collapse a probe (fragmented memory, a busy machine): the
    # trainee may still get huge pages from MADV_HUGEPAGE and khugepaged, or not; nothing to say.
    snapshot_now(run, tmp_path / "snaps", tmp_path)
    snap = snapshot_now(run, tmp_path / "snaps", tmp_path)
    run.kill_group()

    manifest, roots = load(tmp_path / "snaps", snap["id"])
    drained = manifest["drain"]["bytes"]
    assert drained == 0 if mode == "no drain" else drained >= (12 << 20) + (4 << 20), drained
    main = roots["globals"]["__main__"]
    expected = torch.load(out / "states" / f"{main['step']}.pt", weights_only=False)
    assert_same(expected["big"], main["big"], "big")
    assert_same(expected["wide_t"], main["wide_t"], "wide_t")
    for name in ("alias", "alias_strided", "wide", "strided"):
        assert main[name].tobytes() == expected[name].tobytes(), name
    assert_same(expected["model"], main["model"].state_dict(), "model")
    assert_same(expected["optimizer"], main["optimizer"].state_dict(), "optimizer")
