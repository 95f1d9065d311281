"""What the program's code registers with ``atexit``.

CPython keeps the calls ``atexit.register`` was given in C, where no object the program holds
carries them, and no snapshot could read them. A call registered in a step the replay skips (a
CSV logger made at its first record, whose ``close()`` writes the summary line) was gone after a
restart: the run ended without it, and the restart had said "verified"
(``tests/programs/corpus/exit_summary.py``). So boot puts ``register`` and ``unregister`` in
front of atexit's own (``install``), and keeps a list of the calls the program's own code
registers (not a library's, which registers at its import, nor gpusnap's): the payload's
``exits``. The restore merges that list like any other root, and registers the calls the replay
has not (``register_missing``), in the run's order: atexit runs them last first, as it would have.
"""

from __future__ import annotations

import atexit
import sys

from gpusnap import sources
from gpusnap.graph.load import LiveOnly

registered: list[tuple] = []  # (func, args, kwargs) the program's code registered, in order
_register = atexit.register
_unregister = atexit.unregister


def install() -> None:
    """Put ``register``/``unregister`` in front of atexit's (boot, before the program's first line)."""
    atexit.register, atexit.unregister = register, unregister


def register(func, *args, **kwargs):
    _register(func, *args, **kwargs)
    if _by_program():
        registered.append((func, args, kwargs))
    return func


def unregister(func) -> None:
    _unregister(func)
    registered[:] = [entry for entry in registered if entry[0] != func]


register.__doc__, unregister.__doc__ = _register.__doc__, _unregister.__doc__


def _by_program() -> bool:
    """Whether the caller of ``register`` (the frame above this module's) is the program's code."""
    frame = sys._getframe(2)
    name = frame.f_code.co_filename if frame is not None else "<>"
    return not name.startswith("<") and not sources.library_file(sources.real(name))


def register_missing(calls: list) -> list:
    """Register those of the run's ``calls`` (merged: their functions and arguments are the live
    objects) that the replay has not registered. Returns the functions it could not: live-only
    placeholders (a lambda made after setup), which a restore must refuse rather than lose."""
    lost = []
    for func, args, kwargs in calls:
        if any(_same_call(entry, (func, args, kwargs)) for entry in registered):
            continue
        if isinstance(func, LiveOnly):
            lost.append(func)
            continue
        _register(func, *args, **kwargs)
        registered.append((func, args, kwargs))
    return lost


def _same_call(a: tuple, b: tuple) -> bool:
    (fa, aa, ka), (fb, ab, kb) = a, b
    return (fa == fb and len(aa) == len(ab) and ka.keys() == kb.keys()
            and all(_same(x, y) for x, y in zip(aa, ab)) and all(_same(ka[k], kb[k]) for k in ka))


def _same(x, y) -> bool:
    """One object, or equal plain values (no ``==`` on a tensor, which answers elementwise)."""
    return x is y or (type(x) is type(y) and type(x) in (int, float, str, bytes, bool) and x == y)
