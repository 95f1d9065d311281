"""Drives real programs under the real CLI: start, signal by training step, kill, restart, compare.

Programs live in tests/programs; each takes its output directory as first argument, writes
``progress`` (the step it reached) after every step and ``final.pt`` at the end (those in
tests/programs/notorch: ``final.json``). Every helper that starts Python takes ``python``, the
interpreter to run the program and gpusnap under (default: this one).
"""

from __future__ import annotations

import fcntl
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import forkserver
import torch

REPO = Path(__file__).resolve().parent.parent
PROGRAMS = REPO / "tests" / "programs"


def copy_programs(dest: Path) -> Path:
    """A private copy of the programs, so instrumented-source hashes and cwd are per test."""
    target = dest / "programs"
    shutil.copytree(PROGRAMS, target, ignore=shutil.ignore_patterns("__pycache__"))
    return target


def programs_and_out(tmp_path: Path) -> tuple[Path, Path]:
    """The programs' private copy and an empty ``out`` directory for what a program writes."""
    out = tmp_path / "out"
    out.mkdir()
    return copy_programs(tmp_path), out


def ref_and_out(tmp_path: Path) -> tuple[Path, Path]:
    """Empty output directories for the uninterrupted reference run and the interrupted one."""
    ref, out = tmp_path / "ref", tmp_path / "out"
    ref.mkdir()
    out.mkdir()
    return ref, out


def _gpusnap_command(python: str, args) -> list[str]:
    return [python, "-m", "gpusnap", *map(str, args)]


def gpusnap(*args, cwd: Path, timeout: float = 240, env: dict | None = None, python: str = sys.executable) -> subprocess.CompletedProcess:
    # A restart or a replay run to their end here, with no signal to time by step: unpaced.
    unpaced = bool(args) and (args[0] == "restart" or tuple(args[:2]) == ("verify", "--replay"))
    return subprocess.run(
        _gpusnap_command(python, args), cwd=cwd, capture_output=True, text=True, timeout=timeout,
        env=_env(env, step_sleep_s="0" if unpaced else PACED_STEP_S),
    )


def plain(
    program: Path, *args, cwd: Path, timeout: float = 240, env: dict | None = None, python: str = sys.executable
) -> subprocess.CompletedProcess:
    """An uninterrupted reference run of ``program`` to its end (forked from an interpreter that
    has imported torch: tests/forkserver.py); asserts that it exited 0."""
    reference = start_plain(program, *args, cwd=cwd, env=env, python=python)
    out, err = reference.communicate(timeout=timeout)
    assert reference.returncode == 0, err
    return subprocess.CompletedProcess(reference.args, reference.returncode, out, err)


def start_plain(program: Path, *args, cwd: Path, env: dict | None = None, python: str = sys.executable):
    """``plain`` in the background, for a reference run beside the run under test (the caller
    waits for it: ``communicate()``, which returns its stdout and stderr)."""
    # a reference: nothing signals it by step
    return forkserver.start([program, *args], cwd, _env(env, step_sleep_s="0"), python)


PACED_STEP_S = "0.01"  # a program's pause after each step (tests/programs/notorch/pace.py), unless a test sets its own


def _env(extra: dict | None = None, step_sleep_s: str = PACED_STEP_S, base: dict | None = None) -> dict:
    """The environment of a program or a gpusnap command: a run a test signals by step is paced
    (``TEST_STEP_SLEEP_S``) so that the step it waits for is not long gone by the time it looks;
    a reference run or a restart that runs to its end needs no pace. One intra-op thread: the
    programs' models are small, and with the cores shared by the writer and the other tests'
    programs, more threads spend their time waiting for each other (reference and run get the same)."""
    env = dict(os.environ if base is None else base)
    env.setdefault("TEST_STEP_SLEEP_S", step_sleep_s)
    env.setdefault("OMP_NUM_THREADS", "1")
    # This checkout's gpusnap, under every interpreter: an environment's editable install may be
    # another checkout's (worktrees that share one interpreter).
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.update(extra or {})
    return env


