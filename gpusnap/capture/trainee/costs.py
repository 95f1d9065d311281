"""What each snapshot costs training, measured from the program's own iteration times.

A snapshot slows training in more ways than its stall: the writer runs beside the trainee
(taking CPU from its threads on a busy host, and memory bandwidth), every page the trainee
writes while the writer still maps it is a copy-on-write fault, and after the writer the
trainee re-faults pages and readies the next drain (``stage.prepare``). Only the stall can be
read off the writer; all of it shows in how long the program's iterations take. So the trainee
times every iteration of its step loop (at the first optimizer step of each, where it counts
iterations) and, for each snapshot, compares the iterations of its *window* (from the one that
holds the fork until ``TAIL_ITERATIONS`` iterations and ``TAIL_S`` seconds after the writer
ended, and the preparation of the next drain is done) with the mean of the *clean* iterations (no window, no warm-up) on either side of it,
``BASELINE_EACH_SIDE`` before and as many after: a machine whose load drifts makes the
iterations before a window slower or faster than those in it, and the ones after cancel that::

    cost_s = sum(window iteration times) - len(window) * mean(clean iteration times)

A snapshot taken outside the step loop (in setup or an evaluation loop) leaves the iteration
that holds it out (its length says nothing about the snapshot) and counts its stall instead.
Without a baseline (a program without torch.optim, or no clean iterations yet) the cost is the
stall plus the writer's CPU time: where training keeps every core busy, each writer CPU-second
is training's.

Each snapshot's cost goes to the supervisor as one ``cost`` event (``launch.schedule`` turns
costs into the interval of ``--every auto``), and once, when a baseline first exists, a
``steps`` event says that training runs and how long an iteration takes. The bookkeeping costs
one ``perf_counter()`` and a few list operations per iteration.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections import deque

from gpusnap import stage
from gpusnap.capture.trainee import control

# The first iterations of a run (and of a restarted one) pay for first touches of memory and
# warm caches: not what an iteration costs.
WARMUP_ITERATIONS = 5
# The baseline is the mean of this many clean iterations before the window and as many after
# it: recent enough to follow a machine whose load changes, many enough that one slow iteration
# does not swing it. A window whose next snapshot comes sooner settles with fewer after it.
BASELINE_EACH_SIDE = 32
# The window stays open this long after the writer ends, and until the preparation of the next
# drain (``stage.prepare``, a background thread at idle priority) is done: re-faults of pages
# the writer shared, and that preparation, land there. No longer: every iteration in the
# window adds its own noise to the cost.
TAIL_ITERATIONS = 3
TAIL_S = 0.25
# A window whose iterations stop coming (training ended, a long evaluation) is closed, or its
# cost reported, this long after its writer ended, with what it has.
EXPIRE_S = 20.0
_BASELINE_MIN = 3  # clean iterations needed for a baseline


class _Window:
    __slots__ = ("snap_id", "stall_s", "at_step_loop", "opened_t", "durations", "end_t", "after_end",
                 "writer_cpu_s", "baseline", "before_n", "closed", "closed_t", "reported")

    def __init__(self, snap_id: str, stall_s: float, at_step_loop: bool, baseline: list[float]):
        self.snap_id, self.stall_s, self.at_step_loop = snap_id, stall_s, at_step_loop
        self.opened_t = time.perf_counter()
        self.durations: list[float] = []
        self.end_t: float | None = None  # when the writer was reaped
        self.after_end = 0  # iterations started after that
        self.writer_cpu_s: float | None = None
        self.baseline = baseline  # the clean iterations before it, then those after it
        self.before_n = 0  # how many came before it (as many after it settle its cost)
        self.closed = False  # no iteration is added to it any more
        self.closed_t: float | None = None
        self.reported = False


_last_t: float | None = None  # perf_counter() at the last iteration's start
_skip_next = False  # the next duration spans a snapshot outside the step loop: not counted
_seen = 0
_clean: deque = deque(maxlen=BASELINE_EACH_SIDE)
_window: _Window | None = None
_settling: _Window | None = None  # closed, waiting for clean iterations after it
_lock = threading.Lock()  # the window is closed from the main thread or from a timer
_announced = False


def step_s() -> float | None:
    """The median of the recent clean iterations' durations (None before the warm-up is over)."""
    recent = list(_clean)
    return statistics.median(recent) if recent else None


