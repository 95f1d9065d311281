"""A cuda.core program on the fake GPU (and on a real one: ``gpu`` marker) through the real CLI:
device, managed and pinned Buffers computed in, snapshotted, killed -9 and restarted, end with
the same bytes (at other base addresses, on the fake); Buffers made during training (one open, one closed) are
made again on restore; a Buffer of another size in the replay refuses the restart with exit 6,
naming its path; `gpusnap inspect` lists the Buffers by path. The fake faults a writer that
touches managed memory and keeps pinned memory from forked children, so every committed
snapshot here also shows that the writer read both from the staging arena."""

from __future__ import annotations

import pytest

from harness import gpusnap
from test_e2e_device import (
    CHUNK,
    killed_fixture,
    manifest,
    refused_restart,
    restarted_to_the_same_bytes,
)

pytestmark = pytest.mark.slow  # end-to-end runs: the full suite, not the quick loop


# The first snapshot past the second copy of the weights: one Buffer made in training, one closed.
killed = killed_fixture("corecuda", first_at=12)


def test_a_buffer_of_another_size_refuses_the_restart_with_exit_6(killed):
    tmp, _, out, _, _, env = killed
    line, _ = refused_restart(tmp, {**env, "TEST_CORECUDA_DEV_BYTES": str(128 << 10)})
    assert line == ("gpusnap: restore refused: frame[1].locals.weights: the snapshot holds a cuda.core Buffer of "
                    "262,144 bytes, the replayed program one of 131,072 bytes")
    assert not (out / "final.json").exists()


def test_killed_cuda_core_program_restarts_to_the_same_bytes(killed):
    final, before, after = restarted_to_the_same_bytes(killed)
    assert final["retired_closed"] is True
    if killed[5]["GPUSNAP_DEVICE"] == "fake":  # device, managed, pinned: all moved
        assert all(a != b for a, b in zip(before, after))


def test_buffers_are_written_by_kind_and_clean_chunks_keep_their_ids(killed):
    tmp, _, _, first, second, _ = killed
    old, new = manifest(tmp / "snaps", first), manifest(tmp / "snaps", second)
    core = {b["path"]: b for b in new["buffers"].values() if b.get("kind") == "core"}
    assert {path: (b["memory"], b["device"], b["nbytes"]) for path, b in core.items()} == {
        "frame[1].locals.weights": ("device", "cuda", 256 << 10),
        "frame[1].locals.managed": ("managed", "cuda", 128 << 10),
        "frame[1].locals.pinned": ("pinned", "cpu", 256 << 10),
        "frame[1].locals.totals": ("pinned", "cpu", 4 << 10),
        "frame[1].locals.state['best']": ("device", "cuda", 256 << 10),
    }
    assert not new["allocations"]  # cuda.core allocates past the raw-allocation wrappers
    by_path = {b["path"]: name for name, b in new["buffers"].items() if b.get("kind") == "core"}
    managed = by_path["frame[1].locals.managed"]
    before, after = old["buffers"][managed]["chunks"], new["buffers"][managed]["chunks"]
    assert new["device"]["reused_from"] == first
    assert new["buffers"][managed]["dirty_bytes"] == CHUNK  # its first words changed, the rest kept their ids
    assert after[1:] == before[1:] and after[0] != before[0]
    objects = {o["path"]: o for o in new["objects"]}
    assert objects["frame[1].locals.state['retired']"]["type"].endswith(".Buffer")


def test_inspect_shows_cuda_core_buffers_by_path_and_kind(killed):
    tmp, _, _, _, second, _ = killed
    shown = gpusnap("inspect", "snaps", second, cwd=tmp)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert any(line.startswith("device memory: device 512.0 KiB, managed 128.0 KiB, pinned 260.0 KiB;") for line in lines)
    rows = {line.split()[0]: line.split() for line in lines if line.startswith("  frame[1].locals.") and "cuda.core" in line}
    assert rows["frame[1].locals.weights"][1:5] == ["cuda.core", "Buffer", "device", "0"]
    assert rows["frame[1].locals.managed"][1:5] == ["cuda.core", "Buffer", "managed", "0"]
    assert rows["frame[1].locals.pinned"][1:5] == ["cuda.core", "Buffer", "pinned", "-"]
    assert "frame[1].locals.state['best']" in rows
