"""The writer's parallel pipeline and its choice of encoding per chunk, on real bytes: what the
encoder threads and the flusher write restores exactly, an error in any thread fails the
snapshot and leaves nothing behind, a chunk is compressed only where that pays at the disk's
speed, encoders at idle priority that starve hold nothing back, and a restore's threads read
every buffer back (and name a damaged one)."""

from __future__ import annotations

import json
import mmap
import os
import threading
import time

import numpy as np
import pytest

from gpusnap import atomic
from gpusnap.errors import ChunkCorrupt
from gpusnap.store import RunDir, codec, index, writer
from gpusnap.store.choose import Chooser
from gpusnap.store.codec import ENTRY_NBYTES
from gpusnap.store.fetch import Prefetch
from gpusnap.store.pack import PackBuilder, PackReader, pack_path
from gpusnap.store.pipeline import Pipeline
from store_helpers import IDENTITY

CHUNK = 64 << 10


def weights(seed: int, n: int) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(n) * 0.02).astype(np.float32)


def buffers(seed: int) -> dict[str, np.ndarray]:
    """Weight-like floats (compress ~15%), zeros, a mix, and odd sizes."""
    rng = np.random.default_rng(seed)
    out = {f"w{i}": weights(seed * 100 + i, int(rng.integers(1, 200_000))) for i in range(12)}
    out["zeros"] = np.zeros(300_000, np.float32)
    mixed = weights(seed + 7, 300_000)
    mixed[::2] = 0
    out["mixed"] = mixed
    out["tiny"] = np.arange(3, dtype=np.float32)
    return out


def store(rd: RunDir, snap_id: str, bufs: dict, threads: int, memory=None) -> dict:
    w = rd.begin_snapshot(snap_id, chunk_bytes=CHUNK, pack_bytes=256 << 10,
                          setup=writer.WriterSetup(threads=threads, window_memory=memory))
    recs = {name: w.put_buffer(memoryview(a).cast("B"), dtype="float32", typesize=4) for name, a in bufs.items()}
    w.commit({"buffers": recs})
    return recs


def codecs_by_chunk(rd: RunDir) -> dict[str, int]:
    return {entry[0]: entry[4] for f in (rd.path / "index").glob("*.json")
            for p in json.loads(f.read_text())["packs"].values() for entry in p["chunks"]}


@pytest.mark.parametrize("threads", [1, 4])
def test_what_the_threads_write_restores_exactly_and_every_chunk_is_indexed(tmp_path, threads):
    rd = RunDir.create(tmp_path / "run", IDENTITY)
    for k in range(3):
        bufs = buffers(k)
        recs = store(rd, f"00000{k + 1}", bufs, threads)
        assert rd.verify() == []
        reader = RunDir.open(rd.path)  # its index holds this snapshot's chunks
        for name, a in bufs.items():
            assert reader.read_buffer(recs[name]) == a.tobytes(), name
    indexed = codecs_by_chunk(rd)
    for sid in rd.snapshot_ids():
        for rec in rd.load_manifest(sid)["buffers"].values():
            assert all(cid in indexed for cid, _ in rec["chunks"])


def test_windows_in_memory_allocated_ahead_hold_the_packs_and_stay_its_owners(tmp_path):
    """A stop snapshot's pack windows are pages the trainee allocated ahead (``WriterSetup.window_memory``):
    the packs go to the disk from them and restore exactly, and the memory stays mapped."""
    if atomic.copies_writes(tmp_path):
        pytest.skip(f"{tmp_path} copies every write (tmpfs): packs have no windows there")
    nbytes = writer.windows_nbytes(pack_bytes=256 << 10, chunk_bytes=CHUNK)
    fd = os.memfd_create("windows")
    os.ftruncate(fd, nbytes)
    memory = mmap.mmap(fd, nbytes)
    rd = RunDir.create(tmp_path / "run", IDENTITY)
    bufs = buffers(5)
    recs = store(rd, "000001", bufs, 2, memoryview(memory))
    reader = RunDir.open(rd.path)
    for name, a in bufs.items():
        assert reader.read_buffer(recs[name]) == a.tobytes(), name
    window = nbytes // 2
    packs = [p.read_bytes() for p in (rd.path / "packs").rglob("*.pack")]
    assert len(packs) > 2
    assert any(memory[w : w + len(pack)] == pack for pack in packs for w in (0, window))


