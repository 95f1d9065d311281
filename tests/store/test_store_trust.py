"""The run directory as a trust boundary, and two writers on one directory.

A snapshot is code (restart unpickles it, imports the modules it names, runs the command that
run.json records): gpusnap refuses to restore from, or lock, a directory that another user owns
or that others can write to, never follows a symbolic link in one, and keeps the code cache to
the same rule. Two processes that both believe they hold a directory can never replace each
other's committed manifest, and a writer whose lock was taken over commits nothing."""

from __future__ import annotations

import json
import os
import signal
import socket
import time

import pytest
from click.testing import CliRunner

from gpusnap import knobs
from gpusnap.cli import _register, cli
from gpusnap.errors import RunDirLocked, RunDirPermission, StoreError
from gpusnap.instrument import cache
from gpusnap import atomic
from gpusnap.store import RunDir
from harness import Run, committed_ids, copy_programs, progress, request_snapshot, wait_for
from store_helpers import IDENTITY, SMALL, make_run, payload

_register()
OTHER_UID = 4242


def run(*args):
    return CliRunner().invoke(cli, list(map(str, args)))


def _as_root():
    if os.geteuid() != 0:
        pytest.skip("needs root to give a file to another user (chown)")


def test_a_symlinked_lock_makes_gc_refuse_and_leaves_its_target_untouched(tmp_path):
    rd, _ = make_run(tmp_path)
    target = tmp_path / "precious"
    target.write_bytes(b"the user's own file\n")
    (rd.path / "lock").symlink_to(target)
    r = run("gc", rd.path, "--keep", "1")
    assert r.exit_code == 3, r.output
    assert r.stderr == (f"gpusnap: {rd.path / 'lock'} is a symbolic link; a run directory is trusted data (restoring it "
                        f"runs code)\nhint: remove it (rm {rd.path / 'lock'}); gpusnap never follows one in a run directory\n")
    assert target.read_bytes() == b"the user's own file\n" and (rd.path / "lock").is_symlink()
    assert rd.snapshot_ids() == ["000001", "000002", "000003"]
    # The lock itself never follows one either, whoever asks for it.
    with pytest.raises(RunDirPermission, match="is a symbolic link: gpusnap never follows one"):
        from gpusnap.store.lock import RunLock

        RunLock(rd.path, "gc").acquire()
    assert target.read_bytes() == b"the user's own file\n"


def test_what_a_restart_moved_aside_is_the_programs_and_trusted_as_it_is(tmp_path, monkeypatch):
    """A program that keeps a `latest` symbolic link to its newest checkpoint, killed after the
    snapshot: the restart moved the link aside into DIR/after-ID/, and the next restart was
    refused ("... is a symbolic link"), as was every restart after a program with a umask of
    002 (a group-writable file moved aside). gpusnap never reads there: the entry is checked,
    not what it holds."""
    monkeypatch.setattr(knobs, "TRUST_DIR", 0)
    monkeypatch.setenv("GPUSNAP_TRUST_DIR", "0")
    rd, _ = make_run(tmp_path)
    aside = rd.path / "after-000001" / "out" / "ckpt"
    aside.mkdir(parents=True)
    (aside / "step_8.pt").write_bytes(b"x")
    (aside / "latest").symlink_to("step_8.pt")
    (aside / "metrics.csv").write_text("step,loss\n")
    os.chmod(aside / "metrics.csv", 0o664)
    RunDir.open(rd.path, trusted=True)
    r = run("gc", rd.path, "--keep", "3")
    assert r.exit_code == 0, r.output
    # The entry itself is still checked: one that is a link, or writable by others, is refused.
    os.chmod(rd.path / "after-000001", 0o777)
    with pytest.raises(RunDirPermission, match="after-000001 can be written by others"):
        RunDir.open(rd.path, trusted=True)
    (rd.path / "after-000002").symlink_to(tmp_path)
    os.chmod(rd.path / "after-000001", 0o755)
    with pytest.raises(RunDirPermission, match="after-000002 is a symbolic link"):
        RunDir.open(rd.path, trusted=True)


def test_a_hard_linked_lock_is_refused(tmp_path):
    rd, _ = make_run(tmp_path)
    target = tmp_path / "precious"
    target.write_bytes(b"x")
    os.link(target, rd.path / "lock")
    with pytest.raises(RunDirPermission, match="lock is not a plain file of its own"):
        rd.lock("gc")
    assert target.read_bytes() == b"x"


