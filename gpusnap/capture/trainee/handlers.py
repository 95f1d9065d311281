"""The program's own handlers for the signals gpusnap answers (SIGTERM, the snapshot signal).

A script written for a cluster handles preemption itself: a SIGTERM handler (or one for SLURM's
``--signal=USR1@90``) sets a flag, and the loop, seeing it, saves a checkpoint of its own and
exits. Installed over gpusnap's handler, it left gpusnap deaf to that signal; and a signal sent
to the whole job reached both, so the flag went into the stop snapshot: every restart from it
stopped at the flag again and exited 0, verified, without finishing the run
(``tests/programs/corpus/graceful_exit.py``).

So the program's ``signal.signal`` for these signals records its handler and leaves gpusnap's in
place; ``signal.getsignal`` answers with the program's. gpusnap's handler asks for the snapshot
and the agent runs the program's once the snapshot has forked (``deliver``): the state it holds
saw no signal. After a stop snapshot it runs once the witness is recorded, just before the
process ends: a handler that stops the program at once (Lightning's raises at its next batch)
left no witness, and the restart unverified. A distributed job's stop runs none (a rank's handler
may talk to the others, as Lightning's broadcasts). Where no loop runs, no safe point will come
soon, and the program's runs at once. A stop snapshot whose program then stops on its own,
through the handler it was given, ends the process with EXIT_PREEMPTED all the same
(``stopped_by_program``): the run did not finish. A
program's handler that calls the one it found installed (Lightning composes its SIGTERM handler
with the previous one, which is gpusnap's) reaches gpusnap's while it is delivered: that call
asks for nothing (``delivering``), or each delivery would ask for another snapshot, and another
delivery.
"""

from __future__ import annotations

import os
import signal
import threading

from gpusnap.instrument import loops

_answered: set[int] = set()  # the signals gpusnap's own handlers answer in this process
_program: dict[int, object] = {}  # signal -> the handler the program installed for it
_due: list[int] = []  # signals heard whose program handler waits for the snapshot's fork
_pid: int | None = None
_real_signal = signal.signal
_real_getsignal = signal.getsignal
stopped_by_program = False  # the program's SIGTERM handler ran after a stop snapshot
_delivering = False  # a program's handler runs now (``deliver``)


def install(signums) -> None:
    global _pid
    _answered.update(signums)
    _pid = os.getpid()
    signal.signal = _signal
    signal.getsignal = _getsignal


def _ours(signalnum) -> bool:
    """A signal gpusnap answers, in the trainee's main thread (not a forked DataLoader worker's)."""
    return signalnum in _answered and os.getpid() == _pid and threading.current_thread() is threading.main_thread()


def _signal(signalnum, handler):
    if not _ours(signalnum):
        return _real_signal(signalnum, handler)
    previous = _program.get(signalnum, signal.SIG_DFL)
    _program[signalnum] = handler
    return previous


def _getsignal(signalnum):
    if _ours(signalnum) and signalnum in _program:
        return _program[signalnum]
    return _real_getsignal(signalnum)


def delivering() -> bool:
    """Whether gpusnap's handler is called by a program's that ``deliver`` runs: it asks for nothing."""
    return _delivering


def heard(signum: int, frame) -> None:
    """In gpusnap's handler, after its request: the program's handler, if any, runs after the
    snapshot, or now where no loop runs."""
    if not callable(_program.get(signum)):
        return  # none, SIG_DFL or SIG_IGN: gpusnap's stop is the termination
    if loops.ACTIVE:
        _due.append(signum)
    else:
        _run(signum, frame)


def _run(signum: int, frame) -> None:
    global _delivering
    _delivering = True
    try:
        _program[signum](signum, frame)
    finally:
        _delivering = False


def as_the_program_had_them() -> None:
    """In a process the program started (a Pool's worker, forked): each signal gpusnap answers
    gets the handler the program gave it, else the one it would have without gpusnap: SIGTERM's
    default action, and the snapshot signal ignored (asked of gpusnap, and sent to a whole job a
    plain run would not have heard it). gpusnap's handler asked the trainee for a snapshot and
    kept the process alive: a Pool's terminate() signals workers that wait on the lock it holds,
    and joined one that never ended (tests/programs/corpus/pool_augment.py --per-epoch pool)."""
    for signum in _answered:
        handler = _program.get(signum)
        if handler is None:
            handler = signal.SIG_DFL if signum == signal.SIGTERM else signal.SIG_IGN
        try:
            _real_signal(signum, handler)
        except (OSError, TypeError, ValueError):  # not the main thread of the child; a handler of C's
            pass


def due() -> bool:
    return bool(_due)


def deliver(frame, stop: bool) -> None:
    """Run the program's handlers of the signals heard (the snapshot they asked for is taken,
    or will not be: ``stop`` after a stop snapshot's fork)."""
    global stopped_by_program
    while _due:
        signum = _due.pop(0)
        if callable(_program.get(signum)):
            stopped_by_program = stopped_by_program or (stop and signum == signal.SIGTERM)
            _run(signum, frame)
