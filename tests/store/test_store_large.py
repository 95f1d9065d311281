"""A buffer larger than 2 GiB goes through the store and comes back byte for byte."""

from __future__ import annotations

import pytest
import xxhash

from gpusnap.store import RunDir

NBYTES = (2 << 30) + (3 << 20) + 12345  # past every 32-bit length, not a multiple of a chunk


@pytest.mark.slow
def test_a_buffer_over_2_gib_round_trips(tmp_path):
    data = bytearray(NBYTES)  # zeros compress fast; marks at the edges catch misplaced chunks
    for offset in (0, 1 << 20, (1 << 31) - 1, 1 << 31, (1 << 31) + 7, NBYTES - 1):
        data[offset] = (offset * 31 + 7) % 251 + 1
    expected = xxhash.xxh3_128_hexdigest(data)

    rd = RunDir.create(tmp_path / "run", {"command": {"kind": "script", "target": "big.py", "args": []}})
    writer = rd.begin_snapshot(rd.next_snapshot_id())
    record = writer.put_buffer(memoryview(data), dtype="float32", typesize=4)
    del data
    info = writer.commit({"buffers": {"big": record}})

    assert record["nbytes"] == NBYTES == info.bytes_total
    back = rd.read_buffer(rd.manifest(info.id)["buffers"]["big"])
    assert len(back) == NBYTES
    assert xxhash.xxh3_128_hexdigest(back) == expected
