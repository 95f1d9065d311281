"""Storage: the small interface every access to a run directory goes through.

A run directory is a set of named objects; a *key* is a '/'-separated name relative to it
(``run.json``, ``snapshots/000003.json``, ``packs/93/93….pack``). A backend stores them:
``store.local`` a directory on a file system (local disk, NFS, Lustre), ``store.objects`` an
object store (S3 and what speaks its protocol), ``store.memory`` a dict (tests). Retries and
throttling are a wrapper around any of them (``store.retry``), not part of each. Nothing above
this interface knows which backend it has; ``of()`` gives the one a run directory uses.

Order in which a snapshot calls it (docs/FORMAT.md, "Write order")::

    b.put("packs/93/93….pack", [data])       # any number, in parallel up to b.connections
    b.put("index/000003-5c1e09aa.json", [doc])
    b.commit("snapshots/000003.json", doc)    # last: the snapshot exists from here on

and a restore::

    b.list("snapshots")                       # names, as os.listdir
    b.get("snapshots/000003.json")
    with b.open("packs/93/93….pack") as r:    # ranged reads, in parallel on other handles
        r.read(offset, nbytes)

A key that does not exist raises ``FileNotFoundError`` from every method, whatever the backend.
Other failures raise ``StoreError`` (or its subclasses: ``NoSpace``) or ``RunDirPermission``.
"""

from __future__ import annotations

import pathlib


class Ranged:
    """An open object for reads by range (restic's ``Load(handle, length, offset)``)."""

    size: int

    def read(self, offset: int, nbytes: int) -> bytes:
        """Up to ``nbytes`` from ``offset``: fewer only at the object's end."""
        raise NotImplementedError

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Backend:
    """Where a run directory's objects live. ``location`` names it in messages (a path or a
    URL); ``connections`` is how many requests may run at once (1 for a disk: its own
    parallelism is the writer's threads)."""

    location: str = ""
    connections: int = 1
    shared: bool = False  # the next machine can read it (an object store); a local disk may not

    def put(self, key: str, parts, *, direct: bool = False) -> int:
        """Store ``parts`` (bytes-like) as ``key``, whole or not at all; replaces an existing
        object. ``direct``: a hint that the data need not stay in any cache. Returns bytes."""
        raise NotImplementedError

    def commit(self, key: str, data: bytes) -> None:
        """``put`` that never replaces: ``atomic.FileExists`` when ``key`` exists, decided by
        the store itself (a rename that does not replace, a conditional put), not by a check
        before it. A manifest's commit."""
        raise NotImplementedError

    def get(self, key: str) -> bytes:
        raise NotImplementedError

    def copies_on_put(self, prefix: str) -> bool:
        """Whether ``put`` of a large object under ``prefix`` copies its bytes on their way
        anyway, so that the writer may hand it the pieces where they lie (tmpfs, a file system
        that refuses O_DIRECT: into the page cache), rather than one buffer it writes from
        without a copy (O_DIRECT to a disk) or sends as one body (an object store)."""
        return False

    def open(self, key: str) -> Ranged:
        raise NotImplementedError

    def get_ranges(self, key: str, ranges: list[tuple[int, int]]) -> list[bytes]:
        """Several (offset, nbytes) ranges of one object; an object store requests them in
        parallel (up to ``connections``)."""
        with self.open(key) as r:
            return [r.read(o, n) for o, n in ranges]

    def size(self, key: str) -> int:
        raise NotImplementedError

    def exists(self, key: str) -> bool:
        try:
            self.size(key)
        except FileNotFoundError:
            return False
        return True

    def list(self, prefix: str = "") -> list[str]:
        """Names directly under ``prefix`` (objects and sub-prefixes), as ``os.listdir``;
        FileNotFoundError when there are none."""
        raise NotImplementedError

    def list_tree(self, prefix: str) -> list[str]:
        """Every key under ``prefix``, relative to it, at any depth (an object store: one
        paginated listing rather than one per level)."""
        out = []
        try:
            names = self.list(prefix)
        except (FileNotFoundError, NotADirectoryError):
            return out
        for name in names:
            sub = join(prefix, name)
            below = self.list_tree(sub) if not self.exists(sub) else []
            out += [join(name, k) for k in below] if below else [name]
        return out

    def delete(self, key: str) -> None:
        """Remove ``key``; no error when it is gone already."""
        raise NotImplementedError

    def synced(self, prefix: str, *, drop_empty: bool = False) -> None:
        """After a batch of deletes under ``prefix``: make them durable (a directory fsync);
        ``drop_empty``: and remove the prefix itself when nothing is left in it."""

    def append(self, key: str, data: bytes) -> None:
        """Add ``data`` at the end of ``key`` (the run log), creating it when missing."""
        raise NotImplementedError

    def lock(self, purpose: str):
        """Take the run directory's lock (``store.lock.RunLock`` or the store's equivalent)."""
        raise NotImplementedError


def of(where) -> Backend:
    """The backend of a run directory: a ``Backend`` itself, a ``RunDir``'s, or a local
    directory's for a path (what older callers and tests pass)."""
    if isinstance(where, Backend):
        return where
    backend = getattr(where, "backend", None)
    if isinstance(backend, Backend):
        return backend
    from gpusnap.store.local import LocalBackend

    return LocalBackend(pathlib.Path(where))


def join(*parts: str) -> str:
    return "/".join(p.strip("/") for p in parts if p)
