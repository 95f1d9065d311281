"""A cuda-python program on the fake GPU (and on a real one: ``gpu`` marker) through the real CLI: raw device, managed and VMM memory
computed in, snapshotted, killed -9 and restarted, ends with the same bytes, at other base
addresses on the fake and at the same ones where the device repeats them
(GPUSNAP_FAKE_BASES=repeat, as a real GPU often does); only dirty chunks are copied; an
allocation the replay does not make refuses the restart with exit 6; a failure in the stall
skips that snapshot and training goes on. The fake faults a writer that touches managed memory,
so every committed snapshot here also shows that the writer never did."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest
from harness import Run, _env, copy_programs, gpusnap, progress, request_snapshot, snapshotted_twice_and_killed, wait_for

pytestmark = pytest.mark.slow  # end-to-end runs: the full suite, not the quick loop

CHUNK = 64 << 10
FAKE = {"GPUSNAP_DEVICE": "fake", "GPUSNAP_CHUNK_BYTES": str(CHUNK), "TEST_STEP_SLEEP_S": "0"}
PACED = {"TEST_STEP_SLEEP_S": "0.05"}
STEPS = 60


def manifest(run_dir, snap_id: str) -> dict:
    return json.loads((run_dir / "snapshots" / f"{snap_id}.json").read_text())


def _cuda_usable() -> bool:
    # Asked in a child: the driver and NVRTC stay out of the test process.
    probe = "from gpusnap.device.cuda import load_driver; d = load_driver(); assert d.cuDeviceGetCount()[1] > 0"
    return subprocess.run([sys.executable, "-c", probe], capture_output=True, env=_env(), timeout=120).returncode == 0


def killed_fixture(program: str, first_at: int, extra_env: dict | None = None, on_gpu: bool = True):
    """A module fixture, on the fake GPU and on a real one: an uninterrupted reference run of
    tests/programs/notorch/PROGRAM.py, and a run snapshotted twice (first at step ``first_at``)
    and killed -9 after; gives (tmp, ref, out, first id, second id, env)."""

    params = ["fake", pytest.param("cuda", marks=pytest.mark.gpu)] if on_gpu else ["fake"]

    @pytest.fixture(scope="module", params=params)
    def killed(request, tmp_path_factory):
        if request.param == "cuda" and not _cuda_usable():
            pytest.skip("no CUDA device here")
        env = {**FAKE, "GPUSNAP_DEVICE": request.param, **(extra_env or {})}
        tmp = tmp_path_factory.mktemp(program)
        script = copy_programs(tmp) / "notorch" / f"{program}.py"
        # The program appends each run's allocation bases to OUT/bases at its start, which the
        # tests read: a restart's replayed setup writes it again, and must keep the line (the
        # restart keeps the run's --files-exclude).
        ref, out, first, second = snapshotted_twice_and_killed(script, STEPS, tmp, env, PACED, first_at,
                                                               run_args=("--files-exclude", "bases"))
        return tmp, ref, out, first, second, env

    return killed


killed = killed_fixture("rawcuda", first_at=5)


def refused_restart(tmp, env: dict) -> tuple[str, str]:
    """`gpusnap restart snaps`, which must refuse with exit 6: its refusal line, and its stderr."""
    refused = gpusnap("restart", "snaps", cwd=tmp, env=env)
    assert refused.returncode == 6, refused.stderr
    return next(line for line in refused.stderr.splitlines() if line.startswith("gpusnap: restore refused:")), refused.stderr


def test_unmatched_raw_allocation_refuses_the_restart_with_exit_6(killed):
    tmp, _, out, _, second, env = killed
    line, stderr = refused_restart(tmp, {**env, "TEST_RAWCUDA_DEV_BYTES": str(128 << 10)})
    assert line == (f"gpusnap: restore refused: raw device memory allocated at {tmp / 'programs' / 'notorch' / 'rawcuda.py'}:35 "
                    "(cuMemAlloc call #0, 262,144 bytes) has no counterpart in the replayed program")
    assert "hint: the replay must make the same cuda-python allocations" in stderr
    assert not (out / "final.json").exists()


def restarted_to_the_same_bytes(killed) -> tuple[dict, list, list]:
    """`gpusnap restart snaps` continues from the last snapshot and ends with the uninterrupted
    run's bytes: the final state, and the bases the killed and the restarted run wrote to
    `bases`. Where those are is the device's business: a real GPU often gives the same addresses
    in every process, the fake picks new ones unless GPUSNAP_FAKE_BASES=repeat."""
    tmp, ref, out, _, second, env = killed
    restarted = gpusnap("restart", "snaps", cwd=tmp, env=env)
    assert restarted.returncode == 0, restarted.stderr
    assert f"restored snapshot {second}" in restarted.stderr
    final = json.loads((out / "final.json").read_text())
    assert final == json.loads((ref / "final.json").read_text())
    bases = [line.split() for line in (out / "bases").read_text().splitlines()]
    assert len(bases) >= 2
    print("bases, killed and restarted:", bases[-2], bases[-1])
    return final, bases[-2], bases[-1]


def test_killed_raw_cuda_program_restarts_to_the_same_bytes(killed):
    _, before, after = restarted_to_the_same_bytes(killed)
    if killed[5]["GPUSNAP_DEVICE"] == "fake":  # device, managed, VMM all moved: the pointers were translated
        assert all(a != b for a, b in zip(before, after))


killed_at_repeated_bases = killed_fixture("rawcuda", first_at=5, extra_env={"GPUSNAP_FAKE_BASES": "repeat"}, on_gpu=False)


def test_a_restart_at_the_same_bases_restores_the_same_bytes(killed_at_repeated_bases):
    """As a real GPU often does it: every allocation at the address it had in the killed run."""
    _, before, after = restarted_to_the_same_bytes(killed_at_repeated_bases)
    assert before == after


def test_only_dirty_chunks_are_copied_and_clean_ones_keep_their_ids(killed):
    tmp, _, _, first, second, _ = killed
    old, new = manifest(tmp / "snaps", first), manifest(tmp / "snaps", second)
    assert old["device"]["reused_from"] is None
    assert new["device"]["reused_from"] == first
    assert old["device"]["dirty_bytes"] == sum(a["nbytes"] for a in old["allocations"])
    by_api = {a["api"]: a for a in new["allocations"]}
    assert set(by_api) == {"cuMemAlloc", "cuMemAllocManaged", "cuMemMap"}
    for a in new["allocations"]:
        before = old["buffers"][a["buffer"]]["chunks"]
        after = new["buffers"][a["buffer"]]["chunks"]
        changed = [i for i, (x, y) in enumerate(zip(before, after)) if x != y]
        # Copied exactly what changed: a chunk is copied iff its content (and so its id) changed.
        assert a["dirty_bytes"] == len(changed) * CHUNK, a
    # The VMM buffer changes 4 of its 32 chunks, the managed one its first chunk only.
    assert by_api["cuMemMap"]["dirty_bytes"] == 4 * CHUNK
    assert by_api["cuMemAllocManaged"]["dirty_bytes"] == CHUNK
    assert by_api["cuMemAlloc"]["dirty_bytes"] == 256 << 10
    assert new["device"]["dirty_bytes"] == 4 * CHUNK + CHUNK + (256 << 10)
    listed = {s["id"]: s for s in json.loads(gpusnap("ls", "snaps", "--json", cwd=tmp).stdout)}
    assert listed[second]["dirty_bytes"] == new["device"]["dirty_bytes"]


def test_inspect_shows_device_memory_by_kind_and_owner(killed):
    tmp, _, _, _, second, _ = killed
    shown = gpusnap("inspect", "snaps", second, cwd=tmp)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert any(line.startswith("device memory: device 256.0 KiB, managed 128.0 KiB, vmm 2.0 MiB;") for line in lines)
    assert any("rawcuda.py:36 #0" in line and "cuMemAllocManaged" in line for line in lines)
    assert any(line.strip().startswith("unaccounted on device 0:") for line in lines)


def test_paranoid_copies_every_chunk(tmp_path):
    programs = copy_programs(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    run = Run("run", "--dir", "snaps", "--paranoid", programs / "notorch" / "rawcuda.py", out, STEPS, cwd=tmp_path,
              env={**FAKE, **PACED})
    wait_for(lambda: progress(out) >= 3, "step 3", proc=run)
    request_snapshot(run, tmp_path / "snaps")
    second = request_snapshot(run, tmp_path / "snaps")
    run.kill_group()
    m = manifest(tmp_path / "snaps", second)
    assert m["device"]["reused_from"] is None
    assert m["device"]["dirty_bytes"] == sum(a["nbytes"] for a in m["allocations"])


def skipped_events(run_dir) -> list:
    try:
        lines = (run_dir / "log.jsonl").read_text().splitlines()
    except FileNotFoundError:
        return []
    return [event for event in map(json.loads, lines) if event.get("event") == "skipped"]


def test_a_failure_in_the_stall_skips_that_snapshot_with_one_line_and_training_goes_on(tmp_path):
    """A device-memory source that raises (torch's memory snapshot under cudaMallocAsync does)
    and a stall step that raises something unforeseen: each snapshot is skipped with one line
    and a hint, the program trains on, and the next snapshot commits."""
    programs = copy_programs(tmp_path)
    out, snaps = tmp_path / "out", tmp_path / "snaps"
    out.mkdir()
    run = Run("run", "--dir", "snaps", programs / "notorch" / "stall_faults.py", out, STEPS, cwd=tmp_path, env={**FAKE, **PACED})
    wait_for(lambda: progress(out) >= 3, "step 3", proc=run)
    for count in (1, 2):
        run.signal(signal.SIGUSR1)
        wait_for(lambda: len(skipped_events(snaps)) >= count, f"skipped snapshot {count}", proc=run)
    request_snapshot(run, snaps)
    code, _, err = run.wait()
    assert code == 0, err
    assert (out / "final.json").exists()
    assert [e["message"] for e in skipped_events(snaps)] == [
        "the program's device memory could not be listed: RuntimeError: cudaMallocAsync does not yet support _snapshot",
        "staging failed: ValueError: a failure nobody foresaw"]
    assert ("gpusnap: snapshot skipped: the program's device memory could not be listed: RuntimeError: "
            "cudaMallocAsync does not yet support _snapshot\nhint: this snapshot is skipped, training goes on") in err
    assert "gpusnap: snapshot skipped: staging failed: ValueError: a failure nobody foresaw\nhint: " in err
    assert "Traceback" not in err
