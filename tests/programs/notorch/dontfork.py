"""Host memory the program marked do-not-fork (MADV_DONTFORK, as CUDA may mark page-locked
memory) held by a numpy array in a local, beside ordinary state: OUT STEPS."""

import ctypes
import mmap
import sys

import numpy as np
from pace import finish, progress

MADV_DONTFORK = 10

region = mmap.mmap(-1, 1 << 20)
pinned = np.frombuffer(region, dtype=np.float32)
libc = ctypes.CDLL(None, use_errno=True)
libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
assert libc.madvise(pinned.ctypes.data, len(region), MADV_DONTFORK) == 0, ctypes.get_errno()

total = np.zeros(4)
for step in range(int(sys.argv[2])):
    pinned[:4] += 1
    total += pinned[:4]
    progress(step + 1)
finish(total=total)
