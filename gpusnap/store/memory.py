"""A run directory in a dict: the backend the tests of the interface itself use (every verb,
no disk), and the model the other backends are checked against."""

from __future__ import annotations

import threading

from gpusnap import atomic
from gpusnap.store.backend import Backend, Ranged


class _Bytes(Ranged):
    def __init__(self, data: bytes) -> None:
        self._data, self.size = data, len(data)

    def read(self, offset: int, nbytes: int) -> bytes:
        return self._data[offset : offset + nbytes]


class MemoryBackend(Backend):
    def __init__(self, location: str = "memory://") -> None:
        self.location = location
        self.objects: dict[str, bytes] = {}
        self._mutex = threading.Lock()

    def put(self, key: str, parts, *, direct: bool = False) -> int:
        data = b"".join(bytes(p) for p in parts)
        with self._mutex:
            self.objects[key] = data
        return len(data)

    def commit(self, key: str, data: bytes) -> None:
        with self._mutex:
            if key in self.objects:
                raise atomic.FileExists(f"{self.location}/{key} exists already: a committed object is never replaced")
            self.objects[key] = bytes(data)

    def get(self, key: str) -> bytes:
        try:
            return self.objects[key]
        except KeyError:
            raise FileNotFoundError(key) from None

    def open(self, key: str) -> Ranged:
        return _Bytes(self.get(key))

    def size(self, key: str) -> int:
        return len(self.get(key))

    def list(self, prefix: str = "") -> list[str]:
        head = prefix.strip("/") + "/" if prefix.strip("/") else ""
        names = {k[len(head):].split("/", 1)[0] for k in self.objects if k.startswith(head)}
        if not names:
            raise FileNotFoundError(prefix)
        return sorted(names)

    def delete(self, key: str) -> None:
        with self._mutex:
            self.objects.pop(key, None)

    def append(self, key: str, data: bytes) -> None:
        with self._mutex:
            self.objects[key] = self.objects.get(key, b"") + bytes(data)

    def lock(self, purpose: str):
        raise NotImplementedError("a memory store has one process: nothing to lock out")
