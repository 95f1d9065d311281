"""Spot and preemption notices from the cloud's instance metadata service.

A cloud that takes a spot/preemptible VM back says so shortly before (AWS: two minutes, GCP: 30
seconds, Azure: at least 30 seconds), on an HTTP endpoint only the VM can reach. ``Watcher``
polls it from a thread of the supervisor (``gpusnap run --notices``) and, at the first notice,
hands it to the supervisor, which asks for a snapshot and stops with exit 75, as on SIGTERM,
with the grace cut to the notice's deadline.

- AWS (IMDSv2): ``PUT /latest/api/token`` for a session token, then
  ``GET /latest/meta-data/spot/instance-action``: 404 until a notice, then
  ``{"action": "terminate"|"stop"|"hibernate", "time": "2026-11-23T12:00:00Z"}``.
- GCP: ``GET /computeMetadata/v1/instance/preempted`` (header ``Metadata-Flavor: Google``):
  ``FALSE``, then ``TRUE`` (no deadline is given: about 30 s).
- Azure: ``GET /metadata/scheduledevents?api-version=2020-07-01`` (header ``Metadata: true``):
  ``{"Events": [{"EventType": "Preempt", "NotBefore": "Mon, 23 Nov 2026 12:00:00 GMT"}, ...]}``;
  ``Preempt`` and ``Terminate`` count.

``auto`` asks each service once, in the background, and watches those that answer. The base
URLs are the real ones unless ``GPUSNAP_METADATA_URL`` names another (tests serve all three
paths from 127.0.0.1). Only the standard library is used: the supervisor stays light.
"""

from __future__ import annotations

import datetime
import email.utils
import http.client
import json
import threading
import time
import urllib.parse
from dataclasses import dataclass

from gpusnap import knobs

PROVIDERS = ("aws", "gcp", "azure")
CHOICES = ("off", "auto", *PROVIDERS)
_BASE = {"aws": "http://169.254.169.254", "gcp": "http://metadata.google.internal", "azure": "http://169.254.169.254"}
# One request, from the name lookup to the last byte of the body, gets this long: a metadata
# service answers in milliseconds, and a poll must never hang the watcher.
_DEADLINE_S = 2.0
# A notice is a few hundred bytes; a longer body is no notice (a proxy's error page, a portal).
_MAX_BODY = 64 << 10
# A notice with no deadline of its own (GCP): what the cloud documents as the least it gives.
_DEFAULT_WARNING_S = {"aws": 120.0, "gcp": 30.0, "azure": 30.0}
_AWS_ACTIONS = ("terminate", "stop", "hibernate")


@dataclass
class Notice:
    """``left_s``: how long the machine has, by the cloud's own clock (its deadline against the
    Date of the answer), counted from ``read_at`` (``time.monotonic()`` when it was read): a
    wall clock that is off by minutes changes neither."""

    provider: str
    action: str
    left_s: float
    read_at: float

    def stop_by(self, margin_s: float) -> float:
        """The monotonic time by which the program must have stopped: ``margin_s`` before the
        machine goes, and never less than a second from when the notice was read."""
        return self.read_at + max(1.0, self.left_s - margin_s)

    def describe(self) -> str:
        left = self.read_at + self.left_s - time.monotonic()
        at = time.strftime("%H:%M:%S", time.gmtime(time.time() + left))
        return f"{self.provider} {self.action} notice: the machine goes away at {at} UTC (in {left:.0f} s)"


@dataclass
class Answer:
    status: int  # HTTP status; 0 when nothing answered in time
    body: bytes
    date: float | None  # the Date header, as unix time: the service's own clock
    read_at: float  # time.monotonic() when the answer was complete


def _base(provider: str) -> str:
    return (knobs.METADATA_URL or _BASE[provider]).rstrip("/")


