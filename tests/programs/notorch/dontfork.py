"""Host memory the program marked do-not-fork (MADV_DONTFORK, as CUDA may mark page-locked
memory) holding a numpy array, beside ordinary state: OUT STEPS [--deep]. The array is a module
global, or with --deep an attribute of an object (deeper than the stall looks for it)."""

import ctypes
import mmap
import sys

import numpy as np
from pace import finish, progress

MADV_DONTFORK = 10


class Holder:
    def __init__(self, array):
        self.array = array


region = mmap.mmap(-1, 1 << 20)
pinned = np.frombuffer(region, dtype=np.float32)
libc = ctypes.CDLL(None, use_errno=True)
libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
assert libc.madvise(pinned.ctypes.data, len(region), MADV_DONTFORK) == 0, ctypes.get_errno()
holder = Holder(pinned) if "--deep" in sys.argv else None
if holder is not None:
    pinned = None

def update(array, step: int):
    array[:4] += 1
    array[4 + step % 1000] = step
    return array[:4].copy()


total = np.zeros(4)
for step in range(int(sys.argv[2])):
    total += update(holder.array if pinned is None else pinned, step)
    progress(step + 1)
finish(total=total, head=(holder.array if pinned is None else pinned)[:1100])