@pytest.mark.parametrize("where", ["", "snapshots", "packs", "snapshots/000003.json"])
def test_a_group_writable_run_directory_is_refused_with_the_hint(tmp_path, monkeypatch, where):
    # --trust-dir sets both in this process; the test's end puts them back
    monkeypatch.setattr(knobs, "TRUST_DIR", 0)
    monkeypatch.setenv("GPUSNAP_TRUST_DIR", "0")
    rd, _ = make_run(tmp_path)
    (rd.path / "supervisor.json").write_text("{}")
    path = rd.path / where
    os.chmod(path, os.stat(path).st_mode | 0o020)
    with pytest.raises(RunDirPermission) as info:
        RunDir.open(rd.path, trusted=True)
    assert info.value.message.startswith(f"{path} can be written by its group (mode ")
    assert "--trust-dir" in info.value.hint
    for command in (("restart", rd.path), ("gc", rd.path)):
        r = run(*command)
        assert r.exit_code == 3 and r.stderr == f"gpusnap: {info.value.message}\nhint: {info.value.hint}\n", r.output
    # The flag names the override; with it, gc runs (restart goes on to the run's command)
    r = run("gc", rd.path, "--trust-dir")
    assert r.exit_code == 0, r.output
    r = run("restart", rd.path, "--trust-dir")
    assert r.exit_code == 2 and "the run's working directory /w does not exist" in r.stderr


def test_another_users_file_in_a_run_directory_is_refused(tmp_path, monkeypatch):
    _as_root()
    rd, _ = make_run(tmp_path)
    (pack,) = list((rd.path / "packs").rglob("*.pack"))[:1]
    os.chown(pack, OTHER_UID, -1)
    with pytest.raises(RunDirPermission, match=f"{pack} is owned by uid {OTHER_UID}, not by you"):
        RunDir.open(rd.path, trusted=True)
    with pytest.raises(RunDirPermission):
        rd.lock("run")
    monkeypatch.setattr(knobs, "TRUST_DIR", 1)
    with rd.lock("run"):
        pass