# Swappable (tests): how a connection is made. http.client, not urllib: no proxy from the
# environment ever sees a metadata request, and a redirect is an answer, not followed.
_connection = http.client.HTTPConnection
_stuck: dict[str, threading.Thread] = {}  # per host: a request still running past its deadline


def _request(url: str, headers: dict, method: str = "GET") -> Answer:
    """One request within ``_DEADLINE_S`` in all. It runs in a thread of its own, as a name
    lookup cannot be given a timeout; one that does not finish in time is left behind (its
    socket shut), and the host gets no second request while it runs."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        return Answer(0, b"", None, time.monotonic())
    if parts.hostname in _stuck and _stuck[parts.hostname].is_alive():
        return Answer(0, b"", None, time.monotonic())
    done: dict = {}

    def run() -> None:
        conn = done["conn"] = _connection(parts.hostname, parts.port or 80, timeout=_DEADLINE_S)
        try:
            conn.request(method, parts.path + (f"?{parts.query}" if parts.query else ""), headers=headers)
            resp = conn.getresponse()
            body = resp.read(_MAX_BODY + 1)
            date = _http_time(resp.getheader("Date"))
            done["answer"] = Answer(resp.status, body if len(body) <= _MAX_BODY else b"", date, time.monotonic())
        # AttributeError: a request left behind whose connection was closed under it
        except (OSError, http.client.HTTPException, ValueError, AttributeError):
            pass
        finally:
            conn.close()

    thread = threading.Thread(target=run, name="gpusnap-notice-request", daemon=True)
    thread.start()
    thread.join(_DEADLINE_S)
    if thread.is_alive():
        _stuck[parts.hostname] = thread
        sock = getattr(done.get("conn"), "sock", None)
        if sock is not None:
            try:
                sock.shutdown(2)  # wakes a read that waits for bytes that never come
            except OSError:
                pass
        return Answer(0, b"", None, time.monotonic())
    return done.get("answer") or Answer(0, b"", None, time.monotonic())


class NotANotice(ValueError):
    """A service answered 200 with something that is neither a notice nor the absence of one."""


def _left(deadline: float, answer: Answer, provider: str) -> float:
    """Seconds the machine has, by the service's clock (its Date header; ours when it sends
    none). A deadline that clock puts in the past or implausibly far ahead is replaced by what
    the cloud documents."""
    left = deadline - (answer.date if answer.date is not None else time.time())
    default = _DEFAULT_WARNING_S[provider]
    return left if 0 < left <= 10 * default else default


class _Aws:
    name = "aws"

    def __init__(self):
        self._token, self._token_until = None, 0.0

    def _headers(self) -> dict | None:
        if self._token is None or time.monotonic() > self._token_until:
            answer = _request(f"{_base('aws')}/latest/api/token", {"X-aws-ec2-metadata-token-ttl-seconds": "21600"}, "PUT")
            token = answer.body.decode("ascii", "replace").strip()
            if answer.status != 200 or not token or len(token) > 1024 or not token.isprintable():
                return None
            self._token, self._token_until = token, time.monotonic() + 21000
        return {"X-aws-ec2-metadata-token": self._token}

    def answers(self) -> bool:
        return self._headers() is not None

    def check(self) -> Notice | None:
        headers = self._headers()
        if headers is None:
            return None
        answer = _request(f"{_base('aws')}/latest/meta-data/spot/instance-action", headers)
        if answer.status != 200:
            return None
        try:
            doc = json.loads(answer.body)
            action, deadline = doc["action"], _iso_time(doc["time"])
            if action not in _AWS_ACTIONS:
                raise ValueError(f"action {action!r}")
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise NotANotice(f"aws answered {_sample(answer.body)}, which is no spot notice ({exc})") from None
        return Notice("aws", action, _left(deadline, answer, "aws"), answer.read_at)


class _Gcp:
    name = "gcp"
    _HEADERS = {"Metadata-Flavor": "Google"}

    def answers(self) -> bool:
        return _request(f"{_base('gcp')}/computeMetadata/v1/instance/preempted", self._HEADERS).status == 200

    def check(self) -> Notice | None:
        answer = _request(f"{_base('gcp')}/computeMetadata/v1/instance/preempted", self._HEADERS)
        if answer.status != 200:
            return None
        said = answer.body.strip().upper()
        if said == b"FALSE":
            return None
        if said != b"TRUE":
            raise NotANotice(f"gcp answered {_sample(answer.body)}, neither TRUE nor FALSE")
        return Notice("gcp", "preemption", _DEFAULT_WARNING_S["gcp"], answer.read_at)


class _Azure:
    name = "azure"
    _HEADERS = {"Metadata": "true"}
    _URL = "/metadata/scheduledevents?api-version=2020-07-01"

    def answers(self) -> bool:
        return _request(_base("azure") + self._URL, self._HEADERS).status == 200

    def check(self) -> Notice | None:
        answer = _request(_base("azure") + self._URL, self._HEADERS)
        if answer.status != 200:
            return None
        try:
            events = json.loads(answer.body).get("Events") or []
            kinds = [(event.get("EventType"), event.get("NotBefore")) for event in events]
        except (ValueError, AttributeError, TypeError) as exc:
            raise NotANotice(f"azure answered {_sample(answer.body)}, which is no list of scheduled events ({exc})") from None
        for kind, not_before in kinds:
            if kind in ("Preempt", "Terminate"):
                deadline = _http_time(not_before)
                left = _left(deadline, answer, "azure") if deadline is not None else _DEFAULT_WARNING_S["azure"]
                return Notice("azure", kind.lower(), left, answer.read_at)
        return None


_WATCHERS = {"aws": _Aws, "gcp": _Gcp, "azure": _Azure}


def _sample(body: bytes) -> str:
    text = body[:60].decode("utf-8", "replace")
    return repr(text + ("..." if len(body) > 60 else ""))


def _iso_time(text: str) -> float:
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _http_time(text) -> float | None:
    if not text or not isinstance(text, str):
        return None
    try:
        return email.utils.parsedate_to_datetime(text).timestamp()
    except (TypeError, ValueError, IndexError):
        return None


class Watcher:
    """Polls the chosen services every ``knobs.NOTICE_POLL_S`` from a daemon thread; calls
    ``on_notice(notice)`` once, at the first notice, ``on_none(message)`` when ``auto`` finds
    no service that answers or the watcher stops, and ``on_problem(message)`` once for each new
    kind of answer that is no notice (the watcher goes on polling)."""

    def __init__(self, choice: str, on_notice, on_none, on_problem=None):
        self.choice, self.on_notice, self.on_none = choice, on_notice, on_none
        self.on_problem = on_problem or (lambda message: None)
        self._said: set[str] = set()
        self.thread = threading.Thread(target=self._run, name="gpusnap-notices", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _run(self) -> None:
        try:
            self._watch()
        except BaseException as exc:  # noqa: BLE001 - a watcher that stops says so
            self.on_none(f"spot notices are no longer watched: {type(exc).__name__}: {exc}")

    def _watch(self) -> None:
        names = PROVIDERS if self.choice == "auto" else (self.choice,)
        watchers = [_WATCHERS[name]() for name in names]
        if self.choice == "auto":
            watchers = [w for w in watchers if w.answers()]
            if not watchers:
                self.on_none("no cloud metadata service answered: spot notices are not watched")
                return
        while True:
            for watcher in watchers:
                try:
                    notice = watcher.check()
                except Exception as exc:  # noqa: BLE001 - a bad answer is no notice; polling goes on
                    message = f"{exc}"[:300] if isinstance(exc, NotANotice) else f"{watcher.name}: {type(exc).__name__}: {exc}"
                    if message not in self._said:
                        self._said.add(message)
                        self.on_problem(message)
                    continue
                if notice is not None:
                    self.on_notice(notice)
                    return
            time.sleep(knobs.NOTICE_POLL_S)
