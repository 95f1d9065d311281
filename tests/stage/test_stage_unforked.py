"""Host memory fork does not pass on: found in the frames' locals, copied into the arena by the
trainee, read back by a forked writer from there."""

from __future__ import annotations

import ctypes
import mmap
import sys

import numpy as np
import torch

from device_helpers import in_child
from gpusnap.stage import sources, unforked
from gpusnap.stage.arena import trainee_arena
from gpusnap.rawmem import MADV_DONTFORK, madvise


def dontfork_array(nbytes: int = 1 << 16):
    region = mmap.mmap(-1, nbytes)
    array = np.frombuffer(region, dtype=np.uint8)
    madvise(array.ctypes.data, nbytes, MADV_DONTFORK)
    return region, array


def test_the_mappings_marked_do_not_fork_are_found_and_what_the_locals_hold_of_them():
    region, pinned = dontfork_array()
    address = pinned.ctypes.data
    assert any(lo <= address < hi for lo, hi in unforked.dontfork_ranges(refresh=True))
    ordinary = np.zeros(16)
    tensor_view = torch.from_numpy(pinned[1024:2048])  # a CPU tensor over that memory

    def frame_holding(batch):
        return sys._getframe()

    ranges = unforked.dontfork_ranges()
    frame = frame_holding({"inputs": [(ordinary, pinned[:16])], "t": tensor_view})
    found = unforked.held_by([frame], ranges)
    assert (address, len(region)) in found  # the array's base, whole
    assert (address + 1024, 1024) in found  # the tensor's storage
    assert len(found) == 2

    deep = frame_holding([[[[[pinned]]]]])  # deeper than the stall looks
    long = frame_holding([0] * 1000 + [pinned])  # a long list is not looked into
    assert unforked.held_by([deep], ranges) == [] and unforked.held_by([long], ranges) == []


def test_a_forked_writer_reads_the_staged_copy(tmp_path):
    region, pinned = dontfork_array()
    pinned[:] = np.arange(len(pinned), dtype=np.uint64).astype(np.uint8)
    expected = pinned.tobytes()
    unforked.dontfork_ranges(refresh=True)  # mapped after this process first looked

    def frame_holding(batch):
        return sys._getframe()

    # As the stall does: the device's ranges first, which lists the open cuda.core Buffers afresh.
    # Without it, those another test of this process left (since closed) were copied too: a
    # second copy, or a segmentation fault in memmove where their memory had gone.
    sources.device_ranges()
    staged = unforked.stage_unforked([frame_holding((pinned,))])
    assert staged is not None and staged.nbytes == len(region)
    address = pinned.ctypes.data
    assert in_child(lambda: bytes(staged.view(address + 100, 200)) == expected[100:300]) == {"ok": True}
    assert in_child(lambda: ctypes.string_at(address, 1)) == {"signal": 11}  # not there in a child
    trainee_arena().discard()  # the snapshot is not taken: its region goes back


def test_a_writer_trusts_only_the_memory_fork_passed_on():
    """Do-not-fork memory leaves a hole in the writer's address space, and what the writer maps
    later may land there: the writer's map is the one it froze at fork, so that address stays
    unmapped to it. A process pickling in place (not frozen) reads its map again on a miss."""
    from gpusnap import rawmem

    region, pinned = dontfork_array()
    hole = pinned.ctypes.data
    assert rawmem.mapped(hole, 4096)

    def writer():
        rawmem.freeze_maps()
        gone = rawmem.mapped(hole, 4096)
        # Map memory of its own, at the hole's address itself (as the kernel may choose).
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
        placed = libc.mmap(hole, 4096, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | 0x100000, -1, 0)
        return [gone, placed == hole, rawmem.mapped(hole, 4096)]  # 0x100000: MAP_FIXED_NOREPLACE

    assert in_child(writer) == {"ok": [False, True, False]}
    fresh = mmap.mmap(-1, 1 << 16)
    assert rawmem.mapped(np.frombuffer(fresh, dtype=np.uint8).ctypes.data, 1 << 16)
    del pinned
    region.close()
