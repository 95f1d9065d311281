"""Chunk names, per-dtype compression, and the 32-byte entry header that precedes every chunk
in a pack.

Compression was chosen by measuring 4 MiB chunks on 2 cores (blosc2 2.x, clevel 1):

    data            ZSTD+shuffle      ZSTD+shuffle+bytedelta  LZ4+shuffle     LZ4+bitshuffle
    fp32 weights    1.18x 0.47 GB/s   1.17x 0.55 GB/s         1.06x 1.06 GB/s 1.13x 1.45 GB/s
    bf16 weights    1.45x 0.41 GB/s   1.40x 0.35 GB/s         1.13x 0.64 GB/s 1.32x 1.49 GB/s
    Adam v (fp32)   1.19x 0.56 GB/s   1.17x 0.59 GB/s         1.07x 1.12 GB/s 1.14x 1.11 GB/s
    1% non-zero     212x  1.88 GB/s   1706x 2.83 GB/s         407x  4.12 GB/s 123x  1.88 GB/s

so floats get ZSTD-1 + shuffle (knobs.CODEC == "zstd", best ratio) or LZ4 + bitshuffle
("lz4", 3x faster for most of the ratio); bytedelta never paid for itself on weights. "none"
stores every chunk raw: for hosts where the writer's CPU time is training's (every core busy).
"""

from __future__ import annotations

import struct

import xxhash

from gpusnap import knobs

ENTRY_MAGIC = b"GSCK"
# magic, codec, blosc2 codec, filter, clevel, raw_nbytes, stored_nbytes, chunk id (16 bytes)
ENTRY = struct.Struct("<4sBBBBII16s")
ENTRY_NBYTES = ENTRY.size  # 32

CODEC_RAW = 0
CODEC_BLOSC2 = 1

# A chunk length must fit the entry header (u32) and one blosc2 chunk (< 2 GiB); no writer cuts
# longer ones, so a reader takes a longer claim for damage before it allocates anything.
MAX_CHUNK_BYTES = 1 << 30

FILTER_NONE = 0
FILTER_SHUFFLE = 1
FILTER_BITSHUFFLE = 2

FLOATS = ("float", "bfloat", "half", "double", "complex")


def chunk_id(data) -> str:
    """A chunk's name: the xxh3-128 digest of its raw bytes, 32 lower-case hex digits."""
    return xxhash.xxh3_128_hexdigest(data)


def stored_digest(stored) -> str:
    """The xxh3-64 of a chunk's stored (compressed) bytes, 16 hex digits: the index keeps it, and
    a reader checks it before the bytes reach the decompressor (the chunk id names the raw bytes,
    which exist only after decoding)."""
    return xxhash.xxh3_64_hexdigest(stored)


def is_digest(text, nhex: int) -> bool:
    return isinstance(text, str) and len(text) == nhex and all(c in "0123456789abcdef" for c in text)


def params_for(dtype: str, typesize: int, codec: str | None = None) -> tuple[int, int, int]:
    """(blosc2 codec, filter, clevel) for a buffer of this dtype."""
    import blosc2

    zstd = (codec or knobs.CODEC).lower() != "lz4"
    b2codec = (blosc2.Codec.ZSTD if zstd else blosc2.Codec.LZ4).value
    if typesize <= 1 or dtype in ("bytes", "bool", "uint8", "int8"):
        return b2codec, FILTER_NONE, 1
    if dtype.startswith(FLOATS) and not zstd:
        return b2codec, FILTER_BITSHUFFLE, 1
    return b2codec, FILTER_SHUFFLE, 1


def compress(data, dtype: str, typesize: int, codec: str | None = None) -> bytes:
    """``data`` as one blosc2 chunk, on the calling thread (the writer runs one per encoder
    thread, so blosc2's own pool, which does not survive fork, never starts)."""
    import blosc2

    b2codec, filt, clevel = params_for(dtype, typesize, codec)
    # blosc2 rejects typesize > 255 and chunks whose length is not a multiple of typesize are
    # fine (the tail is copied), so only clamp.
    return blosc2.compress2(
        data,
        codec=blosc2.Codec(b2codec),
        clevel=clevel,
        filters=[blosc2.Filter(filt)],  # the FILTER_* numbers are blosc2's
        filters_meta=[0],
        typesize=max(1, min(int(typesize), 255)),
        nthreads=1,
    )


