"""The control protocol between the supervisor, the trainee and ``gpusnap snap``: one TypedDict
per message, and ``check``, which each side runs on every message it reads.

Newline-delimited JSON objects over the unix socket that ``GPUSNAP_BOOT``'s ``"control"`` names
(mode 0600; ``DIR/supervisor.json``, in a distributed run ``DIR/supervisor-HOST.json`` per node,
holds ``{"pid", "socket", "started", "host"}``). Every message has an ``"op"``.

trainee → supervisor (``TO_SUPERVISOR``)
    ``Hello`` ``{"op": "hello", "pid": N}`` first, once connected (``"rank"`` too in a rank of a
    torchrun job). A hello from the trainee's pid (or a descendant, until the trainee itself
    says hello) makes that connection *the trainee*.
    ``Event`` ``{"op": "event", "event": E, ...}`` from the trainee or its writer, E one of
      ``honored``    safe point reached: ``iteration``, ``where``, ``reason``
      ``coalesced``  a writer is running; this request is served after it
      ``skipped``    no snapshot this time: ``message`` (e.g. not enough host memory), ``hint``
      ``forked``     writer started: ``id``, ``stall_s``
      ``committed``  ``id``, ``stall_s``, ``write_s``, ``bytes_written``, ``bytes_total``
                     (``iteration`` optional; ``warning`` and ``hint`` when retention failed
                     after the commit: shown as a warning, the snapshot stays committed)
      ``failed``     ``id`` (optional), ``message``
      ``progress``   a long write: ``id``, ``bytes_put``, ``bytes_written``, ``s`` (every 0.2 s;
                     a status line on a terminal, not logged)
      ``steps``      once, when training runs: ``step_s`` (mean iteration time)
      ``restored``   a restart merged snapshot ``id``: its times and ``verified``
                     (``checking``: it has a witness to compare with; ``unverified``: none)
      ``verified``   the iterations after the merge matched snapshot ``id``'s witness: ``iterations``
      ``diverged``   they did not: ``id``, ``message`` (``forced``: the run went on, --force)
      ``cost``       what snapshot ``id`` cost training: ``cost_s``, ``stall_s``, ``window_s``,
                     ``how`` (``iterations``: with ``iterations``, ``step_s``, ``noise_s``;
                     ``writer_cpu``: with ``writer_cpu_s``) (capture/trainee/costs.py)
      ``dropped``    ``count`` events were dropped: the supervisor did not read them in time
    An event may carry more fields than these (the times of a commit or a restore): they are
    logged as they are.
supervisor → trainee (``TO_TRAINEE``)
    ``TakeSnapshot`` ``{"op": "snapshot", "reason": "signal" | "timer" | "term" | "request",
    "stop": bool, "schedule": {...}}``; ``stop`` (SIGTERM with ``--on-term snapshot``): exit
    with status 75 once it is committed. ``NewSchedule`` ``{"op": "schedule", "schedule":
    {...}}`` after each measured cost: the timer's interval and the overhead so far
    (``Schedule.info``), which the next manifest records.
    Requests made before the trainee connects are queued and sent, in order, after its hello.
client (``gpusnap snap``) → supervisor (``TO_SUPERVISOR``)
    ``AskSnapshot`` ``{"op": "snapshot", "reason": "request", "wait": bool}``; the supervisor
    answers ``Accepted`` ``{"op": "accepted", "queued": bool}`` and, when ``wait``, then the
    terminal event (``committed``, ``failed`` or ``skipped``) of the snapshot that serves the
    request, as the trainee sent it, and closes. ``AskStatus`` ``{"op": "status"}`` is answered
    with ``Status`` ``{"op": "status", ...}`` (``TO_CLIENT``).

A message that is not one of these (an unknown op, a missing or mistyped field) is refused on
arrival: ``check`` raises ``Malformed``, and the side that read it logs one line and goes on.
Fields a message does not declare pass through. Standard library only: the supervisor imports
it, and it never imports torch. The floor of the package (as ``errors`` and ``knobs``).
"""

# No ``from __future__ import annotations``: TypedDict must see NotRequired[...] itself, not a
# string, to leave those keys out of __required_keys__.
import types
import typing
from typing import Literal, NotRequired, TypedDict


