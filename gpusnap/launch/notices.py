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
import json
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

from gpusnap import knobs

PROVIDERS = ("aws", "gcp", "azure")
CHOICES = ("off", "auto", *PROVIDERS)
_BASE = {"aws": "http://169.254.169.254", "gcp": "http://metadata.google.internal", "azure": "http://169.254.169.254"}
_TIMEOUT_S = 2.0
# A notice with no deadline of its own (GCP): what the cloud documents as the least it gives.
_DEFAULT_WARNING_S = {"aws": 120.0, "gcp": 30.0, "azure": 30.0}


@dataclass
class Notice:
    provider: str
    action: str
    deadline: float  # unix time when the VM goes away (an estimate where the cloud gives none)

    def describe(self) -> str:
        left = self.deadline - time.time()
        at = time.strftime("%H:%M:%S", time.gmtime(self.deadline))
        return f"{self.provider} {self.action} notice: the machine goes away at {at} UTC (in {left:.0f} s)"


def _base(provider: str) -> str:
    return (knobs.METADATA_URL or _BASE[provider]).rstrip("/")


def _request(url: str, headers: dict, method: str = "GET") -> tuple[int, bytes]:
    """(HTTP status, body); 0 when nothing answered."""
    req = urllib.request.Request(url, headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=_TIMEOUT_S) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, b""
    except (OSError, ValueError):
        return 0, b""


class _Aws:
    name = "aws"

    def __init__(self):
        self._token, self._token_until = None, 0.0

    def _headers(self) -> dict | None:
        if self._token is None or time.monotonic() > self._token_until:
            status, body = _request(f"{_base('aws')}/latest/api/token", {"X-aws-ec2-metadata-token-ttl-seconds": "21600"}, "PUT")
            if status != 200:
                return None
            self._token, self._token_until = body.decode(), time.monotonic() + 21000
        return {"X-aws-ec2-metadata-token": self._token}

    def answers(self) -> bool:
        return self._headers() is not None

    def check(self) -> Notice | None:
        headers = self._headers()
        if headers is None:
            return None
        status, body = _request(f"{_base('aws')}/latest/meta-data/spot/instance-action", headers)
        if status != 200:
            return None
        try:
            doc = json.loads(body)
            deadline = _iso_time(doc["time"])
            action = str(doc.get("action", "terminate"))
        except (ValueError, KeyError, TypeError):
            action, deadline = "interruption", time.time() + _DEFAULT_WARNING_S["aws"]
        return Notice("aws", action, deadline)


class _Gcp:
    name = "gcp"
    _HEADERS = {"Metadata-Flavor": "Google"}

    def answers(self) -> bool:
        return _request(f"{_base('gcp')}/computeMetadata/v1/instance/preempted", self._HEADERS)[0] == 200

    def check(self) -> Notice | None:
        status, body = _request(f"{_base('gcp')}/computeMetadata/v1/instance/preempted", self._HEADERS)
        if status == 200 and body.strip().upper() == b"TRUE":
            return Notice("gcp", "preemption", time.time() + _DEFAULT_WARNING_S["gcp"])
        return None


class _Azure:
    name = "azure"
    _HEADERS = {"Metadata": "true"}
    _URL = "/metadata/scheduledevents?api-version=2020-07-01"

    def answers(self) -> bool:
        return _request(_base("azure") + self._URL, self._HEADERS)[0] == 200

    def check(self) -> Notice | None:
        status, body = _request(_base("azure") + self._URL, self._HEADERS)
        if status != 200:
            return None
        try:
            events = json.loads(body).get("Events") or []
        except (ValueError, AttributeError):
            return None
        for event in events:
            kind = event.get("EventType")
            if kind in ("Preempt", "Terminate"):
                deadline = _http_time(event.get("NotBefore")) or time.time() + _DEFAULT_WARNING_S["azure"]
                return Notice("azure", kind.lower(), deadline)
        return None


_WATCHERS = {"aws": _Aws, "gcp": _Gcp, "azure": _Azure}


def _iso_time(text: str) -> float:
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _http_time(text) -> float | None:
    if not text:
        return None
    try:
        return email.utils.parsedate_to_datetime(text).timestamp()
    except (TypeError, ValueError):
        return None


class Watcher:
    """Polls the chosen services every ``knobs.NOTICE_POLL_S`` from a daemon thread; calls
    ``on_notice(notice)`` once, at the first notice, and ``on_none(message)`` when ``auto``
    finds no service that answers."""

    def __init__(self, choice: str, on_notice, on_none):
        self.choice, self.on_notice, self.on_none = choice, on_notice, on_none
        self.thread = threading.Thread(target=self._run, name="gpusnap-notices", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _run(self) -> None:
        names = PROVIDERS if self.choice == "auto" else (self.choice,)
        watchers = [_WATCHERS[name]() for name in names]
        if self.choice == "auto":
            watchers = [w for w in watchers if w.answers()]
            if not watchers:
                self.on_none("no cloud metadata service answered: spot notices are not watched")
                return
        while True:
            for watcher in watchers:
                notice = watcher.check()
                if notice is not None:
                    self.on_notice(notice)
                    return
            time.sleep(knobs.NOTICE_POLL_S)
