"""The staging arena: its allocator and generations, writers in real forked processes that read
their regions while the trainee stages the next snapshot, its size against a cgroup tree of
real files, and a snapshot that does not fit, through the real CLI."""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal

import pytest
import torch

from fake_cgroups import V1_MOUNT, V2_MOUNT, fake_root
from gpusnap.errors import ArenaFull, StageError
from gpusnap.rawmem import MADV_DONTFORK, PAGE, madvise, view_at
from gpusnap.stage import limits
from gpusnap.stage.arena import DMA_USES, USES, Arena, writer_view
from gpusnap.stage.drain import drain
from harness import Run, assert_same, gpusnap, load_final, plain, programs_and_out, progress, request_snapshot, wait_for

MiB = 1 << 20


def overlaps(a, b) -> bool:
    return a.offset < b.end and b.offset < a.end


# -- the allocator ------------------------------------------------------------------------------


def test_regions_never_overlap_one_held_by_a_writer_and_are_reused_only_after_release():
    seed = random.randrange(1 << 30)
    print(f"seed {seed}")
    rnd = random.Random(seed)
    arena = Arena(capacity=64 * MiB)
    sealed: dict[int, list] = {}  # generation -> its regions, while its writer runs
    pending: list = []
    released: list = []  # regions whose writer is done: their bytes may be reused
    for _ in range(400):
        action = rnd.random()
        if action < 0.5:
            try:
                region = arena.reserve(rnd.randint(1, 6 * MiB), rnd.choice(USES))
            except ArenaFull:
                continue
            assert region.offset % PAGE == 0 and region.end <= arena.capacity
            # What the GPU copies into lies in the pinned part, and nothing else does.
            assert (region.offset >= arena.pinned_offset) == (region.use in DMA_USES), (seed, region)
            assert region.generation == arena.pending
            for held in [r for regions in sealed.values() for r in regions] + pending:
                assert not overlaps(region, held), (seed, region, held)
            pending.append(region)
        elif action < 0.7:
            generation = arena.seal()
            assert generation not in sealed and all(r.generation == generation for r in pending)
            sealed[generation], pending = pending, []
        elif action < 0.95 and sealed:
            generation = rnd.choice(sorted(sealed))
            arena.release(generation)
            released += sealed.pop(generation)
        else:
            arena.discard()
            released += pending
            pending = []
        assert sorted(arena.regions(), key=lambda r: r.offset) == sorted(
            [r for regions in sealed.values() for r in regions] + pending, key=lambda r: r.offset)
    assert any(overlaps(a, b) for a in released for b in released if a is not b), "space was never reused"


def test_a_full_arena_refuses_with_the_bytes_needed_and_the_limit_and_frees_on_release():
    arena = Arena(capacity=16 * MiB)
    first = arena.reserve(10 * MiB, "drain")
    generation = arena.seal()
    with pytest.raises(ArenaFull) as refused:
        arena.reserve(10 * MiB, "drain")
    message = refused.value.message
    assert isinstance(refused.value, StageError) and "\n" not in message
    assert "10,485,760 bytes for the CPU drain" in message and "16,777,216 bytes (its requested size)" in message
    assert "10,485,760 of them held by snapshots in progress" in message
    assert "training goes on" in refused.value.hint

    assert arena.reserve(6 * MiB, "device").offset == first.end  # what is left beside the writer's
    arena.discard()
    arena.release(generation)
    again = arena.reserve(10 * MiB, "drain")
    assert again.offset == first.offset and again.generation == generation + 1


def test_generations_count_up_and_free_gives_back_a_pending_region_only():
    arena = Arena(capacity=8 * MiB)
    ahead = arena.reserve(MiB, "drain")
    arena.free(ahead)
    assert arena.regions() == []
    kept = arena.reserve(MiB, "managed")
    first = arena.seal()
    second = arena.seal()  # a snapshot with no region still gets its generation
    assert (first, second, arena.pending) == (1, 2, 3) and kept.generation == first
    with pytest.raises(ValueError):
        arena.free(kept)
    with pytest.raises(ValueError):
        arena.reserve(MiB, "gpu")


# -- writers that still read ----------------------------------------------------------------------


def digest(view) -> str:
    return hashlib.sha256(bytes(view)).hexdigest()


