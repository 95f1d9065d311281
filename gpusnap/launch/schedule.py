"""When the supervisor asks for a snapshot by timer (``--every DURATION`` or ``--every auto``),
and what snapshots have cost training so far.

The trainee measures what each snapshot costs training (``capture.trainee.costs``: its stall plus the
slowdown of the program's iterations while the writer runs and just after, against the
iterations before it) and reports it in a ``cost`` event. The schedule adds the costs up
against the time since training started (the trainee's ``steps`` event; its connection when no
step loop reports): the measured overhead is ``spent / (elapsed - spent)``, the slowdown
against the same run without snapshots. Every schedule measures it; ``gpusnap ls`` shows it.

``--every auto`` turns the costs into the interval. With the budget b (``--overhead``, default
1%) and c the estimate of the next snapshot's cost (below), the next timer request is due at

    max(last + max(AUTO_MIN_INTERVAL_S, 2 last window_s, c (1 + b) / b),   the steady state
        start + (spent + c (in flight + 1)) (1 + b) / b)                    the account

The first term spaces snapshots so that each one's cost is b of the time it buys. The second
keeps the whole run within the budget, not only its steady state: a snapshot that cost more
than expected (the first, which nothing predicted; one that met a busy machine; one asked for
by a signal) delays the next one until the run has earned it. The first snapshot comes
``AUTO_FIRST_S`` after training starts (the first iterations of the step loop), to measure;
a program that reports no iterations gets it ``NO_STEPS_FACTOR`` times that long after it
started. Costs are re-measured at every snapshot, so the interval follows a program, a state
or a machine whose costs change.

The estimate c is the mean of the last ``COSTS_KEPT`` costs plus its standard error. A cost is
measured against iterations whose own times vary by as much as a snapshot costs (0.6 GB of
state on the 2-core CI machine: 0.2-0.3 s a snapshot, 8 iterations of 0.45 +- 0.1 s), so single
costs scatter widely (0.01-1.8 s there). The budget is a bound, not a target: spacing snapshots
by the mean alone overshoots it whenever the mean of the last few happens to be low, and the
standard error is what it is likely to be low by. It vanishes as costs agree.
"""

from __future__ import annotations

import statistics
from collections import deque

from gpusnap import knobs

# A program whose step loop has reported no iterations this many AUTO_FIRST_S after it
# connected (setup still running, or no torch.optim to time iterations by) gets its first
# snapshot then, measured by the stall and the writer's CPU time.
NO_STEPS_FACTOR = 4
# A snapshot's window (its writer, and the iterations after it that its cost is measured over:
# ``capture.trainee.costs``) spans at most half the time, so the interval is at least twice the last
# window: the iterations of the other half are the clean ones costs are measured against, and
# a timer request never waits behind a writer still at work.
INTERVAL_PER_WINDOW = 2
# The estimate of the next snapshot's cost: the mean of this many recent costs (one snapshot
# that met a slow disk moves it, and goes out of it again).
COSTS_KEPT = 8


