"""Packs go to the disk with O_DIRECT from a page-aligned window, tails and refusing file
systems through ordinary writes; a run directory on tmpfs (or on a file system that refuses
O_DIRECT), where every write is a copy, gets its packs from where each entry lies, without a
window. The bytes on disk are the same either way."""

from __future__ import annotations

import errno
import mmap
import os
import pathlib
import shutil
import tempfile
import threading

import pytest

from gpusnap import atomic
from gpusnap.store import RunDir, backend, codec
from gpusnap.store.pack import PackBuilder, name_of, pack_key, pack_path, scan
from store_helpers import IDENTITY, payload, snap


def _window(nbytes: int, seed: int) -> mmap.mmap:
    window = mmap.mmap(-1, max(nbytes, 1))
    window[:nbytes] = (bytes(range(256)) * (nbytes // 256 + 1))[seed % 256 : seed % 256 + nbytes]
    return window


def _recording_open(monkeypatch, refuse_direct: bool = False) -> list[int]:
    flags_seen = []
    real = atomic._open

    def recording(path, flags, mode=0o777):
        flags_seen.append(flags)
        if refuse_direct and flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
        return real(path, flags, mode)

    monkeypatch.setattr(atomic, "_open", recording)
    return flags_seen


@pytest.mark.parametrize("nbytes", [4096, 4097, 3 * 4096 + 5, (1 << 20) + 123])
def test_direct_write_lands_every_byte(tmp_path, monkeypatch, nbytes):
    flags_seen = _recording_open(monkeypatch)
    window = _window(nbytes, nbytes)
    with memoryview(window) as view, view[:nbytes] as data:
        assert atomic.write_file(tmp_path / "p.pack", [data], direct=True) == nbytes
        expected = bytes(data)
    assert (tmp_path / "p.pack").read_bytes() == expected
    assert flags_seen[0] & os.O_DIRECT
    assert [p.name for p in tmp_path.iterdir()] == ["p.pack"]  # no temporary left


def test_what_cannot_go_direct_is_written_plainly(tmp_path, monkeypatch):
    flags_seen = _recording_open(monkeypatch)
    small = _window(100, 1)
    with memoryview(small) as view, view[:100] as data:
        atomic.write_file(tmp_path / "small", [data], direct=True)  # under one block
    atomic.write_file(tmp_path / "ro", [b"x" * 10_000], direct=True)  # read-only bytes
    window = _window(8192, 2)
    with memoryview(window) as view, view[1:8192] as data:
        atomic.write_file(tmp_path / "unaligned", [data], direct=True)
        unaligned = bytes(data)
    assert not any(f & os.O_DIRECT for f in flags_seen)
    assert (tmp_path / "small").read_bytes() == small[:100]
    assert (tmp_path / "ro").read_bytes() == b"x" * 10_000
    assert (tmp_path / "unaligned").read_bytes() == unaligned


def test_a_file_system_that_refuses_o_direct_gets_ordinary_writes(tmp_path, monkeypatch):
    flags_seen = _recording_open(monkeypatch, refuse_direct=True)
    window = _window(5 * 4096 + 7, 3)
    with memoryview(window) as view, view[: 5 * 4096 + 7] as data:
        atomic.write_file(tmp_path / "p.pack", [data], direct=True)
        expected = bytes(data)
    assert (tmp_path / "p.pack").read_bytes() == expected
    assert flags_seen[0] & os.O_DIRECT and not flags_seen[1] & os.O_DIRECT


def test_no_space_during_a_direct_write_leaves_nothing(tmp_path, monkeypatch):
    def full(fd, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(atomic, "_write", full)
    window = _window(3 * 4096, 4)
    with memoryview(window) as view, view[: 3 * 4096] as data:
        with pytest.raises(atomic.NoSpace):
            atomic.write_file(tmp_path / "p.pack", [data], direct=True)
    assert list(tmp_path.iterdir()) == []


def _tmpfs_dir() -> pathlib.Path:
    """A scratch directory on tmpfs (/dev/shm), whose writes copy into memory whatever they ask."""
    shm = pathlib.Path("/dev/shm")
    if not shm.is_dir() or not os.access(shm, os.W_OK):
        pytest.skip("no writable /dev/shm")
    return pathlib.Path(tempfile.mkdtemp(prefix="gpusnap-test-", dir=shm))


def named_by_contents(root, pack_id: str) -> bool:
    """The pack's name is the digest of its table of contents, as read back from its bytes."""
    return name_of(scan(root, pack_key(pack_id), digests=True)) == pack_id


def test_windowed_and_unwindowed_packs_hold_the_same_bytes_under_the_same_name(tmp_path):
    entries = []
    for k, nbytes in enumerate([5000, 70_000, 4096, 1]):
        data = bytes((k * 7 + i) % 251 for i in range(nbytes))
        cid = codec.chunk_id(data)
        entries.append((cid, *codec.encode(cid, data, "uint8", 1, "zstd" if k % 2 else "none"), nbytes))
    written = {}
    for windowed in (True, False):
        root = tmp_path / str(windowed)
        builder = PackBuilder(1 << 20, windowed=windowed)
        for cid, header, stored, nbytes in entries:
            builder.add(cid, header, stored, nbytes)
        pack_id, nbytes, located = builder.flush(root)
        data = pack_path(root, pack_id).read_bytes()
        assert len(data) == nbytes and named_by_contents(root, pack_id)
        written[windowed] = (pack_id, data, located)
        builder.close()
    assert written[True] == written[False]


def test_entries_copied_into_the_window_in_any_order_by_many_threads_make_the_same_pack(tmp_path):
    """The writer's threads claim each entry's place in turn and copy it in whatever order they
    get to: the pack is the one a single thread adding them in turn writes, under the same name."""
    entries = []
    for k in range(24):
        data = os.urandom(1000 + 37 * k) if k % 3 else bytes(5000)
        cid = codec.chunk_id(data)
        entries.append((cid, *codec.encode(cid, data, "uint8", 1, "lz4" if k % 2 else "none"), len(data)))
    one = PackBuilder(1 << 20)
    for cid, header, stored, nbytes in entries:
        one.add(cid, header, stored, nbytes)
    many = PackBuilder(1 << 20)
    claimed = [(many.claim(cid, header, stored, nbytes), header, stored) for cid, header, stored, nbytes in entries]
    threads = [threading.Thread(target=many.fill, args=c) for c in reversed(claimed)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    (tmp_path / "one").mkdir()
    (tmp_path / "many").mkdir()
    a, b = one.flush(tmp_path / "one"), many.flush(tmp_path / "many")
    assert a == b and named_by_contents(tmp_path / "many", b[0])
    assert pack_path(tmp_path / "one", a[0]).read_bytes() == pack_path(tmp_path / "many", b[0]).read_bytes()
    one.close()
    many.close()


def test_a_run_directory_on_tmpfs_is_written_from_where_the_bytes_lie(tmp_path):
    if not atomic.copies_writes(tmp_path):
        assert not backend.of(tmp_path).copies_on_put("packs")  # a disk: O_DIRECT from a window
    where = _tmpfs_dir()
    try:
        rd = RunDir.create(where / "run", IDENTITY)
        assert rd.backend.copies_on_put("packs")
        buffers = {"noise": payload(1, 900_000), "zeros": bytes(300_000), "small": b"x" * 10}
        sid, recs = snap(rd, buffers)
        assert rd.verify() == []
        for name, data in buffers.items():
            assert bytes(rd.read_buffer(recs[name])) == data
        packs = list((where / "run" / "packs").rglob("*.pack"))
        assert len(packs) > 1  # several packs of SMALL's size, each named by its bytes
        assert all(named_by_contents(where / "run", p.stem) for p in packs)
        assert not [p for p in (where / "run").rglob("*") if atomic.is_temp(p.name)]  # no probe left
    finally:
        shutil.rmtree(where)