class Writer:
    """A forked child that stands for a writer: ``work()`` runs at once, ``read()`` only once the
    test lets it go (a writer still busy with its snapshot); the result comes back as JSON."""

    def __init__(self, work, read):
        self._go_r, self._go_w = os.pipe()
        self._ready_r, ready_w = os.pipe()
        self._result_r, result_w = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:
            try:
                state = work()
                os.write(ready_w, b"r")
                os.read(self._go_r, 1)
                result = {"ok": read(state)}
            except BaseException as exc:  # noqa: BLE001 - reported to the test
                result = {"error": f"{type(exc).__name__}: {exc}"}
            os.write(result_w, json.dumps(result).encode())
            os._exit(0)
        os.close(ready_w)
        os.close(result_w)
        assert os.read(self._ready_r, 1) == b"r", "the writer died before it was ready"

    def finish(self):
        os.write(self._go_w, b"g")
        with os.fdopen(self._result_r, "rb") as pipe:
            data = pipe.read()
        os.waitpid(self.pid, 0)
        result = json.loads(data)
        assert "error" not in result, result["error"]
        return result["ok"]


def span(t: torch.Tensor) -> tuple[int, int]:
    storage = t.untyped_storage()
    return storage.data_ptr(), storage.nbytes()


def test_a_second_snapshot_while_a_writer_still_reads_never_overwrites_its_regions():
    """Two generations, each a device-staging region the trainee fills before fork and a drain
    region the writer fills after: the first writer reads its regions only after the second
    snapshot has staged and drained, and both read what their own snapshot held."""
    arena = Arena(capacity=64 * MiB)
    weights = torch.full((1 << 20,), 1.0)  # 4 MiB: drained by each writer

    def snapshot(staged_bytes: bytes):
        staged = arena.reserve(len(staged_bytes), "device")
        staged.trainee_view(arena)[: len(staged_bytes)] = staged_bytes  # as device staging does
        region = arena.reserve(8 * MiB, "drain")
        arena.seal()

        def work():
            drained = drain(arena.fd, region, 256 << 10)
            drained.reach(*span(weights))  # as the pickler does when it reaches the tensor
            return drained

        def read(drained):
            return {"staged": digest(writer_view(arena.fd, staged.offset, len(staged_bytes))),
                    "weights": digest(drained.view(*span(weights)))}

        return Writer(work, read), staged, region

    first_staged = os.urandom(3 * MiB)
    first_weights = digest(view_at(*span(weights)))
    first, *first_regions = snapshot(first_staged)

    weights.fill_(2.0)  # the trainee trains on while the first writer is still at work
    second_staged = os.urandom(3 * MiB)
    second_weights = digest(view_at(*span(weights)))
    second, *second_regions = snapshot(second_staged)
    assert not any(overlaps(a, b) for a in first_regions for b in second_regions)

    assert second.finish() == {"staged": digest(second_staged), "weights": second_weights}
    assert first.finish() == {"staged": digest(first_staged), "weights": first_weights}
    arena.release(1)
    assert arena.reserve(MiB, "device").offset == first_regions[0].offset  # free once its writer is done
    assert arena.reserve(MiB, "drain").offset == first_regions[1].offset


def test_a_writer_maps_its_region_afresh_even_where_the_trainee_mapping_is_not_inherited():
    arena = Arena(capacity=4 * MiB)
    region = arena.reserve(MiB, "pinned")
    region.trainee_view(arena)[:5] = b"bytes"
    madvise(arena.address, arena.capacity, MADV_DONTFORK)  # what CUDA does to memory it registers
    writer = Writer(lambda: None, lambda _: bytes(writer_view(arena.fd, region.offset + 1, 4)).decode())
    assert writer.finish() == "ytes"


# -- sizing against the memory cgroup -----------------------------------------------------------


def test_cgroup_v2_the_tightest_limit_on_the_way_up_holds(tmp_path):
    root = fake_root(tmp_path, "0::/job/step\n", [V2_MOUNT], {
        "sys/fs/cgroup/job/step/memory.max": "max\n",
        "sys/fs/cgroup/job/step/memory.current": "1000\n",
        "sys/fs/cgroup/job/memory.max": str(64 * MiB),
        "sys/fs/cgroup/job/memory.current": str(40 * MiB),
        "sys/fs/cgroup/job/memory.stat": f"anon 1\ninactive_file {8 * MiB}\n",
    })
    limit = limits.cgroup_memory(root)
    assert (limit.nbytes, limit.used_bytes, limit.room_bytes) == (64 * MiB, 32 * MiB, 32 * MiB)
    assert limit.what == f"the memory cgroup limit ({root}/sys/fs/cgroup/job/memory.max)"


