"""Runtime of instrumented loops: iteration counts, safe points, fast-forward.

The transform (``instrument.transform``) rewrites, in every instrumented module::

    for T in E: ...                 ->  for T in __gpusnap_loops__.for_loop("LINE:COL", E): ...
    for T in enumerate(a, s): ...   ->  for T in __gpusnap_loops__.for_loop_call("LINE:COL", enumerate, a, s): ...
    (enumerate/zip/islice nested in such a call, or in a tqdm(...) call there, become
    ``__gpusnap_loops__.deferred(func, ...)``: no iterator is made before the loop starts)
    while C: ...                    ->  with __gpusnap_loops__.while_loop("LINE:COL") as __gpusnap_w_N:
                                            while __gpusnap_w_N.boundary() and (C): ...

Each running loop is an ``ActiveLoop`` on the main thread's ``ACTIVE`` list from its first
iteration until it ends (CPython closes a ``for`` loop's generator as soon as the loop drops it:
on exhaustion, ``break``, ``return`` or an exception). A *boundary* is the moment between two
iterations: the previous body is complete and the next item is not fetched yet. When a snapshot
is pending, every main-thread boundary calls ``on_boundary`` (installed by the capture agent),
which decides whether this boundary is a safe point. When nothing is pending a boundary costs
one global lookup and one counter step.

A loop whose source is not a known pure container, or that runs in a generator, gets a weak
reference to its ``_iterate`` generator (and the former a note, ``describe_source``), whose local
``item`` is the last item handed to the body: the writer digests it so that replay can prove a
consumed source, or a generator it ran again, reproduced it. Loops that
enclose a step loop become ``EnclosingLoop``s (by ``__class__`` assignment, from the capture
agent), and so do loops that run in a generator while the capture agent is installed (a
program's ``cycle(loader)`` that it advances by hand, which replay runs again): they record the
global RNG states at every iteration start. Other loops pay nothing per iteration for either.
"""

from __future__ import annotations

import builtins
import inspect
import itertools
import math
import sys
import threading
import time
import weakref

_MAIN_THREAD = threading.main_thread().ident
_IN_GENERATOR = inspect.CO_GENERATOR  # a generator's loop: its last item is digested (livecheck)

# Set by the capture agent; read at every boundary. A plain module global: the cheapest check.
pending = False
# on_boundary(loop: ActiveLoop) -> None; installed by capture.trainee.agent.install().
on_boundary = None
# on_loop_start(loop: ActiveLoop, iterable) -> iterator | SKIP | None; installed by restore
# (replay): returns a replacement iterator that resumes the loop at its saved position, SKIP for
# a loop that ran its course before the snapshot (it runs no iteration), or None.
on_loop_start = None
SKIP = object()
# on_loop_end(loop: ActiveLoop) -> None; installed by the capture agent: a loop ended.
on_loop_end = None
# describe_source(loop, iterable) -> dict | None; installed by the capture agent: what fast-forward
# will need later, taken before iter() runs (the RNG states at the moment iter() is called).
describe_source = None
# capture_rng() -> raw RNG states; installed by the capture agent, called by EnclosingLoop.
capture_rng = None
# note_start(loop) -> None: installed by the capture agent, called as each main-thread loop starts.
note_start = None
# replaying() -> None while a restore has not merged its snapshot (installed and cleared by
# restore's replay): the capture agent calls it at an optimizer step (replay must not train) and
# takes no snapshot meanwhile. Capture never imports restore: this is what it knows of one.
replaying = None
# The local of ``_iterate`` that holds the last item handed to the body.
LAST_ITEM = "item"

# Running main-thread loops, outermost first (generators can make removal non-LIFO).
ACTIVE: list["ActiveLoop"] = []


