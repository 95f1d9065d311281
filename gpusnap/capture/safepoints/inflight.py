"""The program's futures still running: a snapshot waits for them, within a bound.

A script evaluates or saves on a pool's thread (``pool.submit(evaluate, copy.deepcopy(model))``,
torch.distributed.checkpoint's ``async_save``) and keeps the future until it needs the result.
Taken while one runs, a snapshot holds a future that no thread will finish after a restart: the
program's first use of it is the restart's refusal (frameworks/futures.py), although the program
was valid and its futures finish within a few steps. So a snapshot asked for while a future of the
program's executors runs waits for a boundary where none does, training on, for half of
``knobs.FUTURES_WAIT_S``; then a boundary waits for them (a prefetch always has one running, which
ends soon) for the rest. One still running after that is taken as it is, and said.

Tracked: the futures ``ThreadPoolExecutor.submit`` and ``ProcessPoolExecutor.submit`` return in
the trainee, weakly (a future the program dropped is no concern of a restart's).
"""

from __future__ import annotations

import concurrent.futures
import sys
import time
import weakref

from gpusnap import knobs

_futures: weakref.WeakSet = weakref.WeakSet()
_since: float | None = None  # when a snapshot first found futures running, while it waits
_installed = False


def install() -> None:
    global _installed
    if _installed:
        return
    _installed = True
    for executor in (concurrent.futures.ThreadPoolExecutor, concurrent.futures.ProcessPoolExecutor):
        executor.submit = _tracking(executor.submit)


def _tracking(submit):
    def tracked_submit(self, fn, /, *args, **kwargs):
        future = submit(self, fn, *args, **kwargs)
        _futures.add(future)
        return future

    tracked_submit.__wrapped__ = submit
    return tracked_submit


def running() -> list:
    return [f for f in list(_futures) if not f.done()]


def holds_back() -> bool:
    """At a safe point where a snapshot is due: True to wait for a later boundary."""
    global _since
    pending = running()
    if not pending:
        _since = None
        return False
    now = time.monotonic()
    if _since is None:
        _since = now
        _say_once(pending)
    waited = now - _since
    if waited < knobs.FUTURES_WAIT_S / 2:
        return True
    concurrent.futures.wait(pending, timeout=max(0.0, knobs.FUTURES_WAIT_S - waited))
    _since = None
    still = running()
    if still:
        print(f"gpusnap: warning: {_count(still)} still running after {knobs.FUTURES_WAIT_S:g} s go into the snapshot "
              "as they are: a restart from it refuses at their first use (GPUSNAP_FUTURES_WAIT_S waits longer)",
              file=sys.stderr, flush=True)
    return False


_said = False


def _say_once(pending: list) -> None:
    global _said
    if not _said:
        _said = True
        print(f"gpusnap: the snapshot waits for {_count(pending)} of the program's still running (a background save "
              f"or evaluation), at most {knobs.FUTURES_WAIT_S:g} s: a restart could not wait on "
              f"{'it' if len(pending) == 1 else 'them'} (said once)", file=sys.stderr, flush=True)


def _count(futures: list) -> str:
    return "1 future" if len(futures) == 1 else f"{len(futures)} futures"
