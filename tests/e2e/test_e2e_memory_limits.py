"""Memory limits: a job's memory cgroup, not the host, decides whether a fork can be afforded, and
when memory runs out while a snapshot is written, the out-of-memory killer takes the writer, not
the program.

The end-to-end cases run the program in a real memory cgroup the test creates under its own
(cgroup v1's memory hierarchy or v2's), and are skipped, with the reason, where the machine does
not let it (CI may not). The headroom check is also tested everywhere against cgroup files laid
out as tests/stage/test_stage_arena.py lays them out, and the writer's oom_score_adj on a plain run."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import time
from pathlib import Path

import psutil
import pytest

from fake_cgroups import V2_MOUNT, fake_root
from gpusnap.capture.trainee import agent
from harness import Run, copy_programs, plain, progress, ref_and_out, wait_for

pytestmark = pytest.mark.slow  # end-to-end runs: the full suite, not the quick loop

MiB = 1 << 20
QUIET = {"GPUSNAP_DRAIN": "off", "GPUSNAP_HUGEPAGES": "off", "TEST_STEP_SLEEP_S": "0.02"}


def _own_groups() -> list[tuple[Path, str, str, str]]:
    """(directory of this process's memory cgroup, limit file, usage file, procs file)."""
    found = []
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return found
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            found.append((Path("/sys/fs/cgroup/memory") / path.lstrip("/"), "memory.limit_in_bytes",
                          "memory.usage_in_bytes", "cgroup.procs"))
        elif controllers == "":
            found.append((Path("/sys/fs/cgroup") / path.lstrip("/"), "memory.max", "memory.current", "cgroup.procs"))
    return found


@contextlib.contextmanager
def memory_cgroup():
    """A memory cgroup of its own, with no limit yet: (directory, set_limit(bytes), usage()).
    Skips where none can be made."""
    why = "no memory cgroup to nest in"
    for parent, limit_file, usage_file, procs in _own_groups():
        group = parent / f"gpusnap-test-{os.getpid()}-{time.monotonic_ns()}"
        try:
            group.mkdir()
        except OSError as exc:
            why = f"cannot create {group}: {exc.strerror}"
            continue
        if not (group / limit_file).exists():
            group.rmdir()
            why = f"{group} has no {limit_file} (the memory controller is not delegated)"
            continue

        def set_limit(nbytes: int, group=group, limit_file=limit_file) -> None:
            (group / limit_file).write_text(str(nbytes))

        def usage(group=group, usage_file=usage_file) -> int:
            return int((group / usage_file).read_text())

        try:
            yield group, procs, set_limit, usage
        finally:
            for _ in range(100):
                try:
                    group.rmdir()
                    break
                except OSError:
                    time.sleep(0.05)  # its last process is still exiting
        return
    pytest.skip(f"no memory cgroup can be made here ({why}); the fake-cgroup and plain-run tests cover the logic")


def _run_in(group: Path, procs: str, *args, cwd: Path, env: dict) -> Run:
    return Run(*args, cwd=cwd, env=env, prefix=("sh", "-c", f'echo $$ > {group / procs} && exec "$@"', "sh"))


def _heavy_with_reference(tmp_path: Path, steps: int, state_mb: int, ballast_mb: int):
    """(program, ref, out): notorch/heavy.py copied in, and its uninterrupted run's output in ref."""
    program = copy_programs(tmp_path) / "notorch" / "heavy.py"
    ref, out = ref_and_out(tmp_path)
    plain(program, ref, steps, state_mb, ballast_mb, cwd=tmp_path)
    return program, ref, out


def _snapshot_under_limit(tmp_path: Path, program: Path, out: Path, args: tuple, env: dict, room) -> tuple[int, str]:
    """``program`` under gpusnap in a memory cgroup of its own: at step 3 the group is limited to
    its usage and ``room(trainee)`` bytes more, and a snapshot asked for. (exit code, stderr)."""
    with memory_cgroup() as (group, procs, set_limit, usage):
        run = _run_in(group, procs, "run", "--dir", "snaps", program, out, *args, cwd=tmp_path, env=env)
        try:
            wait_for(lambda: progress(out) >= 3, "step 3", proc=run)
            set_limit(usage() + room(psutil.Process(run.proc.pid).children()[0]))
            run.signal(signal.SIGUSR1)
            code, _, err = run.wait(timeout=240)
        finally:
            run.kill_group()
    return code, err


def test_the_headroom_check_reads_the_cgroups_limit(tmp_path):
    """The host has gigabytes free; the job's cgroup has a few dozen MB left, less than the
    trainee's resident set: the snapshot is skipped, naming the cgroup's limit."""
    program = copy_programs(tmp_path) / "notorch" / "heavy.py"
    _, out = ref_and_out(tmp_path)
    with memory_cgroup() as (group, procs, set_limit, usage):
        run = _run_in(group, procs, "run", "--dir", "snaps", program, out, 5000, 1, 96, cwd=tmp_path, env=QUIET)
        try:
            wait_for(lambda: progress(out) >= 3, "step 3", proc=run)
            set_limit(usage() + 32 * MiB)
            run.signal(signal.SIGUSR1)
            wait_for(lambda: "skipped" in (tmp_path / "snaps" / "log.jsonl").read_text(), "the skipped snapshot", proc=run)
            assert not list((tmp_path / "snaps" / "snapshots").glob("*.json"))
        finally:
            run.kill_group()
        err = run.proc.communicate()[1]
    line = next(line for line in err.splitlines() if "skipped" in line)
    assert "GiB exceeds 90% of the " in line and f"GiB left under the memory cgroup limit ({group}/memory." in line, line


def test_an_out_of_memory_kill_takes_the_writer_not_the_program(tmp_path):
    """The cgroup has room for the program but not for the writer's pack window as well: the
    kernel's OOM killer picks the writer (oom_score_adj 1000), the snapshot fails, and the
    program trains on to the end, with the bytes of an uninterrupted run."""
    steps = 400
    program, ref, out = _heavy_with_reference(tmp_path, steps, 48, 160)
    env = {**QUIET, "GPUSNAP_HEADROOM_FRACTION": "1000", "GPUSNAP_CODEC": "none"}
    for attempt in (1, 2, 3):
        for left in (tmp_path / "snaps", out):
            shutil.rmtree(left, ignore_errors=True)
        out.mkdir()
        # The writer's 48 MB pack window does not fit.
        code, err = _snapshot_under_limit(tmp_path, program, out, (steps, 48, 160), env, lambda trainee: 16 * MiB)
        # Another try where the program was killed too: 2 to 90 ms after the kernel killed the
        # writer, a page the program charged found the cgroup still at its limit, the writer gone
        # from its tasks, and the kernel killed the program next (dmesg: the program invoked the
        # OOM killer both times; 14 runs in 56 with three at once, the drain off as here). Three
        # times in a row is not that.
        if "the program was killed by SIGKILL" not in err:
            break
        print(f"attempt {attempt}: the program was killed after the writer\n{err}")
    assert code == 0, err
    assert "snapshot 000001 failed: writer process" in err and "(killed by signal 9)" in err, err
    assert (out / "final.json").read_text() == (ref / "final.json").read_text()


def test_a_writer_without_room_for_pack_windows_of_its_own_writes_without_them(tmp_path):
    """A small program in a cgroup with room for its fork but not for the 136 MiB of pack windows
    a writer maps when the trainee allocated none ahead (the drain off here): the writer writes
    its packs from where the bytes lie, through the page cache (the manifest's writer.windows
    "none"), the snapshot commits, and the program ends with the bytes of an uninterrupted run.
    (Without the check the writer mapped its own windows past the room the limit left; here the
    kernel found page cache to reclaim for them, where a tighter group meets the out-of-memory
    killer, as the test above shows.)"""
    steps = 600
    program, ref, out = _heavy_with_reference(tmp_path, steps, 8, 0)
    # The fork's worst case fits; 136 MiB of windows do not.
    code, err = _snapshot_under_limit(tmp_path, program, out, (steps, 8, 0), QUIET,
                                      lambda trainee: int(trainee.memory_info().rss / 0.9) + 16 * MiB)
    assert code == 0, err
    manifests = list((tmp_path / "snaps" / "snapshots").glob("*.json"))
    assert len(manifests) == 1, err
    assert json.loads(manifests[0].read_text())["writer"]["windows"] == "none"
    assert (out / "final.json").read_text() == (ref / "final.json").read_text()


def test_the_headroom_check_against_cgroup_files(tmp_path):
    """The same check on a faked cgroup tree (as tests/stage/test_stage_arena.py fakes one): a 64 MiB
    limit with 40 MiB in use leaves less than this process's resident set."""
    root = fake_root(tmp_path, "0::/job\n", [V2_MOUNT], {
        "sys/fs/cgroup/job/memory.max": str(64 * MiB),
        "sys/fs/cgroup/job/memory.current": str(40 * MiB),
    })
    refusal = agent._headroom_refusal(root)
    assert refusal is not None and refusal.endswith(f"GiB left under the memory cgroup limit ({root}/sys/fs/cgroup/job/memory.max)")
    assert agent._headroom_refusal(fake_root(tmp_path / "host", "0::/\n", [V2_MOUNT], {})) is None


def test_the_writer_is_the_oom_killers_first_choice(tmp_path):
    program = copy_programs(tmp_path) / "notorch" / "heavy.py"
    _, out = ref_and_out(tmp_path)
    run = Run("run", "--dir", "snaps", program, out, 5000, 96, 0, cwd=tmp_path, env={**QUIET, "GPUSNAP_CODEC": "zstd"})
    try:
        wait_for(lambda: progress(out) >= 3, "step 3", proc=run)
        trainee = psutil.Process(run.proc.pid).children()[0]
        run.signal(signal.SIGUSR1)
        writer = wait_for(lambda: trainee.children(), "the writer", proc=run)[0]
        # The trainee raises its own score across the fork, for the child to inherit, and
        # lowers it again at once.
        wait_for(lambda: Path(f"/proc/{trainee.pid}/oom_score_adj").read_text().strip() == "0",
                 "the trainee's oom_score_adj back at 0", proc=run, timeout=5)

        def adj():
            try:
                return Path(f"/proc/{writer.pid}/oom_score_adj").read_text().strip()
            except OSError:
                return "gone"

        seen = wait_for(lambda: adj() in ("1000", "gone") and adj(), "the writer's oom_score_adj", proc=run)
        assert seen == "1000", "the writer ended before its oom_score_adj could be read"
    finally:
        run.kill_group()