class Schedule:
    """Call order: ``connected`` once the trainee says hello; ``event`` for each of its events;
    ``due`` before each wait (``None``: no timer request due); ``requested`` when the due
    request was sent; ``info`` whenever a request or a log record wants the figures."""

    def __init__(self, every_s: float | None = None, budget: float | None = None, start_t: float = 0.0):
        self.every_s = every_s  # a fixed interval, or None
        self.budget = budget  # --every auto's budget (a fraction), or None
        self.next_fixed_t = start_t + every_s if every_s else None
        self.connected_t: float | None = None
        self.steps_t: float | None = None  # training started (the trainee's steps event)
        self.costs: deque = deque(maxlen=COSTS_KEPT)
        self.spent_s = 0.0  # sum of every measured cost
        self.measured = 0
        self.asked = 0  # timer requests sent and not yet forked, skipped or failed
        self.in_flight: set = set()  # snapshots forked whose cost is not reported yet
        self.last_t: float | None = None  # the last fork
        self.window_s = 0.0  # the last measured snapshot's window: its writer and tail

    @property
    def auto(self) -> bool:
        return self.budget is not None

    def connected(self, now: float) -> None:
        if self.connected_t is None:
            self.connected_t = now

    def start_t(self) -> float | None:
        return self.steps_t if self.steps_t is not None else self.connected_t

    def event(self, ev: dict, now: float) -> bool:
        """Take one trainee event into account; True when it was a snapshot's cost."""
        name, sid = ev.get("event"), ev.get("id")
        if name == "steps" and self.steps_t is None and not self.measured:
            self.steps_t = now
        elif name == "forked":
            self.asked = max(0, self.asked - 1)
            self.in_flight.add(sid)
            self.last_t = now
        elif name == "skipped" or (name == "failed" and sid not in self.in_flight):
            self.asked = max(0, self.asked - 1)  # no fork, so no cost comes
        elif name == "cost" and isinstance(ev.get("cost_s"), (int, float)):
            self.in_flight.discard(sid)
            self.window_s = float(ev.get("window_s") or 0.0)
            self.costs.append(float(ev["cost_s"]))
            self.spent_s += float(ev["cost_s"])
            self.measured += 1
            return True
        return False

    def cost_s(self) -> float | None:
        """The next snapshot's cost as the interval budgets it: the recent costs' mean plus its
        standard error (see the module's docstring)."""
        if not self.costs:
            return None
        mean = statistics.fmean(self.costs)
        if len(self.costs) < 2:
            return mean
        return mean + statistics.stdev(self.costs) / len(self.costs) ** 0.5

    def interval_s(self) -> float | None:
        """The interval the timer keeps now (``--every auto``: None until a cost is known)."""
        if not self.auto:
            return self.every_s
        c = self.cost_s()
        if c is None:
            return None
        b = self.budget
        return max(knobs.AUTO_MIN_INTERVAL_S, INTERVAL_PER_WINDOW * self.window_s, c * (1 + b) / b)

    def due(self, now: float) -> float | None:
        """When the next timer request is due (monotonic seconds), or None."""
        if not self.auto:
            return self.next_fixed_t
        start = self.start_t()
        if start is None or self.asked:
            return None
        c = self.cost_s()
        if c is None:
            if self.in_flight:
                return None  # a snapshot (asked for otherwise) is being measured
            if self.steps_t is not None:
                return self.steps_t + knobs.AUTO_FIRST_S
            return self.connected_t + NO_STEPS_FACTOR * knobs.AUTO_FIRST_S
        b = self.budget
        by_account = start + (self.spent_s + c * (len(self.in_flight) + 1)) * (1 + b) / b
        last = self.last_t if self.last_t is not None else start
        return max(last + self.interval_s(), by_account)

    def requested(self, now: float) -> None:
        """The due timer request was sent."""
        if not self.auto:
            while self.next_fixed_t <= now:
                self.next_fixed_t += self.every_s  # missed ticks (a stopped process) are not made up
            return
        self.asked += 1

    def overhead(self, now: float) -> float | None:
        """Measured cost of the snapshots so far against the training time they came out of."""
        start = self.start_t()
        if not self.measured or start is None:
            return None
        training_s = max(now - start - self.spent_s, 1e-9)
        return self.spent_s / training_s

    def info(self, now: float) -> dict:
        """What a manifest (``schedule``) and the run log record."""
        interval = self.interval_s()
        overhead = self.overhead(now)
        cost = self.cost_s()
        return {
            "every": "auto" if self.auto else self.every_s,
            "interval_s": None if interval is None else round(interval, 3),
            "budget": self.budget,
            "overhead": None if overhead is None else round(overhead, 6),
            "cost_s": None if cost is None else round(cost, 6),
            "measured": self.measured,
        }
