"""Retries and throttling, as a wrapper around any backend (restic's ``RetryBackend``).

A request that fails for a reason that passes (the store throttles: HTTP 503 SlowDown or 429;
the connection drops, times out or is reset; a 500 of the store's own) is tried again after a
backoff that doubles from ``knobs.STORE_BACKOFF_S``, with jitter, up to ``knobs.STORE_RETRIES``
times; anything else (a missing key, refused credentials, a missing bucket, a commit that finds
its key taken) is raised at once. ``counts`` says how often each happened, for the report.
The backend below retries nothing itself (``store.objects`` turns obstore's own retries off).
"""

from __future__ import annotations

import random
import re
import threading
import time

from gpusnap import knobs
from gpusnap.errors import StoreError
from gpusnap import atomic
from gpusnap.store.backend import Backend, Ranged

_sleep = time.sleep  # swappable: tests run the backoff without waiting

# Status codes as whole words: an error's text carries request ids and times (Azure's
# "RequestId:e8e3e319-52b0-...") in which three digits in a row are common.
_THROTTLED = re.compile(r"\b(503|429)\b|SlowDown|TooManyRequests|Throttl|RequestLimitExceeded")
_DROPPED = re.compile(r"error sending request|[Cc]onnection|timed out|timeout|reset|broken pipe|"
                      r"\b500 Internal|InternalError|incomplete|unexpected EOF")


def _said(exc: BaseException | None) -> str:
    # obstore's text ends in a "Debug source:" dump of its retry state ("retry_timeout: 180s"),
    # which would make every error look like a timeout.
    return str(exc or "").split("Debug source:", 1)[0]


def transient(exc: BaseException) -> str | None:
    """'throttled', 'dropped' or None (not worth a retry)."""
    if not isinstance(exc, StoreError) or isinstance(exc, atomic.FileExists):
        return None
    text = f"{_said(exc)} {_said(exc.__cause__)}"
    if _THROTTLED.search(text):
        return "throttled"
    if _DROPPED.search(text):
        return "dropped"
    return None


class _RetryRanged(Ranged):
    def __init__(self, outer: "RetryBackend", inner: Ranged) -> None:
        self._outer, self._inner, self.size = outer, inner, inner.size

    def read(self, offset: int, nbytes: int) -> bytes:
        return self._outer._retry(lambda: self._inner.read(offset, nbytes))

    def close(self) -> None:
        self._inner.close()


class RetryBackend(Backend):
    def __init__(self, inner: Backend) -> None:
        self.inner = inner
        self.location, self.connections, self.shared = inner.location, inner.connections, inner.shared
        self.counts = {"throttled": 0, "dropped": 0, "gave_up": 0}
        self._mutex = threading.Lock()

    def _retry(self, fn):
        delay = knobs.STORE_BACKOFF_S
        for attempt in range(knobs.STORE_RETRIES + 1):
            try:
                return fn()
            except StoreError as exc:
                kind = transient(exc)
                with self._mutex:
                    if kind is None:
                        raise
                    if attempt == knobs.STORE_RETRIES:
                        self.counts["gave_up"] += 1
                        raise
                    self.counts[kind] += 1
            _sleep(delay * (0.5 + random.random()))
            delay *= 2
        raise AssertionError("unreachable")

    def put(self, key, parts, *, direct=False):
        parts = list(parts)  # a retry sends the same bytes again
        return self._retry(lambda: self.inner.put(key, parts, direct=direct))

    def commit(self, key, data):
        tries = []

        def once():
            try:
                self.inner.commit(key, data)
            except atomic.FileExists:
                # A retry whose first try reached the store, the answer lost: the object is ours.
                if tries and self.inner.get(key) == bytes(data):
                    return
                raise
            finally:
                tries.append(1)

        return self._retry(once)

    def get(self, key):
        return self._retry(lambda: self.inner.get(key))

    def get_ranges(self, key, ranges):
        return self._retry(lambda: self.inner.get_ranges(key, ranges))

    def open(self, key):
        return _RetryRanged(self, self._retry(lambda: self.inner.open(key)))

    def size(self, key):
        return self._retry(lambda: self.inner.size(key))

    def exists(self, key):
        return self._retry(lambda: self.inner.exists(key))

    def list(self, prefix=""):
        return self._retry(lambda: self.inner.list(prefix))

    def list_tree(self, prefix):
        return self._retry(lambda: self.inner.list_tree(prefix))

    def delete(self, key):
        return self._retry(lambda: self.inner.delete(key))

    def synced(self, prefix, *, drop_empty=False):
        return self.inner.synced(prefix, drop_empty=drop_empty)

    def append(self, key, data):
        return self._retry(lambda: self.inner.append(key, data))

    def lock(self, purpose):
        return self.inner.lock(purpose)