def test_cgroup_v1_memory_hierarchy_and_a_container_whose_mount_is_its_own_group(tmp_path):
    mount = "35 31 0:32 /kubepods/pod1 /sys/fs/cgroup/memory ro,relatime - cgroup cgroup rw,memory"
    root = fake_root(tmp_path, "12:pids:/kubepods/pod1\n4:memory:/kubepods/pod1\n0::/\n", [mount, V2_MOUNT], {
        "sys/fs/cgroup/memory/memory.limit_in_bytes": str(48 * MiB),
        "sys/fs/cgroup/memory/memory.usage_in_bytes": str(16 * MiB),
        "sys/fs/cgroup/memory/memory.stat": f"inactive_file 5\ntotal_inactive_file {4 * MiB}\n",
        "sys/fs/cgroup/memory.max": "max\n",  # the v2 hierarchy sets no limit
    })
    limit = limits.cgroup_memory(root)
    assert (limit.nbytes, limit.used_bytes) == (48 * MiB, 12 * MiB)


def test_no_cgroup_limit_means_host_memory_sizes_the_arena(tmp_path):
    root = fake_root(tmp_path, "4:memory:/a\n", [V1_MOUNT], {
        "sys/fs/cgroup/memory/a/memory.limit_in_bytes": "9223372036854771712\n",  # v1's "no limit"
    }, ram_kib=32 << 10)
    assert limits.cgroup_memory(root) is None
    assert limits.cgroup_memory(str(tmp_path / "nothing here")) is None
    arena = Arena(root=root)
    assert (arena.capacity, arena.capacity_limit) == (32 * MiB, "host memory")


def test_the_arena_is_sized_against_the_cgroup_and_refuses_what_its_room_cannot_hold(tmp_path):
    root = fake_root(tmp_path, "0::/job\n", [V2_MOUNT], {
        "sys/fs/cgroup/job/memory.max": str(64 * MiB),
        "sys/fs/cgroup/job/memory.current": str(40 * MiB),
    })
    arena = Arena(root=root)
    assert arena.capacity == 64 * MiB and arena.capacity_limit.startswith("the memory cgroup limit")
    region = arena.reserve(16 * MiB, "drain")  # 24 MiB of room: fits
    list(arena.populate(region))  # its pages exist now (charged to the job in a real cgroup)
    arena.seal()
    with pytest.raises(ArenaFull) as refused:
        arena.reserve(32 * MiB, "device")
    assert refused.value.message == (
        "the staging arena needs 33,554,432 more bytes for device staging (33,554,432 in all), but the memory "
        f"cgroup limit ({root}/sys/fs/cgroup/job/memory.max) leaves 25,165,824 bytes (of 67,108,864; 90% may be used)")
    arena.release(1)
    assert arena.reserve(32 * MiB, "drain").offset == region.offset  # 16 MiB of its pages exist: 16 to add


# -- through the CLI ------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_snapshot_the_arena_cannot_hold_is_skipped_and_a_later_one_commits(tmp_path):
    """GPUSNAP_ARENA_BYTES below the large model's optimizer state: the snapshot taken while it
    trains is skipped with one line and a hint, training goes on, and once the program trains
    a small model a snapshot commits and restarts to the bytes of an uninterrupted run."""
    programs, out = programs_and_out(tmp_path)
    (tmp_path / "ref").mkdir()
    plain(programs / "shrinks.py", tmp_path / "ref", 80, 30, cwd=tmp_path)
    env = {"GPUSNAP_ARENA_BYTES": str(8 * MiB), "TEST_STEP_SLEEP_S": "0.1"}
    run = Run("run", "--dir", "snaps", programs / "shrinks.py", out, 80, 30, cwd=tmp_path, env=env)
    wait_for(lambda: progress(out) >= 3, "step 3", proc=run)
    log = tmp_path / "snaps" / "log.jsonl"
    run.signal(signal.SIGUSR1)
    skipped = wait_for(lambda: [e for e in map(json.loads, log.read_text().splitlines()) if e.get("event") == "skipped"],
                       "the skipped snapshot", proc=run)[0]
    assert skipped["message"].startswith("the staging arena cannot hold ")
    assert "bytes for the CPU drain: it may grow to 8,388,608 bytes (GPUSNAP_ARENA_BYTES)" in skipped["message"]
    assert progress(out) < 30, "the large model was gone before the snapshot"
    wait_for(lambda: progress(out) >= 34, "step 34", proc=run)
    snap_id = request_snapshot(run, tmp_path / "snaps")
    wait_for(lambda: progress(out) >= 40, "step 40", proc=run)
    run.kill_group()
    err = run.proc.stderr.read() if run.proc.stderr else ""
    assert f"gpusnap: snapshot skipped: {skipped['message']}\nhint: raise the job's memory limit" in err

    restarted = gpusnap("restart", "snaps", cwd=tmp_path, env=env)
    assert restarted.returncode == 0, restarted.stderr
    assert f"restored snapshot {snap_id}" in restarted.stderr
    assert_same(load_final(tmp_path / "ref"), load_final(out))
