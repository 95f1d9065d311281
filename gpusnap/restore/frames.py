"""Writing the locals of a running frame (one that is up the stack, not finished).

Python >= 3.13 gives ``frame.f_locals`` as a write-through proxy (PEP 667). On 3.11 and 3.12
``f_locals`` is a dict snapshot of the fast locals; ``PyFrame_LocalsToFast`` copies it back,
cells and free variables included: the same call debuggers use to edit a paused frame.
"""

from __future__ import annotations

import ctypes
import sys

if sys.version_info >= (3, 13):

    def write_locals(frame, values: dict) -> None:
        proxy = frame.f_locals
        for name, value in values.items():
            proxy[name] = value

else:
    _locals_to_fast = ctypes.pythonapi.PyFrame_LocalsToFast
    _locals_to_fast.argtypes = [ctypes.py_object, ctypes.c_int]
    _locals_to_fast.restype = None

    def write_locals(frame, values: dict) -> None:
        snapshot = frame.f_locals  # re-reads the fast locals into the frame's dict
        snapshot.update(values)
        _locals_to_fast(frame, 0)