class ActiveLoop:
    """One execution of one loop statement."""

    # Unset until used: ``gen`` (weak reference to the _iterate generator, loops with a note),
    # ``rng_at`` and ``locals_at`` (the global RNG states and the frame's scalar locals at the
    # current iteration's start, EnclosingLoop only; ``locals_at`` also as the loop starts, for
    # its first iteration, and ``locals_for`` the iteration it holds them for), ``stepped``
    # (an optimizer stepped while this execution of the loop ran, set by the capture agent),
    # ``loaders`` (the DataLoaders its source iterates, ``graph.iterators.loaders_in``).
    __slots__ = ("loop_id", "frame", "index", "kind", "resume", "started_s", "gen", "rng_at", "locals_at", "locals_for", "stepped",
                 "loaders", "__weakref__")

    def __init__(self, loop_id: str, frame, kind: str):
        self.loop_id = loop_id  # "LINE:COL" of the statement inside frame.f_code
        self.frame = frame
        self.index = 0  # completed iterations == items handed to the body so far
        self.kind = kind  # "for" | "while"
        self.resume = None  # describe_source()'s note, kept in snapshots for fast-forward
        self.started_s = time.perf_counter()  # its pace, for a program that never steps an optimizer

    @property
    def code(self):
        return self.frame.f_code

    def where(self) -> str:
        code = self.frame.f_code
        return f"{code.co_filename}:{self.loop_id.split(':')[0]} in {code.co_qualname}"

    def __repr__(self) -> str:
        return f"<loop {self.where()} index={self.index}>"


_index_slot = ActiveLoop.__dict__["index"]


def _set_index(loop, value: int) -> None:
    _index_slot.__set__(loop, value)
    if capture_rng is not None:
        loop.rng_at = capture_rng()
        if not loop.frame.f_code.co_flags & _IN_GENERATOR:
            loop.locals_at, loop.locals_for = scalar_locals(loop.frame), value


class EnclosingLoop(ActiveLoop):
    """A loop that encloses a step loop: each iteration start (every ``index`` step, which
    follows the fetch of the item) records the global RNG states and the scalar locals of its
    frame, so that replay can give the body prefix that it reruns once the state it ran with:
    ``while True: sampler.set_epoch(epoch)`` reads an epoch that the skipped bodies counted."""

    __slots__ = ()
    index = property(_index_slot.__get__, _set_index)


_SCALARS = (int, float, bool, type(None))


def scalar_locals(frame) -> dict:
    """The numbers, flags and short strings among ``frame``'s locals (its globals, at module
    level): what a loop's body counts and tests across iterations."""
    return {
        name: value
        for name, value in frame.f_locals.items()
        if (type(value) in _SCALARS or (type(value) is str and len(value) <= 256)) and not name.startswith("__")
    }


def scalars_to_json(values: dict) -> dict:
    """``scalar_locals`` as a manifest holds them (``scalars_from_json`` reads them back): JSON
    has no infinity or NaN, and `best = float("inf")` before an early-stopping loop is common
    (it failed every snapshot of such a program), so such a float is ``{"float": "inf"}``."""
    return {name: {"float": repr(v)} if type(v) is float and not math.isfinite(v) else v for name, v in values.items()}


def scalars_from_json(values: dict) -> dict:
    return {name: float(v["float"]) if type(v) is dict else v for name, v in values.items()}


def _unregister(loop: ActiveLoop) -> None:
    # Almost always the last entry; search from the end.
    for i in range(len(ACTIVE) - 1, -1, -1):
        if ACTIVE[i] is loop:
            del ACTIVE[i]
            break
    if on_loop_end is not None:
        on_loop_end(loop)


def _iterate(loop: ActiveLoop, it):
    try:
        if pending and on_boundary is not None:
            on_boundary(loop)
        for item in it:
            loop.index += 1
            yield item
            # The body of the previous item is complete: this is a boundary.
            if pending and on_boundary is not None:
                on_boundary(loop)
    finally:
        _unregister(loop)


