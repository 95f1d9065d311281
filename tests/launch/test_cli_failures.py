"""Failure paths of the run directory as a user meets them: the real CLI in real subprocesses,
real files, and where the OS can be made to fail for real (a read-only mount), the real failure.

Where it cannot (ENOLCK needs an NFS mount without a lock daemon), the CLI runs under WRAPPER,
which swaps one of the store's module-level OS calls before starting the real command."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import xxhash

from gpusnap.errors import FormatVersionError
from gpusnap.store import RunDir, index
from gpusnap.store.pack import PACK_HEADER, PACK_MAGIC, pack_path
from store_helpers import make_run, only_in

REPO = Path(__file__).resolve().parents[2]
# This checkout's gpusnap in every subprocess (an editable install may be another checkout's).
ENV = {**os.environ, "GPUSNAP_SUPERVISOR_TICK_S": "0.05",
       "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}

# argv: FAULT CLI-ARGS...; FAULT names what the swapped call does before (or instead of) the real one.
WRAPPER = textwrap.dedent("""
    import errno, os, shutil, sys
    import gpusnap.store.lock as lock

    fault = sys.argv.pop(1)
    real_open = lock._open

    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    def vanishing_open(path, *args):
        shutil.rmtree(os.path.dirname(path))  # the directory goes between the checks and the lock
        return real_open(path, *args)

    if fault == "enolck":
        lock._flock = no_locks
    elif fault == "vanish":
        lock._open = vanishing_open
    from gpusnap.cli import main
    main()