def iteration() -> None:
    """An iteration of the step loop starts (its first optimizer step)."""
    global _last_t, _seen, _skip_next, _announced
    now = time.perf_counter()
    last, _last_t = _last_t, now
    _seen += 1
    if last is None:
        return
    duration = now - last
    window = _window
    if window is None:
        if _seen > WARMUP_ITERATIONS:
            _clean.append(duration)
            if not _announced and len(_clean) >= _BASELINE_MIN:
                _announced = True
                control.emit("steps", step_s=round(statistics.fmean(_clean), 6))
            settling = _settling
            if settling is not None:
                settling.baseline.append(duration)
                if len(settling.baseline) >= 2 * settling.before_n:
                    with _lock:
                        _report(settling)
        return
    with _lock:
        if window.closed:
            return
        if _skip_next:
            _skip_next = False
        else:
            window.durations.append(duration)
        if window.end_t is not None and last >= window.end_t:
            window.after_end += 1
            if window.after_end >= TAIL_ITERATIONS and now - window.end_t >= TAIL_S and not stage.preparing():
                _close(window, settle=True)


def forked(snap_id: str, stall_s: float, at_step_loop: bool) -> None:
    """The writer of ``snap_id`` was forked, ``stall_s`` after the safe point was reached; the
    iteration in progress holds the stall. ``at_step_loop``: the safe point was a boundary of
    the step loop (else of setup or an evaluation loop)."""
    global _window, _skip_next
    with _lock:
        if _settling is not None:
            _report(_settling)  # with the clean iterations it has
        if _window is not None and not _window.closed:
            _close(_window)  # a snapshot during the last one's tail: the tail ends here
        _skip_next = not at_step_loop and _last_t is not None
        _window = _Window(snap_id, stall_s, at_step_loop, list(_clean))


def writer_done(snap_id: str, writer_cpu_s: float | None) -> None:
    """The writer of ``snap_id`` was reaped (in the waiter thread); the tail starts."""
    with _lock:
        window = _window
        if window is None or window.snap_id != snap_id or window.closed:
            return
        window.end_t = time.perf_counter()
        window.writer_cpu_s = writer_cpu_s
        if _last_t is None:  # no iteration was ever timed: nothing to wait for
            _close(window)
            return
    step_s = statistics.fmean(window.baseline) if window.baseline else 0.0
    timer = threading.Timer(max(EXPIRE_S, (TAIL_ITERATIONS + 2) * step_s), _expire, (window,))
    timer.daemon = True
    timer.start()


def _expire(window: _Window) -> None:
    with _lock:
        if not window.closed:
            _close(window)
        elif not window.reported:
            _report(window)  # settling, and no iteration came since: training ended or paused


def _close(window: _Window, settle: bool = False) -> None:
    """No more iterations in the window (called with ``_lock`` held). ``settle``: report its
    cost once the clean iterations after it are in; else now."""
    global _window, _settling
    window.closed = True
    window.closed_t = time.perf_counter()
    if _window is window:
        _window = None
    window.baseline = window.baseline[-BASELINE_EACH_SIDE:]
    window.before_n = len(window.baseline)
    if settle and len(window.baseline) >= _BASELINE_MIN:
        _settling = window
    else:
        _report(window)


def _report(window: _Window) -> None:
    """Send the window's cost (called with ``_lock`` held)."""
    global _settling
    if _settling is window:
        _settling = None
    if window.reported:
        return
    window.reported = True
    measured = measure(window.durations, window.baseline, window.stall_s, window.at_step_loop)
    if measured is None:
        cost_s = window.stall_s + (window.writer_cpu_s or 0.0)
        fields = {"how": "writer_cpu", "writer_cpu_s": window.writer_cpu_s}
    else:
        cost_s, step_s, noise_s = measured
        fields = {"how": "iterations", "iterations": len(window.durations), "step_s": round(step_s, 6),
                  "noise_s": round(noise_s, 6)}
    control.emit("cost", id=window.snap_id, cost_s=round(cost_s, 6), stall_s=round(window.stall_s, 6),
                 window_s=round(window.closed_t - window.opened_t, 3), **fields)


def measure(durations: list[float], baseline: list[float], stall_s: float, at_step_loop: bool):
    """(cost_s, baseline iteration s, noise_s) of a window's iterations against the clean ones
    around it, or None without enough of either. The cost is never less than the stall, which
    is certain; noise_s is one standard deviation of the sum the cost comes from."""
    if len(baseline) < _BASELINE_MIN or not durations:
        return None
    step_s = statistics.fmean(baseline)
    cost_s = sum(durations) - len(durations) * step_s
    if not at_step_loop:
        cost_s += stall_s  # the iteration that holds it was left out
    noise_s = statistics.stdev(baseline) * len(durations) ** 0.5
    return max(cost_s, stall_s), step_s, noise_s
