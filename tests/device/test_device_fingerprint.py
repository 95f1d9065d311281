"""The dirty-chunk fingerprint: golden vectors, its properties, and the CUDA kernel (NVRTC
build here; bit-for-bit equality on a GPU).

The golden vectors in tests/golden/fingerprint.json were written once by the reference
(`python tests/device/test_device_fingerprint.py --write`); a change to the definition must change
them on purpose, and the kernel must match them.
"""

from __future__ import annotations

import json
import random
import sys

import numpy as np
import pytest

from gpusnap.device import fingerprint as fp
from gpusnap.device import kernels
from device_helpers import GOLDEN, golden, in_child, pattern
from gpusnap.errors import GpusnapError


# (name, nbytes, chunk_bytes, pattern, offset): offset is where the bytes start in a device
# allocation on the GPU test, to reach the kernel's unaligned path.
CASES = [
    ("one-byte", 1, 4096, "counter", 0),
    ("seven-bytes", 7, 4096, "counter", 0),
    ("one-word", 8, 4096, "counter", 0),
    ("nine-bytes", 9, 4096, "mixed", 0),
    ("one-chunk", 4096, 4096, "mixed", 0),
    ("short-tail", 10000, 4096, "mixed", 0),
    ("odd-chunk-size", 1000, 13, "mixed", 0),
    ("zeros", 65536, 16384, "zeros", 0),
    ("ones", 65536, 16384, "ones", 0),
    ("unaligned-start", 5003, 512, "mixed", 3),
    ("many-blocks-per-chunk", (1 << 20) + 3, 256 << 10, "mixed", 0),
    ("store-default-chunk", (9 << 20) + 77, 4 << 20, "mixed", 0),
]


def write_golden() -> None:
    cases = []
    for name, nbytes, chunk_bytes, kind, offset in CASES:
        prints = fp.reference(pattern(kind, nbytes), chunk_bytes)
        cases.append(
            {
                "name": name,
                "nbytes": nbytes,
                "chunk_bytes": chunk_bytes,
                "pattern": kind,
                "offset": offset,
                "fingerprints": [row.tobytes().hex() for row in prints],
            }
        )
    GOLDEN.write_text(json.dumps({"definition": "gpusnap/device/fingerprint.py", "cases": cases}, indent=1) + "\n")


def test_the_reference_still_gives_the_golden_vectors():
    cases = golden()
    assert [c["name"] for c in cases] == [c[0] for c in CASES]
    for case in cases:
        got = fp.reference(pattern(case["pattern"], case["nbytes"]), case["chunk_bytes"])
        assert [row.tobytes().hex() for row in got] == case["fingerprints"], case["name"]
        assert len(got) == fp.chunk_count(case["nbytes"], case["chunk_bytes"])


def test_chunks_are_cut_as_the_store_cuts_them():
    assert fp.chunk_spans(10, 4) == [(0, 4), (4, 4), (8, 2)]
    assert fp.chunk_spans(8, 4) == [(0, 4), (4, 4)]
    assert fp.chunk_spans(0, 4) == []


def test_every_single_bit_flip_changes_its_own_chunk_and_no_other():
    # 4 chunks of 40 bytes and a tail of 13: word boundaries, a chunk size that is a multiple
    # of 8, and a padded last word.
    data = pattern("mixed", 173)
    chunk = 40
    before = fp.reference(data, chunk)
    for bit in range(len(data) * 8):
        flipped = data.copy()
        flipped[bit // 8] ^= 1 << (bit % 8)
        after = fp.reference(flipped, chunk)
        changed = set(fp.dirty_chunks(before, after).tolist())
        assert changed == {bit // 8 // chunk}, f"bit {bit}"
        # Both 64-bit halves change, not just one.
        row = bit // 8 // chunk
        assert (before[row, :8] != after[row, :8]).any() and (before[row, 8:] != after[row, 8:]).any(), f"bit {bit}"


def test_position_length_and_padding_count():
    seed = random.randrange(1 << 30)
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, 64, dtype=np.uint8)
    swapped = data.copy()
    swapped[:8], swapped[8:16] = data[8:16], data[:8]
    assert fp.reference_one(data) != fp.reference_one(swapped), f"seed {seed}"
    # A chunk and the same chunk with explicit zero padding are different chunks.
    assert fp.reference_one(b"\x01") != fp.reference_one(b"\x01\x00")
    assert fp.reference_one(bytes(8)) != fp.reference_one(bytes(16))
    # The address does not count: the same bytes at another offset of a buffer, same print.
    buf = np.concatenate([np.zeros(3, np.uint8), data])
    assert fp.reference_one(buf[3:]) == fp.reference_one(data)


def test_dirty_chunks_without_a_previous_snapshot_or_after_a_resize_is_everything():
    now = fp.reference(pattern("mixed", 100), 10)
    assert fp.dirty_chunks(None, now).tolist() == list(range(10))
    assert fp.dirty_chunks(now[:5], now).tolist() == list(range(10))
    assert fp.dirty_chunks(now, now).tolist() == []


def _compile_in_a_child(arch: str, source: str | None = None) -> dict:
    """Compile in a forked child. NVRTC loaded into the test process breaks torch's zip reader
    for the rest of the session (every later torch.load: "record size ... does not match"); the
    trainee never loads it, the staging code will load it only where a GPU is."""

    def work():
        try:
            kernels.nvrtc_version()
        except GpusnapError as exc:
            return {"skip": f"NVRTC cannot be loaded here: {exc}"}
        if source is not None:
            kernels.source = lambda name=kernels.FINGERPRINT_SOURCE: source
        try:
            image = kernels.compile_kernel(arch)
        except GpusnapError as exc:
            return {"error": str(exc), "type": type(exc).__name__}
        text = image.data.rstrip(b"\0").decode(errors="replace") if image.kind == "ptx" else ""
        return {"kind": image.kind, "head": image.data[:4].hex(), "text": text}

    out = in_child(work)
    assert "ok" in out, out
    if "skip" in out["ok"]:
        pytest.skip(out["ok"]["skip"])
    return out["ok"]


@pytest.mark.parametrize("arch", ["sm_90", "compute_90"])
def test_the_kernel_compiles_for_sm_90_through_nvrtc(arch):
    image = _compile_in_a_child(arch)
    if arch.startswith("sm_"):
        assert image["kind"] == "cubin" and bytes.fromhex(image["head"]) == b"\x7fELF"
    else:
        text = image["text"]
        assert image["kind"] == "ptx" and ".target sm_90" in text
        for name in (kernels.FINGERPRINT_ACCUMULATE, kernels.FINGERPRINT_FINALIZE):
            assert f".entry {name}(" in text
        # The per-block combine is a 64-bit atomic add: the order-free sum of the definition.
        assert "atom.global.add.u64" in text


def test_a_kernel_that_does_not_compile_is_one_line_naming_the_error():
    failed = _compile_in_a_child("sm_90", source="this is not C++")
    assert failed.get("type") == "KernelBuildError", failed
    assert "\n" not in failed["error"] and "error" in failed["error"]


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    write_golden()
