"""Crash safety: kill -9 of a writer at random moments, crashes at every step of gc, and the
lock between two runs. Every seed is printed so a failure can be replayed."""

from __future__ import annotations

import errno
import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from gpusnap.errors import RunDirLocked
from gpusnap import atomic
from gpusnap.store import RunDir, preload
from gpusnap.store.check import leftovers
from store_helpers import IDENTITY, SMALL, make_run, payload

KILLS = 24


def _writer_child(path, seed: int) -> None:
    """Forked writer: takes snapshots until killed. Buffer 'b' of snapshot N is payload(N)."""
    try:
        rd = RunDir.open(path)
        a = payload(0, 300_000)
        while True:
            sid = rd.next_snapshot_id()
            w = rd.begin_snapshot(sid, **SMALL)
            recs = {"a": w.put_buffer(a, dtype="float32", typesize=4),
                    "b": w.put_buffer(payload(int(sid), 400_000), dtype="bfloat16", typesize=2)}
            w.commit({"buffers": recs, "iteration": int(sid)})
    finally:
        os._exit(0)


def test_kill_9_writer_at_random_moments(tmp_path):
    seed = int(os.environ.get("GPUSNAP_TEST_SEED", time.time_ns() % 1_000_000))
    print(f"kill -9 test seed={seed} (GPUSNAP_TEST_SEED={seed} replays it)")
    rng = random.Random(seed)
    preload()
    rd = RunDir.create(tmp_path / "run", IDENTITY)
    a = payload(0, 300_000)
    for k in range(KILLS):
        delay = rng.uniform(0.0, 0.3)
        pid = os.fork()
        if pid == 0:
            _writer_child(rd.path, seed)
        time.sleep(delay)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        ids = [s.id for s in rd.snapshots()]
        findings = rd.verify()
        assert findings == [], f"seed={seed} kill {k} after {delay:.3f}s: {findings}"
        info, skipped = rd.newest_intact()
        assert skipped == [] and (info.id if info else None) == (ids[-1] if ids else None), f"seed={seed} kill {k}"
    ids = [s.id for s in rd.snapshots()]
    print(f"seed={seed}: {len(ids)} snapshots committed, leftovers {len(leftovers(rd))}")
    assert ids, f"seed={seed}: no writer ever committed"
    for sid in ids:
        m = rd.manifest(sid)
        assert rd.read_buffer(m["buffers"]["a"]) == a
        assert rd.read_buffer(m["buffers"]["b"]) == payload(int(sid), 400_000), f"seed={seed} snapshot {sid}"
    rd.prune(None)
    assert rd.verify() == [] and leftovers(rd) == []
    assert [s.id for s in rd.snapshots()] == ids


def test_gc_crash_at_every_step(tmp_path, monkeypatch):
    """Make the k-th file operation of gc fail, for every k; the snapshots gc keeps must verify
    after each crash, and a later gc must finish the job."""
    real = {name: getattr(atomic, name) for name in ("_unlink", "_write", "_rename")}
    k = 0
    while True:
        rd, snaps = make_run(tmp_path / f"k{k}", n=4)
        calls = [0]

        def failing(name):
            def f(*args):
                calls[0] += 1
                if calls[0] == k + 1:
                    raise OSError(errno.EIO, f"injected crash at step {k}")
                return real[name](*args)

            return f

        for name in real:
            monkeypatch.setattr(atomic, name, failing(name))
        try:
            rd.prune(2)
            crashed = False
        except Exception as exc:
            assert "injected crash" in str(exc)
            crashed = True
        for name, f in real.items():
            monkeypatch.setattr(atomic, name, f)
        kept = [s.id for s in rd.snapshots()]
        assert kept[-2:] == ["000003", "000004"], f"step {k}"
        assert rd.verify() == [], f"crash at gc step {k}"
        rd.prune(2)
        assert [s.id for s in rd.snapshots()] == ["000003", "000004"]
        assert rd.verify() == [] and leftovers(rd) == []
        for sid, recs, bufs in snaps[2:]:
            assert rd.read_buffer(recs["b"]) == bufs["b"]
        if not crashed:
            break
        k += 1
    assert k >= 5  # gc really has that many steps to crash in


def test_gc_removes_what_retention_frees(tmp_path):
    rd, snaps = make_run(tmp_path, n=4)
    packs_before = len(list((rd.path / "packs").rglob("*.pack")))
    report = rd.prune(1)
    assert report["removed_snapshots"] == ["000001", "000002", "000003"]
    assert report["removed_packs"] == packs_before - report["kept_packs"] > 0
    assert len(list((rd.path / "index").glob("*.json"))) == 1
    sid, recs, bufs = snaps[-1]
    assert rd.read_buffer(recs["a"]) == bufs["a"] and rd.read_buffer(recs["b"]) == bufs["b"]


HOLDER = textwrap.dedent(
    """
    import sys, time
    from gpusnap.store import RunDir
    rd = RunDir.open(sys.argv[1])
    lock = rd.lock("run")
    print("locked", flush=True)
    time.sleep(60)
    """
)


FORKING_HOLDER = textwrap.dedent(
    """
    import os, sys, time
    from gpusnap.store import RunDir
    lock = RunDir.open(sys.argv[1]).lock("run")
    if os.fork() == 0:  # a DataLoader worker of the holder: it outlives a kill -9 of the holder for a while
        print("forked", flush=True)  # (fork's handlers in the child have run by now)
        time.sleep(60)
        os._exit(0)
    time.sleep(60)
    """
)


def test_a_process_the_holder_forked_does_not_keep_its_lock_once_the_holder_is_killed(tmp_path):
    """A rank with DataLoader workers, killed -9: its orphaned workers held the rank's lock, a
    flock shared through fork, until they noticed their parent was gone, and a restart meanwhile
    was refused ("is used by pid ...", the dead rank's). A forked child closes its copy."""
    import psutil

    rd = RunDir.create(tmp_path / "run", IDENTITY)
    holder = subprocess.Popen([sys.executable, "-c", FORKING_HOLDER, str(rd.path)], stdout=subprocess.PIPE, text=True)
    children = []
    try:
        assert holder.stdout.readline().strip() == "forked"
        children = psutil.Process(holder.pid).children()
        holder.kill()
        holder.wait()
        assert [child.is_running() for child in children] == [True]
        with rd.lock("run") as lock:
            assert lock.took_over["pid"] == holder.pid
    finally:
        holder.kill()
        for child in children:
            child.kill()


def test_two_runs_on_one_directory(tmp_path):
    rd = RunDir.create(tmp_path / "run", IDENTITY)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(rd.path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(RunDirLocked) as info:
            rd.lock("run")
        host = os.uname().nodename
        assert info.value.message.startswith(f"{rd.path} is used by pid {holder.pid} on host {host} since ")
        assert info.value.message.endswith(" (run)")
        assert info.value.exit_code == 3
    finally:
        holder.kill()
        holder.wait()
    # the holder died with kill -9: its lock is stale and is taken over
    with rd.lock("gc") as lock:
        assert lock.took_over["pid"] == holder.pid
        with pytest.raises(RunDirLocked, match=f"is used by pid {os.getpid()} on host"):
            rd.lock("run")
    with rd.lock("run") as lock:
        assert lock.took_over is None