def encode(cid: str, data, dtype: str, typesize: int, codec: str | None = None) -> tuple[bytes, bytes]:
    """Encode one chunk with ``codec`` ("zstd", "lz4"; None: knobs.CODEC, where "auto" means
    "zstd"), or raw when that gains less than COMPRESS_MIN_GAIN: return (32-byte entry header,
    stored bytes). A chunk stored raw comes back as ``data`` itself, not a copy."""
    raw_nbytes = len(data)
    codec = codec or knobs.CODEC
    if codec == "none":
        return _raw(cid, data)
    stored = compress(data, dtype, typesize, codec)
    if len(stored) > raw_nbytes * (1.0 - knobs.COMPRESS_MIN_GAIN):
        return _raw(cid, data)
    b2codec, filt, clevel = params_for(dtype, typesize, codec)
    header = ENTRY.pack(
        ENTRY_MAGIC, CODEC_BLOSC2, b2codec, filt, clevel, raw_nbytes, len(stored), bytes.fromhex(cid)
    )
    return header, stored


def _raw(cid: str, data) -> tuple[bytes, bytes]:
    header = ENTRY.pack(ENTRY_MAGIC, CODEC_RAW, 0, 0, 0, len(data), len(data), bytes.fromhex(cid))
    return header, data  # no copy: the pack builder copies it into its window


class EntryError(ValueError):
    pass


def parse_header(header: bytes) -> tuple[int, int, int, str]:
    """Return (codec, raw_nbytes, stored_nbytes, chunk id) or raise EntryError."""
    if len(header) != ENTRY_NBYTES:
        raise EntryError(f"entry header is {len(header)} bytes, expected {ENTRY_NBYTES}")
    magic, codec, _b2, _filt, _lvl, raw_nbytes, stored_nbytes, digest = ENTRY.unpack(header)
    if magic != ENTRY_MAGIC:
        raise EntryError("bad entry magic")
    if codec not in (CODEC_RAW, CODEC_BLOSC2):
        raise EntryError(f"unknown codec {codec}")
    return codec, raw_nbytes, stored_nbytes, digest.hex()


# blosc2's thread pool does not survive fork: a writer forked from a process whose pool has run
# (a restarted trainee decompressed its snapshot) hung in 9 of 40 multi-threaded compressions
# here, even after free_resources() on either side. A process that forks writers decodes on one
# thread (``decode_on_one_thread``), so it never starts the pool; others use blosc2's default.
_decode_threads: dict = {}


def decode_on_one_thread() -> None:
    _decode_threads["nthreads"] = 1


# A blosc2 chunk begins with its own header: version, versionlz, flags, typesize (1 byte each),
# then the decoded length, the block size and the chunk's own length (int32 LE each).
_BLOSC2_HEAD = struct.Struct("<BBBBiii")


def check_stored(codec: int, stored, raw_nbytes: int) -> None:
    """EntryError unless the stored bytes claim what the index and the entry header say: a raw
    chunk is its length, a blosc2 chunk decodes to ``raw_nbytes`` and is as long as it says."""
    if codec == CODEC_RAW:
        if len(stored) != raw_nbytes:
            raise EntryError(f"raw chunk is {len(stored)} bytes, expected {raw_nbytes}")
        return
    if len(stored) < _BLOSC2_HEAD.size:
        raise EntryError(f"a blosc2 chunk of {len(stored)} bytes is shorter than its header")
    *_, nbytes, _blocksize, cbytes = _BLOSC2_HEAD.unpack_from(stored)
    if nbytes != raw_nbytes or cbytes != len(stored):
        raise EntryError(f"the blosc2 chunk says it is {cbytes} bytes decoding to {nbytes}, "
                         f"the entry {len(stored)} decoding to {raw_nbytes}")


def decode_into(codec: int, stored, out: memoryview) -> None:
    """Decode stored bytes into ``out`` (exactly raw_nbytes long)."""
    if codec == CODEC_RAW:
        if len(stored) != len(out):
            raise EntryError(f"raw chunk is {len(stored)} bytes, expected {len(out)}")
        out[:] = stored
        return
    import blosc2

    try:
        n = blosc2.decompress2(stored, dst=out, **_decode_threads)
    except Exception as exc:  # blosc2 raises RuntimeError/ValueError on damaged frames
        raise EntryError(f"blosc2 cannot decode the chunk: {exc}") from exc
    if n is not None and n != len(out):
        raise EntryError(f"chunk decoded to {n} bytes, expected {len(out)}")