# -- trainee and client → supervisor -------------------------------------------------------------
class Hello(TypedDict):
    op: Literal["hello"]
    pid: int
    rank: NotRequired[int]


class Event(TypedDict):
    op: Literal["event"]
    event: str
    id: NotRequired[str | None]
    iteration: NotRequired[int | None]
    where: NotRequired[str | None]
    reason: NotRequired[str]
    message: NotRequired[str]
    hint: NotRequired[str]
    warning: NotRequired[str]
    stop: NotRequired[bool]
    stall_s: NotRequired[float]
    write_s: NotRequired[float]
    bytes_written: NotRequired[float]
    bytes_total: NotRequired[float]
    bytes_put: NotRequired[float]
    s: NotRequired[float]
    step_s: NotRequired[float | None]
    cost_s: NotRequired[float | None]
    window_s: NotRequired[float | None]
    noise_s: NotRequired[float | None]
    writer_cpu_s: NotRequired[float | None]
    how: NotRequired[str]
    iterations: NotRequired[int]
    count: NotRequired[int]
    forced: NotRequired[bool]
    pruned_first: NotRequired[list[str]]


class AskSnapshot(TypedDict):
    op: Literal["snapshot"]
    reason: NotRequired[str]
    wait: NotRequired[bool]


class AskStatus(TypedDict):
    op: Literal["status"]


# -- supervisor → trainee ------------------------------------------------------------------------
class TakeSnapshot(TypedDict):
    op: Literal["snapshot"]
    reason: str
    stop: bool
    schedule: NotRequired[dict]


class NewSchedule(TypedDict):
    op: Literal["schedule"]
    schedule: dict


# -- supervisor → client ---------------------------------------------------------------------------
class Accepted(TypedDict):
    op: Literal["accepted"]
    queued: bool


class Status(TypedDict):
    op: Literal["status"]
    pid: int
    trainee_pid: int | None
    connected: bool
    run_dir: str
    stopping: bool


# What each side reads, by op.
TO_SUPERVISOR = {"hello": Hello, "event": Event, "snapshot": AskSnapshot, "status": AskStatus}
TO_TRAINEE = {"snapshot": TakeSnapshot, "schedule": NewSchedule}
TO_CLIENT = {"accepted": Accepted, "status": Status, "event": Event}


class Malformed(ValueError):
    """A message that is not one the reader's side of the protocol knows; ``str()`` says why."""


def check(message, kinds: dict) -> dict:
    """``message`` itself when it is one of ``kinds`` (``TO_SUPERVISOR``, ``TO_TRAINEE``,
    ``TO_CLIENT``) with each declared field of its type; else Malformed."""
    if not isinstance(message, dict):
        text = repr(message)
        raise Malformed(f"not a JSON object: {text[:80] + '...' if len(text) > 80 else text}")
    kind = kinds.get(message.get("op")) if isinstance(message.get("op"), str) else None
    if kind is None:
        raise Malformed(f"unknown op {message.get('op')!r} (known: {', '.join(sorted(kinds))})")
    hints = _hints(kind)
    missing = sorted(kind.__required_keys__ - message.keys())
    if missing:
        raise Malformed(f"{message['op']!r} without {', '.join(missing)}")
    for name, hint in hints.items():
        if name in message and not _matches(message[name], hint):
            raise Malformed(f"{message['op']!r} with {name}={message[name]!r}: not {_name(hint)}")
    return message


_HINTS: dict[type, dict] = {}


def _hints(kind) -> dict:
    if kind not in _HINTS:
        _HINTS[kind] = typing.get_type_hints(kind)  # NotRequired[...] comes back as what it wraps
    return _HINTS[kind]


def _matches(value, hint) -> bool:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Literal:
        return value in args
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, arg) for arg in args)
    if hint is type(None):
        return value is None
    if hint is float:  # JSON has one kind of number: an int is a float here
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if origin is list:
        return isinstance(value, list) and all(_matches(item, args[0]) for item in value)
    return isinstance(value, origin or hint)


def _name(hint) -> str:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return " or ".join(_name(arg) for arg in typing.get_args(hint))
    return "null" if hint is type(None) else getattr(hint, "__name__", str(hint))
