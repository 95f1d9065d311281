"""A disk that fills recovers: a run with --keep on a small file system whose snapshots stop
fitting beside the ones --keep keeps starts committing again by itself (retention runs before
the write once a snapshot failed for lack of space), and `gpusnap gc` on a file system that is
100% full frees bytes (it removes what no snapshot needs before it writes anything).

Each case runs twice: on a real tmpfs the test mounts (skipped, with the reason, where mounting
is not allowed: CI may lack the permission), and on a disk made small through the store's
injection points (tools/chaos/inject/sitecustomize.py's DISK fault), which runs everywhere."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess

import pytest

from harness import REPO, Run, copy_programs, gpusnap, progress, wait_for

pytestmark = pytest.mark.slow  # end-to-end runs: the full suite, not the quick loop

STATE_KB = 2048  # each snapshot writes ~2 MB anew (random doubles barely compress)
CAPACITY = 5 << 20  # room for two snapshots, not for a third beside them


@pytest.fixture(params=["tmpfs", "injected"])
def small_disk(request, tmp_path):
    """(directory on a disk of CAPACITY bytes, the environment its runs need, fill(): make the
    disk 100% full, used(): the bytes in use)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if request.param == "tmpfs":
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={CAPACITY},mode=0700", "tmpfs", str(disk)],
                                 capture_output=True, text=True)
        if mounted.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.strip() or mounted.returncode}); the injected "
                        "variant of this test covers the same logic")
        request.addfinalizer(lambda: subprocess.run(["umount", "-l", str(disk)], check=False))

        def fill():
            fd = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            try:
                for block in (1 << 16, 4096, 1):
                    try:
                        while True:
                            os.write(fd, b"\1" * block)
                    except OSError as exc:
                        assert exc.errno == errno.ENOSPC
            finally:
                os.close(fd)
            assert os.statvfs(disk).f_bavail == 0
            return {}

        def used():
            st = os.statvfs(disk)
            return (st.f_blocks - st.f_bfree) * st.f_frsize

        return disk, {}, fill, used
    # The chaos tool's injector: the run directory disk/snaps is a disk of the size the file says.
    fault = disk / "fault"
    fault.write_text(f"DISK {CAPACITY}")
    inject = {"PYTHONPATH": os.pathsep.join([str(REPO / "tools" / "chaos" / "inject"), str(REPO)]),
              "GPUSNAP_CHAOS_FAULT": str(fault)}

    def used():
        return sum(p.stat().st_size for p in (disk / "snaps").rglob("*") if p.is_file())

    def fill():
        fault.write_text(f"DISK {used()}")
        return {}

    return disk, inject, fill, used


def test_a_run_with_keep_recovers_from_a_full_disk_and_gc_frees_a_full_one(tmp_path, small_disk):
    disk, env, fill, used = small_disk
    program = copy_programs(tmp_path) / "notorch" / "churn.py"
    out = tmp_path / "out"
    out.mkdir()
    job = Run("run", "--dir", disk / "snaps", "--keep", "2", program, out, 100_000, STATE_KB, cwd=tmp_path,
              env={**env, "TEST_STEP_SLEEP_S": "0.02", "GPUSNAP_CODEC": "lz4"})
    outcomes = []
    try:
        wait_for(lambda: progress(out) >= 2, "step 2", proc=job)
        for _ in range(6):
            asked = gpusnap("snap", disk / "snaps", cwd=tmp_path, env=env)
            outcomes.append((asked.returncode, asked.stderr))
            assert len(list((disk / "snaps" / "snapshots").glob("*.json"))) <= 2
    finally:
        job.kill_group()
    codes = [code for code, _ in outcomes]
    # The third does not fit beside the two --keep keeps; from then on each snapshot first
    # removes the oldest, and commits.
    assert codes == [0, 0, 5, 0, 0, 0], outcomes
    assert "snapshot 000003 failed: NoSpace: no space left on device while writing" in outcomes[2][1], outcomes
    assert "(the disk was full: removed snapshot 000001 first)" in outcomes[3][1]
    assert gpusnap("verify", disk / "snaps", cwd=tmp_path, env=env).returncode == 0

    # 100% full: gc removes what no kept snapshot needs before it writes a byte.
    full_env = fill()
    before = used()
    gc = gpusnap("gc", disk / "snaps", "--keep", "1", "--json", cwd=tmp_path, env={**env, **full_env})
    assert gc.returncode == 0, gc.stderr
    report = json.loads(gc.stdout)
    assert report["removed_snapshots"] and report["removed_bytes"] > 1 << 20, report
    assert used() < before - (1 << 20)
    (disk / "filler").unlink(missing_ok=True)
    verified = gpusnap("verify", disk / "snaps", cwd=tmp_path, env=env)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert shutil.disk_usage(disk).free > 0