def test_floats_that_compress_little_go_raw_on_a_fast_disk_and_zeros_compressed(tmp_path):
    rd = RunDir.create(tmp_path / "run", IDENTITY)
    bufs = {"weights": weights(1, 400_000), "zeros": np.zeros(CHUNK // 4 * 16, np.float32)}  # whole chunks
    recs = store(rd, "000001", bufs, 2)
    kinds = codecs_by_chunk(rd)
    assert {kinds[cid] for cid, _ in recs["weights"]["chunks"]} == {codec.CODEC_RAW}
    assert {kinds[cid] for cid, _ in recs["zeros"]["chunks"]} == {codec.CODEC_BLOSC2}
    stats = rd.load_manifest("000001")["stats"]
    assert stats["codecs"]["raw"] == len(recs["weights"]["chunks"])
    assert stats["codecs"]["lz4"] + stats["codecs"]["zstd"] == len({cid for cid, _ in recs["zeros"]["chunks"]})


def test_the_choice_weighs_disk_time_saved_against_cpu_time_spent():
    w = memoryview(weights(2, 1 << 20)).cast("B")
    zeros = memoryview(np.zeros(1 << 20, np.float32)).cast("B")
    fast = Chooser(threads=2, disk_bps=2e9)
    assert fast.pick(w, "float32", 4) is None  # 15% of 4 MiB at 2 GB/s saves less than compressing costs
    assert fast.pick(zeros, "float32", 4) is not None
    slow = Chooser(threads=2, disk_bps=20e6)  # a network file system
    assert slow.pick(w, "float32", 4).codec in ("lz4", "zstd")
    assert Chooser(threads=2, disk_bps=20e6, forced="none").pick(zeros, "float32", 4) is None
    assert Chooser(threads=2, disk_bps=2e9, forced="zstd").pick(w, "float32", 4).codec == "zstd"
    fast.wrote(64 << 20, 64 / 1024)  # measured: 1 GiB/s
    assert fast.measured_disk and 1.0e9 < fast.disk_bps < 1.1e9


class Starving(Chooser):
    """A host with no idle core, for the pipeline's lowered encoders (those that ran its
    ``worker_init``): each one that takes a chunk gets no further until ``fed`` is set. The
    scheduler cannot be made to do that on cue; the pipeline cannot tell the difference."""

    def __init__(self):
        super().__init__(threads=2, disk_bps=2e9, forced="none")
        self.lowered: set[threading.Thread] = set()
        self.fed = threading.Event()
        self.holding = threading.Semaphore(0)

    def lower(self) -> None:
        self.lowered.add(threading.current_thread())

    def pick(self, data, dtype: str, typesize: int):
        if threading.current_thread() in self.lowered:
            self.holding.release()
            self.fed.wait()
        return super().pick(data, dtype, typesize)


def chunks(seed: int, n: int) -> list[tuple[str, bytes]]:
    rng = np.random.default_rng(seed)
    return [(codec.chunk_id(b), b) for b in (rng.bytes(CHUNK - 97 * i) for i in range(n))]


def read_back(root, packs: dict) -> dict[str, bytes]:
    """Every entry of the packs written, by chunk id; a chunk placed twice fails."""
    reader, out = PackReader(root), {}
    for _, located in packs.values():
        for cid, loc in located:
            assert cid not in out, f"chunk {cid} is in the packs twice"
            header, stored = reader.read_entry(loc)
            raw = bytearray(loc.raw_nbytes)
            codec.decode_into(loc.codec, stored, memoryview(raw))
            out[cid] = bytes(raw)
    reader.close()
    return out


def test_an_encoder_added_later_takes_over_what_starved_encoders_hold_and_the_end_waits_for_none_of_them(tmp_path):
    """Once the pacer adds an encoder at normal priority, the lowered ones take no more chunks,
    the added one encodes again the chunks they hold, ``finish`` returns while they still hold
    them, and their late copies are dropped."""
    starving, data = Starving(), chunks(1, 8)
    p = Pipeline(tmp_path, capacity=1 << 20, flush_at=256 << 10, chooser=starving, threads=2, worker_init=starving.lower)
    for cid, b in data[:4]:
        p.submit(cid, b, "bytes", 1)
    assert starving.holding.acquire(timeout=10) and starving.holding.acquire(timeout=10)  # both hold a chunk
    assert p.add_worker(lambda: False)
    for cid, b in data[4:]:
        p.submit(cid, b, "bytes", 1)
    packs = p.finish()
    assert all(t.is_alive() for t in starving.lowered)  # still starved: finish did not wait for them
    assert read_back(tmp_path, packs) == dict(data)
    written = sorted(q.name for q in tmp_path.rglob("*.pack"))
    starving.fed.set()
    for t in starving.lowered:
        t.join(timeout=10)
        assert not t.is_alive()
    assert sorted(q.name for q in tmp_path.rglob("*.pack")) == written and p.packs == packs  # late copies dropped
    p.release()


class CopyPlacedWhileWaiting(Pipeline):
    """Places ``other`` (another copy of the same chunk) from another thread while the copy being
    claimed is in ``_builder_for``, which lets go of the lock while it waits for a free window:
    the interleaving that, in a CI run, left a writer waiting forever for a chunk counted placed
    twice. The scheduler cannot be made to do that on cue."""

    other = None

    def _builder_for(self, stored_nbytes):
        other, self.other = self.other, None
        if other is not None:
            placer = threading.Thread(target=self._place, args=(other,))
            self._cond.release()
            try:
                placer.start()
                placer.join(timeout=10)
            finally:
                self._cond.acquire()
        return super()._builder_for(stored_nbytes)


def test_a_copy_of_a_chunk_placed_while_another_waits_for_a_window_is_the_only_one(tmp_path):
    never = threading.Event()
    p = CopyPlacedWhileWaiting(tmp_path, capacity=1 << 20, flush_at=256 << 10, chooser=Chooser(threads=1, disk_bps=2e9, forced="none"),
                               threads=1, worker_init=never.wait)  # its one encoder takes nothing
    (cid, data), = chunks(3, 1)
    p.submit(cid, data, "bytes", 1)
    with p._cond:
        task = p._tasks.popleft()
    first, second = p._encode(task), p._encode(task)  # two encodings, as a chunk taken over has
    p.other = second
    p._place(first)
    assert p._in_hand == 0
    packs = p.finish()
    assert read_back(tmp_path, packs) == {cid: data}  # once
    never.set()
    p.release()


def test_lowered_encoders_leave_every_copy_into_a_window_to_threads_at_the_callers_priority(tmp_path, monkeypatch):
    """A lowered encoder preempted in the middle of a copy held back the flush of its window
    (and, under the lock, every thread): it only encodes, and the others place its entries."""
    starving, data = Starving(), chunks(2, 12)
    starving.fed.set()  # slow, not stopped
    copiers, fill = set(), PackBuilder.fill

    def watched(self, offset, header, stored):
        copiers.add(threading.current_thread())
        time.sleep(0.001)
        fill(self, offset, header, stored)

    monkeypatch.setattr(PackBuilder, "fill", watched)
    p = Pipeline(tmp_path, capacity=1 << 20, flush_at=256 << 10, chooser=starving, threads=2, worker_init=starving.lower)
    if p.windows == "none":
        pytest.skip(f"{tmp_path} copies every write (tmpfs): packs have no windows there")
    for cid, b in data:
        p.submit(cid, b, "bytes", 1)
    packs = p.finish()
    assert read_back(tmp_path, packs) == dict(data)
    assert len(starving.lowered) == 2 and copiers and not copiers & starving.lowered
    p.release()


def test_an_error_in_an_encoder_thread_fails_the_snapshot_and_leaves_nothing(tmp_path, monkeypatch):
    rd = RunDir.create(tmp_path / "run", IDENTITY)
    store(rd, "000001", buffers(0), 2)
    before = sorted(p for p in rd.path.rglob("*") if p.is_file())
    real, calls = codec.compress, []

    def failing(data, *args, **kwargs):
        calls.append(len(data))
        if len(calls) == 5:
            raise MemoryError("no memory for the compressed copy")
        return real(data, *args, **kwargs)

    monkeypatch.setattr(codec, "compress", failing)
    with pytest.raises(MemoryError, match="no memory for the compressed copy"):
        store(rd, "000002", {f"z{i}": np.full(100_000, i, np.float32) for i in range(1, 20)}, 2)
    assert sorted(p for p in rd.path.rglob("*") if p.is_file()) == before
    assert rd.snapshot_ids() == ["000001"] and rd.verify() == []


def test_a_restore_reads_every_buffer_on_threads_and_names_a_damaged_one(tmp_path):
    rd = RunDir.create(tmp_path / "run", IDENTITY)
    bufs = buffers(3)
    recs = store(rd, "000001", bufs, 2)
    for name in recs:
        recs[name]["path"] = f"frame[0].locals.{name}"
    with Prefetch(rd, recs, ["mixed"], snapshot="000001", threads=3) as fetched:
        for name, a in bufs.items():
            assert fetched.get(name) == a.tobytes(), name
    victim = recs["w3"]["chunks"][0][0]
    loc = index.load(rd.path).chunks[victim]
    with open(pack_path(rd.path, loc.pack), "r+b") as f:
        f.seek(loc.offset + ENTRY_NBYTES + loc.stored_nbytes // 2)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0xFF]))
    with Prefetch(RunDir.open(rd.path), recs, snapshot="000001", threads=3) as fetched:
        assert fetched.get("w4") == bufs["w4"].tobytes()  # the others read as ever
        with pytest.raises(ChunkCorrupt, match=r"of frame\[0\]\.locals\.w3 \(snapshot 000001\)"):
            fetched.get("w3")