""")


def gpusnap(*args, cwd, fault=None):
    argv = [sys.executable, "-m", "gpusnap"] if fault is None else [sys.executable, str(cwd / "wrap.py"), fault]
    return subprocess.run([*argv, *map(str, args)], cwd=cwd, env=ENV, capture_output=True, text=True, timeout=60)


@pytest.fixture
def work(tmp_path):
    (tmp_path / "wrap.py").write_text(WRAPPER)
    (tmp_path / "ok.py").write_text("print('ran')\n")
    return tmp_path


def _can_mount_in_a_user_namespace() -> bool:
    if not shutil.which("unshare"):
        return False
    return subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode == 0


# -- the run directory's lock ---------------------------------------------------------------


@pytest.mark.skipif(not _can_mount_in_a_user_namespace(), reason="needs unshare -rm (user and mount namespaces)")
def test_gc_on_a_read_only_mount_is_one_line_and_exit_3(work):
    rd, snaps = make_run(work)
    # A read-only bind mount of the run directory, in a mount namespace of this command alone.
    script = (f"mount --bind {rd.path} {rd.path} && mount -o remount,bind,ro {rd.path} && "
              f"exec {sys.executable} -m gpusnap gc {rd.path} --keep 1")
    r = subprocess.run(["unshare", "-rm", "sh", "-c", script], cwd=work, env=ENV, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 3, r.stderr
    assert r.stderr.splitlines() == [
        f"gpusnap: cannot lock {rd.path}: Read-only file system",
        "hint: a run directory must be writable: make it so, or use one on a writable file system",
    ]
    assert sorted(p.name for p in (rd.path / "snapshots").iterdir()) == [f"{sid}.json" for sid, _, _ in snaps]


def test_a_file_system_without_locks_is_one_line_and_exit_3(work):
    r = gpusnap("run", "--dir", "d", "ok.py", cwd=work, fault="enolck")
    assert r.returncode == 3, r.stderr
    assert r.stderr.splitlines() == [
        f"gpusnap: cannot lock {work / 'd'}: its file system does not support file locks (No locks available)",
        "hint: put the run directory on a local disk, or on a mount with locking enabled (NFS: not 'nolock')",
    ]
    assert r.stdout == ""  # the program never started
    rd, _ = make_run(work / "g")
    r = gpusnap("gc", rd.path, cwd=work, fault="enolck")
    assert r.returncode == 3 and r.stderr.startswith(f"gpusnap: cannot lock {rd.path}: its file system"), r.stderr


def test_a_directory_that_vanishes_before_the_lock_is_one_line_and_exit_3(work):
    rd, _ = make_run(work)
    r = gpusnap("gc", rd.path, cwd=work, fault="vanish")
    assert r.returncode == 3, r.stderr
    assert r.stderr.splitlines() == [
        f"gpusnap: cannot lock {rd.path}: the directory is gone (No such file or directory)",
        "hint: it was removed or unmounted meanwhile; check the path and run the command again",
    ]


# -- pack versions ----------------------------------------------------------------------------


def _set_version(path, version: int) -> None:
    with open(path, "r+b") as f:
        f.write(PACK_HEADER.pack(PACK_MAGIC, version, 0))


def test_a_pack_of_an_unknown_version_is_refused_on_read(work):
    rd, snaps = make_run(work)
    sid, recs, _ = snaps[-1]
    newer = pack_path(rd.path, index.load(rd.path).chunks[recs["b"]["chunks"][0][0]].pack)
    _set_version(newer, 2)
    expected = [
        f"gpusnap: pack {newer.stem} has pack version 2; this gpusnap knows pack version 1",
        "hint: use the gpusnap version that wrote this directory",
    ]
    for command in (["verify", rd.path], ["verify", rd.path, sid]):
        r = gpusnap(*command, cwd=work)
        assert r.returncode == 3, (command, r.stdout, r.stderr)
        assert r.stderr.splitlines() == expected, command
    with pytest.raises(FormatVersionError, match=f"^pack {newer.stem} has pack version 2;"):
        RunDir.open(rd.path).read_buffer(recs["b"], snapshot=sid)  # what restore reads through
    assert RunDir.open(rd.path).read_buffer(snaps[0][1]["b"]) == snaps[0][2]["b"]  # the others read


def test_gc_keeps_a_pack_it_cannot_read_and_says_so(work):
    rd, snaps = make_run(work)
    # A pack a newer gpusnap wrote and no index here names (its index is of a newer format, or
    # its writer died): named by its hash, as every pack is.
    body = PACK_HEADER.pack(PACK_MAGIC, 2, 0) + b"entries of a format to come" * 100
    newer = pack_path(rd.path, xxhash.xxh3_128_hexdigest(body))
    newer.parent.mkdir(exist_ok=True)
    newer.write_bytes(body)
    # And one of this store's packs that retention frees, rewritten by a newer version.
    freed = only_in(rd, snaps[0][1], "b")
    _set_version(freed, 2)

    r = gpusnap("gc", rd.path, "--keep", "1", cwd=work)
    assert r.returncode == 0, r.stderr
    kept = sorted([newer, freed])
    assert r.stdout.splitlines()[1:] == [
        f"kept {p.relative_to(rd.path)}: pack version 2, which this gpusnap cannot read "
        "(a newer gpusnap wrote it; gc with that version removes it when nothing needs it)"
        for p in kept
    ]
    assert all(p.exists() for p in kept)
    assert newer.read_bytes() == body
    r = gpusnap("gc", rd.path, cwd=work)  # and again: gc never learns to remove them
    assert r.returncode == 0 and all(p.exists() for p in kept), r.stdout + r.stderr
    assert gpusnap("verify", rd.path, snaps[-1][0], cwd=work).returncode == 0


# -- a URL where a directory is expected ---------------------------------------------------------


URL_COMMANDS = [
    ("run", "--dir", "{url}", "ok.py"),
    ("restart", "{url}"),
    ("snap", "{url}"),
    ("ls", "{url}"),
    ("inspect", "{url}"),
    ("verify", "{url}"),
    ("verify", "--replay", "{url}"),
    ("gc", "{url}"),
    ("export", "{url}", "--out", "w.safetensors"),
    ("demo", "--dir", "{url}"),
]


@pytest.mark.parametrize("command", URL_COMMANDS, ids=lambda c: " ".join(c[:2]).replace("{url}", "URL"))
def test_a_url_of_a_store_gpusnap_cannot_write_is_refused_with_exit_2(work, command):
    # Once `--dir s3://b/p` silently wrote ./s3:/b/p, which vanished with the machine.
    url = "hdfs://namenode/runs/r1"
    r = gpusnap(*(a.format(url=url) for a in command), cwd=work)
    assert r.returncode == 2, r.stderr
    assert r.stderr.splitlines() == [
        f"gpusnap: {url} is a URL, and run directories on hdfs:// are not supported",
        "hint: pass a local directory, or one on a shared filesystem (NFS, Lustre) that the next machine "
        "mounts at the same place, or s3://BUCKET/PREFIX (also gs://, az://)",
    ]
    assert r.stdout == ""
    assert sorted(p.name for p in work.iterdir()) == ["ok.py", "wrap.py"]  # no ./hdfs: directory