STARTED: list = []  # every Run of the test under way: tests/conftest.py kills what is left at its end


def kill_what_is_left() -> None:
    """Kill the process group of every Run the test started that still runs: a test that failed
    while waiting left its run training (one, hung, ran on for minutes beside later tests)."""
    while STARTED:
        run = STARTED.pop()
        if getattr(run, "proc", None) is not None and run.proc.poll() is None:
            run.kill_group()


class Run:
    """One `gpusnap run` (or restart) in its own session, so the test can kill its whole group.
    ``prefix``: a command that execs the rest (``sh -c '... && exec "$@"' sh``), to start the
    run somewhere of its own (a memory cgroup)."""

    def __init__(self, *args, cwd: Path, env: dict | None = None, python: str = sys.executable, prefix: tuple = ()):
        self.cwd = cwd
        self.python = python
        STARTED.append(self)
        self.proc = subprocess.Popen(
            [*prefix, *_gpusnap_command(python, args)],
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
            env=_env(env),
        )

    def signal(self, signum: int) -> None:
        os.kill(self.proc.pid, signum)

    def kill_group(self) -> None:
        """What a dead node does to the job: everything gone at once."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=30)

    def wait(self, timeout: float = 240) -> tuple[int, str, str]:
        out, err = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, out, err


def progress(out: Path) -> int:
    try:
        return int((out / "progress").read_text() or 0)
    except (FileNotFoundError, ValueError):
        return 0


def wait_for(predicate, what: str, timeout: float = 120, proc: Run | None = None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if proc is not None and proc.proc.poll() is not None:
            _, err = proc.proc.communicate()
            raise AssertionError(f"program exited ({proc.proc.returncode}) while waiting for {what}:\n{err}")
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def snapshots(run_dir: Path, cwd: Path, python: str = sys.executable) -> list[dict]:
    result = gpusnap("ls", run_dir, "--json", cwd=cwd, python=python)
    if result.returncode != 0:
        return []
    return json.loads(result.stdout)


def committed_ids(run_dir: Path) -> set[str]:
    """Ids of the committed snapshots: a snapshot exists exactly when its manifest does
    (docs/FORMAT.md). Cheap enough to poll, unlike `gpusnap ls`, which starts an interpreter."""
    return {p.stem for p in (run_dir / "snapshots").glob("*.json")}


def run_log(run_dir: Path) -> list[dict]:
    """The run log's records (DIR/log.jsonl); none before it exists, and not a last line still
    being written."""
    try:
        lines = (run_dir / "log.jsonl").read_text().split("\n")
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in lines[:-1]]


def request_snapshot(run: Run, run_dir: Path, hold: Path | None = None, committed=None) -> str:
    """SIGUSR1 to the supervisor; returns the id of the snapshot once committed. ``hold``: a
    file locked here from the snapshot's fork to its commit, which programs/notorch/pace.py
    waits for after each step (on a loaded machine the commit came after the program's last
    step, and there was nothing left to kill). Not before the fork: the snapshot waits for the
    program's next safe point. ``committed``: what counts as committed, the ids it sees (default:
    new ones in ``run_dir``; a run directory on an object store: those the store lists)."""
    before = committed_ids(run_dir)
    committed = committed or (lambda: committed_ids(run_dir) - before)
    forked = sum(e.get("event") == "forked" for e in run_log(run_dir))
    run.signal(signal.SIGUSR1)
    if hold is None:
        return max(wait_for(committed, "a committed snapshot", proc=run))
    wait_for(lambda: sum(e.get("event") == "forked" for e in run_log(run_dir)) > forked or committed_ids(run_dir) - before,
             "the snapshot's fork", proc=run)
    locked = hold.with_name(hold.name + ".locked")
    with open(locked, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        os.replace(locked, hold)  # a program that finds it finds it locked
        try:
            return max(wait_for(committed, "a committed snapshot", proc=run))
        finally:
            hold.unlink(missing_ok=True)


def listed(run_dir: Path, cwd: Path, snap_id: str, python: str = sys.executable) -> dict:
    """The snapshot as `gpusnap ls` shows it."""
    return next(s for s in snapshots(run_dir, cwd, python) if s["id"] == snap_id)


def snapshot_now(run: Run, run_dir: Path, cwd: Path) -> dict:
    """SIGUSR1 to the supervisor; returns the snapshot once committed."""
    return listed(run_dir, cwd, request_snapshot(run, run_dir), run.python)


LAST_STEPS = 8  # the steps before a program's end that ``interrupt`` leaves it, at least


def interrupt(run: Run, out: Path, run_dir: Path, cwd: Path, rnd: random.Random, total: int, floor: int = 0,
              by: int | None = None) -> dict:
    """Snapshot at a random step (asked for by step ``by``, where given), then kill -9 the whole
    group a few steps later."""
    snap_at = rnd.randint(floor + 3, min(floor + (total - floor) // 2, by or total))
    wait_for(lambda: progress(out) >= snap_at, f"step {snap_at}", proc=run)
    snap_id = request_snapshot(run, run_dir, hold=out / "hold")
    seen_at = progress(out)
    # Killed no later than LAST_STEPS before the end: a few paced steps are a few tenths of a
    # second, which a loaded machine can keep this process waiting.
    kill_at = min(seen_at + rnd.randint(1, 6), total - LAST_STEPS)
    wait_for(lambda: progress(out) >= kill_at, f"step {kill_at}", proc=run)
    # Its witness is written after the iterations that follow it: wait for it a little, so that
    # the restart can prove itself (tests/e2e/test_e2e_witness.py kills before it, too).
    witness = run_dir / "witness" / f"{snap_id}.json"
    deadline = time.monotonic() + 10
    while (not witness.exists() and time.monotonic() < deadline and run.proc.poll() is None
           and progress(out) < total - LAST_STEPS):
        time.sleep(0.02)
    run.kill_group()
    assert not list(out.glob("final.*")), f"the program finished before it was killed (snapshot seen at step {seen_at})"
    return listed(run_dir, cwd, snap_id, run.python)


def load_final(out: Path) -> dict:
    return torch.load(out / "final.pt", weights_only=False)


def assert_same(a, b, where: str = "final") -> None:
    """Equal bytes, recursively: tensors by torch.equal on the same dtype, the rest by ==."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape, where
        if a.layout == torch.sparse_coo:  # torch.equal has no sparse kernel: the same entries, in the same order
            assert b.layout == a.layout and a.is_coalesced() == b.is_coalesced(), f"{where}: layout differs"
            assert_same(a._indices(), b._indices(), f"{where}.indices")
            assert_same(a._values(), b._values(), f"{where}.values")
            return
        assert torch.equal(a, b), f"{where}: tensor bytes differ"
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), f"{where}: keys differ"
        for key in a:
            assert_same(a[key], b[key], f"{where}[{key!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), f"{where}: lengths {len(a)} != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def kill_and_restart(
    script: Path, args, tmp_path: Path, out: Path, rnd: random.Random, total: int, env: dict, slow_env: dict, floors=(0,),
    counted_before: int = 0,
):
    """`gpusnap run` the program (paced by ``slow_env``), snapshot at a random step after
    ``floors[0]`` and kill -9 it (``interrupt``); for each further floor, `gpusnap restart` it and
    do that again after that step; then `gpusnap restart` it to the end. Asserts that the restart
    restored the last snapshot, and returns its CompletedProcess. ``counted_before``: optimizer
    steps the program takes before its first reported one (a learning-rate range test on a copy),
    which a snapshot's iteration counts too."""
    command = ("run", "--dir", "snaps", script, out, *args)
    for floor in floors:
        run = Run(*command, cwd=tmp_path, env=slow_env)
        snap = interrupt(run, out, tmp_path / "snaps", tmp_path, rnd, total, max(floor, progress(out)))
        print(f"snapshot {snap['id']} at iteration {snap['iteration']}, killed at step {progress(out)}")
        # "iteration" counts loop iterations, not optimizer steps (a GAN steps two per iteration)
        assert 0 < snap["iteration"] <= progress(out) + counted_before
        command = ("restart", "snaps")
    restarted = gpusnap("restart", "snaps", cwd=tmp_path, env=env)
    print(*[line for line in restarted.stderr.splitlines() if line.startswith("gpusnap:")], sep="\n")
    assert restarted.returncode == 0, restarted.stderr
    assert f"restored snapshot {snap['id']}" in restarted.stderr
    # Killed a few steps after the commit: its witness may not have been written by then.
    verified = f"snapshot {snap['id']} verified" in restarted.stderr
    assert verified or "unverified: it has no witness" in restarted.stderr, restarted.stderr
    print(f"restart {'verified' if verified else 'unverified'}")
    return restarted


def snapshotted_twice_and_killed(script: Path, steps: int, tmp: Path, env: dict, paced: dict, first_at: int, run_args=()):
    """An uninterrupted reference run of ``script`` (to ``tmp/ref``), and a run paced by ``paced``
    (to ``tmp/out``, run directory ``tmp/snaps``, gpusnap options ``run_args``) snapshotted at
    step ``first_at`` and 5 steps later, then killed -9 3 steps after that. Returns (ref, out,
    first id, second id)."""
    ref, out = ref_and_out(tmp)
    done = gpusnap("run", "--dir", "refsnaps", *run_args, script, ref, steps, cwd=tmp, env=env)
    assert done.returncode == 0, done.stderr
    run = Run("run", "--dir", "snaps", *run_args, script, out, steps, cwd=tmp, env={**env, **paced})
    wait_for(lambda: progress(out) >= first_at, f"step {first_at}", proc=run)
    first = request_snapshot(run, tmp / "snaps")
    at = progress(out)
    wait_for(lambda: progress(out) >= at + 5, f"step {at + 5}", proc=run)
    second = request_snapshot(run, tmp / "snaps")
    at = progress(out)
    wait_for(lambda: progress(out) >= at + 3, f"step {at + 3}", proc=run)
    run.kill_group()
    assert not (out / "final.json").exists(), "the program finished before it was killed"
    return ref, out, first, second


def as_host(name: str, hosts_dir: Path | None = None) -> list[str] | None:
    """A command prefix that runs what follows on a machine named ``name`` (a UTS namespace of
    its own: as root, or in a user namespace), or None where neither can be made. With
    ``hosts_dir``, the name also resolves there, as a machine's own name does (torchrun's
    rendezvous hands it to the ranks): an /etc/hosts written into ``hosts_dir`` is mounted over
    the machine's, in a mount namespace of its own."""
    if shutil.which("unshare") is None:
        return None
    script = f'hostname {name} && exec "$@"'
    extra = []
    if hosts_dir is not None:
        hosts = Path(hosts_dir) / f"hosts-{name}"
        hosts.write_text(f"127.0.0.1 localhost\n127.0.0.1 {name}\n")
        script = f"hostname {name} && mount --bind {hosts} /etc/hosts && exec \"$@\""
        extra = ["--mount"]
    for prefix in (["unshare", "--uts", *extra], ["unshare", "--user", "--map-root-user", "--uts", *extra]):
        command = [*prefix, "sh", "-c", script, "sh"]
        probe = subprocess.run([*command, "hostname"], capture_output=True, text=True)
        if probe.returncode == 0 and probe.stdout.strip() == name:
            return command
    return None