def _start_for(loop_id: str, iterable, frame):
    if threading.get_ident() != _MAIN_THREAD:
        return iter(iterable)
    loop = ActiveLoop(loop_id, frame, "for")
    if frame.f_code.co_flags & _IN_GENERATOR and capture_rng is not None:
        loop.__class__ = EnclosingLoop
    if note_start is not None:
        note_start(loop)
    if describe_source is not None:
        loop.resume = describe_source(loop, iterable)
    it = None
    if on_loop_start is not None:
        it = on_loop_start(loop, iterable)
    if it is SKIP:
        it = iter(())
    elif it is None:
        it = iter(iterable)
    ACTIVE.append(loop)
    gen = _iterate(loop, it)
    if loop.resume is not None or frame.f_code.co_flags & _IN_GENERATOR:
        loop.gen = weakref.ref(gen)  # weak: the for statement alone must own (and close) it
    return gen


def for_loop(loop_id: str, iterable):
    return _start_for(loop_id, iterable, sys._getframe(1))


DEFERRED = (builtins.enumerate, builtins.zip, itertools.islice)


def for_loop_call(loop_id: str, func, *args, **kwargs):
    """``for x in enumerate(...)`` / ``zip(...)`` / ``islice(...)``: the call is deferred to here
    so that replay can fast-forward the sources before any of them is turned into an iterator."""
    frame = sys._getframe(1)
    if func in DEFERRED:
        return _start_for(loop_id, _DeferredCall(func, args, kwargs), frame)
    return _start_for(loop_id, func(*args, **kwargs), frame)


def deferred(func, *args, **kwargs):
    """A call nested in a loop header's deferred call (``enumerate(islice(loader, n))``)."""
    if func in DEFERRED:
        return _DeferredCall(func, args, kwargs)
    return func(*args, **kwargs)


class _DeferredCall:
    """An enumerate()/zip()/islice() not made yet; iter() makes it (replay may rebuild it)."""

    __slots__ = ("func", "args", "kwargs")

    def __init__(self, func, args, kwargs):
        self.func, self.args, self.kwargs = func, args, kwargs

    def __iter__(self):
        return iter(self.func(*self.args, **self.kwargs))

    def sources(self) -> tuple:
        """The arguments the call iterates: zip's all, enumerate's and islice's first."""
        return self.args if self.func is builtins.zip else self.args[:1]


class _WhileLoop:
    __slots__ = ("loop", "skipped")

    def __init__(self, loop: ActiveLoop | None):
        self.loop = loop
        self.skipped = False

    def __enter__(self):
        if self.loop is not None:
            ACTIVE.append(self.loop)
            if on_loop_start is not None:
                self.skipped = on_loop_start(self.loop, None) is SKIP
        return self

    def __exit__(self, *exc):
        if self.loop is not None:
            _unregister(self.loop)
        return False

    def boundary(self) -> bool:
        if self.skipped:
            return False
        loop = self.loop
        if loop is not None:
            if pending and on_boundary is not None:
                on_boundary(loop)
            loop.index += 1
        return True


def while_loop(loop_id: str) -> _WhileLoop:
    if threading.get_ident() != _MAIN_THREAD:
        return _WhileLoop(None)
    frame = sys._getframe(1)
    loop = ActiveLoop(loop_id, frame, "while")
    if frame.f_code.co_flags & _IN_GENERATOR and capture_rng is not None:
        loop.__class__ = EnclosingLoop
    if note_start is not None:
        note_start(loop)
    return _WhileLoop(loop)


def reset_after_fork_in_child() -> None:
    """A forked child (DataLoader worker, writer) must never take a snapshot of its own."""
    global pending, on_boundary, on_loop_start, on_loop_end, describe_source, capture_rng, note_start
    pending = False
    on_boundary = None
    on_loop_start = None
    on_loop_end = None
    describe_source = None
    capture_rng = None
    note_start = None
    ACTIVE.clear()
