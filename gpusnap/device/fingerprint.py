"""The dirty-chunk fingerprint: 128 bits per store chunk, computed where the bytes live.

Staging compares each chunk's fingerprint with the one the previous snapshot took and copies
only the chunks whose fingerprint changed (docs/gpu.md). This module *defines*
the fingerprint with a NumPy reference; the CUDA kernel (``fingerprint.cu``) and the fake
backend must give the same 16 bytes for the same chunk, bit for bit.

Chunks are cut as the store cuts a buffer (``store/writer.py``): from offset 0 of the range,
``chunk_bytes`` each, the last one shorter. A fingerprint depends only on a chunk's bytes and
length, never on its address, so it survives a restart at another base.

Definition, for a chunk of ``n`` bytes (all arithmetic modulo 2**64, ``^`` xor, ``>>`` logical
shift, ``rotl`` a 64-bit left rotation)::

    W    = ceil(n / 8)
    w[i] = bytes [8i, 8i+8) of the chunk as a little-endian u64, zero-padded past n
    k[i] = (i + 1) * K0
    m[i] = (w[i] ^ k[i]) * C1;   m[i] = m[i] ^ (m[i] >> 31)
    A    = sum over i of m[i]
    B    = sum over i of rotl(m[i], 27) * C2
    lo   = fin(A ^ n),  hi = fin(B + n * K0)
    fin(x): x ^= x >> 33; x *= C2; x ^= x >> 29; x *= C1; x ^= x >> 32
    fingerprint = lo as 8 little-endian bytes, then hi as 8 little-endian bytes

with K0 = 0x9E3779B97F4A7C15, C1 = 0xBF58476D1CE4E5B9, C2 = 0x94D049BB133111EB.

Why this shape: every step from ``w[i]`` to ``m[i]`` is a bijection of 64 bits (xor with a
constant, multiply by an odd constant, xorshift), sums modulo 2**64 form a group and ``fin`` is a
bijection, so changing any one word of a chunk changes both halves of its fingerprint — always,
not just with high probability. The sums are order-free, so a GPU splits a chunk over any number
of threads and blocks and adds their partial sums (warp shuffles, then one 64-bit atomic add per
block); per 8 bytes it costs two 64-bit multiplies plus shifts, cheap next to an HBM load.
The key ``k[i]`` makes position count: the same word at another offset adds a different term.
It is not a cryptographic hash: two words changed into each other's masked values would cancel.
``--paranoid`` copies every chunk regardless.
"""

from __future__ import annotations

import numpy as np

FINGERPRINT_NBYTES = 16
K0 = 0x9E3779B97F4A7C15
C1 = 0xBF58476D1CE4E5B9
C2 = 0x94D049BB133111EB

_U64 = np.uint64
_MASK = (1 << 64) - 1


def chunk_count(nbytes: int, chunk_bytes: int) -> int:
    """How many chunks the store cuts ``nbytes`` into (an empty buffer has none)."""
    return -(-nbytes // chunk_bytes)


def chunk_spans(nbytes: int, chunk_bytes: int) -> list[tuple[int, int]]:
    """(offset, length) of each chunk of a buffer, as ``store/writer.py`` cuts it."""
    return [(start, min(chunk_bytes, nbytes - start)) for start in range(0, nbytes, chunk_bytes)]


def _fin(x: int) -> int:
    x ^= x >> 33
    x = (x * C2) & _MASK
    x ^= x >> 29
    x = (x * C1) & _MASK
    x ^= x >> 32
    return x


def word_terms(chunk: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per word of one chunk (uint8 array): its terms of the sums A and B, before summing. The
    fake GPU's kernel emulation sums them per thread block, as the kernel does."""
    n = len(chunk)
    words = -(-n // 8)
    if n % 8:
        padded = np.zeros(words * 8, dtype=np.uint8)
        padded[:n] = chunk
        chunk = padded
    w = np.frombuffer(chunk, dtype="<u8", count=words)
    # NumPy's uint64 array arithmetic wraps modulo 2**64, which is the definition.
    with np.errstate(over="ignore"):
        k = (np.arange(1, words + 1, dtype=_U64)) * _U64(K0)
        m = (w ^ k) * _U64(C1)
        m ^= m >> _U64(31)
        rot = (m << _U64(27)) | (m >> _U64(37))
        return m, rot * _U64(C2)


def finalize(a: int, b: int, n: int) -> bytes:
    """The 16-byte fingerprint of a chunk of ``n`` bytes from its sums A and B."""
    lo = _fin((a ^ n) & _MASK)
    hi = _fin((b + n * K0) & _MASK)
    return lo.to_bytes(8, "little") + hi.to_bytes(8, "little")


def reference_one(chunk) -> bytes:
    """The 16-byte fingerprint of one chunk (any bytes-like object)."""
    data = np.frombuffer(memoryview(chunk).cast("B"), dtype=np.uint8)
    a_terms, b_terms = word_terms(data)
    return finalize(int(a_terms.sum(dtype=_U64)), int(b_terms.sum(dtype=_U64)), len(data))


def reference(data, chunk_bytes: int) -> np.ndarray:
    """Fingerprints of every chunk of ``data``: uint8 array of shape (chunks, 16), the layout
    the kernel writes and the backends return."""
    if chunk_bytes <= 0:
        raise ValueError("chunk_bytes must be positive")
    view = memoryview(data).cast("B")
    spans = chunk_spans(len(view), chunk_bytes)
    out = np.empty((len(spans), FINGERPRINT_NBYTES), dtype=np.uint8)
    for row, (start, length) in enumerate(spans):
        out[row] = np.frombuffer(reference_one(view[start : start + length]), dtype=np.uint8)
    return out


def dirty_chunks(previous: np.ndarray | None, current: np.ndarray) -> np.ndarray:
    """Indices of chunks whose fingerprint differs from ``previous`` (all of them when there is
    no previous fingerprint array or the chunk count changed)."""
    if previous is None or previous.shape != current.shape:
        return np.arange(len(current))
    return np.flatnonzero((previous != current).any(axis=1))