def test_the_run_log_is_never_followed_through_a_symbolic_link(tmp_path):
    """`gpusnap run` on a directory whose log.jsonl is a symbolic link refuses (one line) and
    writes nothing into the file it names."""
    program = copy_programs(tmp_path) / "notorch" / "counters.py"
    (tmp_path / "out").mkdir()
    from harness import gpusnap

    first = gpusnap("run", "--dir", "snaps", program, tmp_path / "out", 3, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    target = tmp_path / "precious"
    target.write_bytes(b"keep me\n")
    (tmp_path / "snaps" / "log.jsonl").unlink()
    (tmp_path / "snaps" / "log.jsonl").symlink_to(target)
    again = gpusnap("run", "--dir", "snaps", program, tmp_path / "out", 3, cwd=tmp_path)
    assert again.returncode == 3, again.stderr
    assert again.stderr.startswith(f"gpusnap: {tmp_path / 'snaps' / 'log.jsonl'} is a symbolic link")
    assert target.read_bytes() == b"keep me\n"


def test_the_code_cache_is_used_only_where_nobody_else_can_write(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(knobs, "CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(cache, "_refused", set())
    code = compile("x = 1", "m.py", "exec")
    key = cache.key("/m.py", "digest", 1)
    cache.store(key, code)
    assert cache.load(key) == code
    entry = tmp_path / "cache" / "code" / key[:2] / key
    assert os.stat(tmp_path / "cache" / "code").st_mode & 0o022 == 0
    os.chmod(entry, 0o664)  # a group member could have put compiled code of their own here
    assert cache.load(key) is None
    os.chmod(entry, 0o600)
    os.chmod(tmp_path / "cache" / "code", 0o770)
    assert cache.load(key) is None
    cache.store(key, compile("x = 2", "m.py", "exec"))  # and nothing is written there either
    os.chmod(tmp_path / "cache" / "code", 0o700)
    assert cache.load(key) == code
    assert capsys.readouterr().err == f"gpusnap: not using the code cache {tmp_path / 'cache' / 'code'}: it can be written by its group (mode 0770)\n"


# -- two writers -----------------------------------------------------------------------------


@pytest.mark.parametrize("renameat2", [True, False], ids=["renameat2", "link"])
def test_a_committed_manifest_is_never_replaced_by_a_second_writer(tmp_path, monkeypatch, renameat2):
    """Two writers of one id: the second passes every check before the first commits, then
    renames its manifest in after it. The first's stays; the second's commit fails."""
    if not renameat2:
        monkeypatch.setattr(atomic, "_renameat2", None)  # a file system without RENAME_NOREPLACE
    rd = RunDir.create(tmp_path / "run", IDENTITY)
    first, second = (rd.begin_snapshot("000001", **SMALL) for _ in range(2))
    first_rec = first.put_buffer(payload(1, 100_000), dtype="float32", typesize=4)
    second_rec = second.put_buffer(payload(2, 100_000), dtype="float32", typesize=4)
    real_fsync = atomic._fsync
    state = {"armed": True}

    def fsync_then_let_the_first_commit(fd):
        real_fsync(fd)
        name = os.readlink(f"/proc/self/fd/{fd}")
        if state["armed"] and "/snapshots/000001.json.tmp-" in name:
            state["armed"] = False
            first.commit({"buffers": {"b": first_rec}, "who": "first"})

    monkeypatch.setattr(atomic, "_fsync", fsync_then_let_the_first_commit)
    with pytest.raises(StoreError, match="snapshot 000001 already exists; committed snapshots are never rewritten"):
        second.commit({"buffers": {"b": second_rec}, "who": "second"})
    assert not state["armed"]
    assert rd.load_manifest("000001")["who"] == "first"
    assert rd.read_buffer(first_rec) == payload(1, 100_000) and rd.verify() == []
    assert [p.name for p in (rd.path / "snapshots").iterdir()] == ["000001.json"]


def test_a_writer_whose_lock_was_taken_over_commits_nothing(tmp_path):
    rd, _ = make_run(tmp_path, n=1)
    with rd.lock("run") as lock:
        writer = rd.begin_snapshot("000002", lock_token=lock.token, **SMALL)
        rec = writer.put_buffer(payload(9, 300_000), dtype="float32", typesize=4)
        packs = set((rd.path / "packs").rglob("*.pack"))
        (rd.path / "lock").write_text(json.dumps({"host": "elsewhere", "pid": 7, "time": "T", "purpose": "run",
                                                  "token": "f" * 32}))
        with pytest.raises(RunDirLocked, match=r"was taken over by pid 7 on host elsewhere since T \(run\) while this run "
                                               "held it; this snapshot is not committed"):
            writer.commit({"buffers": {"b": rec}})
        assert rd.snapshot_ids() == ["000001"]
        assert packs <= set((rd.path / "packs").rglob("*.pack"))  # the other writer's packs may be these: left to gc
    assert rd.verify() == []


def test_a_lock_held_on_another_host_is_reported_until_it_goes_silent(tmp_path, monkeypatch):
    rd, _ = make_run(tmp_path, n=1)
    record = {"host": "node7", "pid": 4711, "time": "2026-11-26T10:00:00Z", "purpose": "run", "token": "a" * 32}
    (rd.path / "lock").write_text(json.dumps(record))  # no flock: flock does not reach across hosts here
    r = run("gc", rd.path)
    assert r.exit_code == 3
    assert r.stderr.startswith(f"gpusnap: {rd.path} is used by pid 4711 on host node7 since 2026-11-26T10:00:00Z (run): "
                               "its lock was refreshed ")
    assert (" s ago, and from this host gpusnap cannot see whether that process still runs\n"
            "hint: if it is gone, run this again once its lock has been silent for 60 s") in r.stderr
    assert json.loads((rd.path / "lock").read_text()) == record
    old = time.time() - 61
    os.utime(rd.path / "lock", (old, old))
    r = run("gc", rd.path)
    assert r.exit_code == 0
    assert r.stderr == (f"gpusnap: took over {rd.path}'s lock from pid 4711 on host node7 since 2026-11-26T10:00:00Z (run), "
                        "which had not refreshed it for 60 s\n")


def test_the_holder_refreshes_its_lock(tmp_path, monkeypatch):
    monkeypatch.setattr(knobs, "LOCK_REFRESH_S", 0.05)
    rd, _ = make_run(tmp_path, n=1)
    with rd.lock("run"):
        old = time.time() - 3600
        os.utime(rd.path / "lock", (old, old))
        wait_for(lambda: os.stat(rd.path / "lock").st_mtime > old + 3000, "the lock's refresh", timeout=30)
        record = json.loads((rd.path / "lock").read_text())
        assert record["host"] == socket.gethostname() and record["pid"] == os.getpid() and len(record["token"]) == 32


def test_a_run_whose_lock_is_taken_over_stops_committing(tmp_path):
    """The token reaches the forked writers: after another host's process overwrote the lock's
    record, the run's next snapshot fails with one line, and nothing is committed."""
    program = copy_programs(tmp_path) / "notorch" / "counters.py"
    (tmp_path / "out").mkdir()
    out = tmp_path / "out"
    job = Run("run", "--dir", "snaps", program, out, 400, cwd=tmp_path, env={"TEST_STEP_SLEEP_S": "0.02"})
    try:
        wait_for(lambda: progress(out) >= 3, "step 3", proc=job)
        first = request_snapshot(job, tmp_path / "snaps")
        (tmp_path / "snaps" / "lock").write_text(json.dumps({"host": "elsewhere", "pid": 9, "time": "T", "purpose": "run",
                                                             "token": "b" * 32}))
        job.signal(signal.SIGUSR1)
        wait_for(lambda: "taken over" in (tmp_path / "snaps" / "log.jsonl").read_text(), "the failed snapshot", proc=job)
        assert committed_ids(tmp_path / "snaps") == {first}
    finally:
        job.kill_group()
    _, err = job.proc.communicate()
    failed = [line for line in err.splitlines() if "failed" in line]
    assert failed == [f"gpusnap: snapshot {int(first) + 1:06d} failed: RunDirLocked: {tmp_path / 'snaps'} was taken over by "
                      "pid 9 on host elsewhere since T (run) while this run held it; this snapshot is not committed"], err
