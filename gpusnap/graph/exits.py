"""What the program's code registers with ``atexit`` in its steps.

CPython keeps the calls ``atexit.register`` was given in C, where no object the program holds
carries them, and no snapshot could read them. A call registered in a step the replay skips (a
CSV logger made at its first record, whose ``close()`` writes the summary line) was gone after a
restart: the run ended without it, and the restart had said "verified"
(``tests/programs/corpus/exit_summary.py``). So the capture agent puts ``register`` and
``unregister`` in front of atexit's own (``install``), and keeps the calls the program's own code
registers (not a library's, which registers at its import, nor gpusnap's) while a loop of the
program runs, with where each loop stood: the payload's ``exits``. What setup registered, the
replay registers again, and so does the body of a loop iteration the replay runs again up to the
snapshot's inner loop (``_replayed``). The restore merges the rest like any other root and
registers the calls the replay has not (``register_missing``), in the run's order: atexit calls
them last first, as it would have.
"""

from __future__ import annotations

import atexit
import sys

from gpusnap import sources
from gpusnap.graph.load import LiveOnly, Unbuilt
from gpusnap.instrument import loops

# (func, args, kwargs, where the loops stood) of what the program's code registered in a step, in order
registered: list[tuple] = []
_register = atexit.register
_unregister = atexit.unregister


def install() -> None:
    """Put ``register``/``unregister`` in front of atexit's (before the program's first line)."""
    atexit.register, atexit.unregister = register, unregister


def register(func, *args, **kwargs):
    _register(func, *args, **kwargs)
    if loops.ACTIVE and _by_program():
        registered.append((func, args, kwargs, _loops_now()))
    return func


def unregister(func) -> None:
    _unregister(func)
    registered[:] = [entry for entry in registered if entry[0] != func]


register.__doc__, unregister.__doc__ = _register.__doc__, _unregister.__doc__


def _loops_now() -> tuple:
    # (not the file's path: a restart on another machine may find the program elsewhere)
    return tuple((loop.frame.f_code.co_qualname, loop.loop_id, loop.index) for loop in loops.ACTIVE)


def _by_program() -> bool:
    """Whether the caller of ``register`` (the frame above this module's) is the program's code."""
    try:
        name = sys._getframe(2).f_code.co_filename
    except ValueError:  # called from C, no frame of Python's above
        return False
    return not sources.library_code(name)


def register_missing(calls: list) -> list:
    """Register those of the run's ``calls`` (merged: their functions and arguments are the live
    objects) that the replay has not registered. Returns the functions it could not: those the
    snapshot could not hold (a lambda made in a step, a method of a live-only object), which a
    restore must refuse rather than lose."""
    now = _loops_now()
    lost = []
    for func, args, kwargs, stood in calls:
        if _replayed(stood, now) or any(_same_call(entry, func, args, kwargs) for entry in registered):
            continue
        if isinstance(func, (LiveOnly, Unbuilt)):
            lost.append(func)
            continue
        _register(func, *args, **kwargs)
        registered.append((func, args, kwargs, stood))
    return lost


def _replayed(stood: tuple, now: tuple) -> bool:
    """Registered in the body of an iteration that encloses the snapshot's loop, before it: the
    replay runs that body again up to there (the loops ``now`` stand where the snapshot's stood)."""
    return len(stood) < len(now) and now[: len(stood)] == stood


def _same_call(entry: tuple, func, args, kwargs) -> bool:
    f, a, k, _ = entry
    return (f == func and len(a) == len(args) and k.keys() == kwargs.keys()
            and all(_same(x, y) for x, y in zip(a, args)) and all(_same(k[n], kwargs[n]) for n in k))


def _same(x, y) -> bool:
    """One object, or equal plain values (no ``==`` on a tensor, which answers elementwise)."""
    return x is y or (type(x) is type(y) and type(x) in (int, float, str, bytes, bool) and x == y)
