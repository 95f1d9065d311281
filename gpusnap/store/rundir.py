"""The run directory: identity, manifests, and the entry points of every store operation.

Order of calls for a snapshot (see docs/FORMAT.md, "Write order")::

    rd = RunDir.create(path, identity)      # or RunDir.open(path)
    with rd.lock("run"):                    # the supervisor holds it for the whole run
        w = rd.begin_snapshot(rd.next_snapshot_id())   # in the forked writer
        rec = w.put_buffer(...)             # any number of times
        info = w.commit(manifest)           # or w.abort()
"""

from __future__ import annotations

import json
import os
import pathlib
import secrets
import stat

from gpusnap import atomic, moved
from gpusnap.errors import (
    FormatVersionError,
    RunDirError,
    RunDirMismatch,
    RunDirPermission,
    SnapshotNotFound,
    StoreError,
)
from gpusnap.store.backend import Backend
from gpusnap.store.info import AFTER, FORMAT_VERSION, SNAP_DIGITS, SnapshotInfo, by_number, is_snapshot_id, snapshot_id, utc_now  # noqa: F401  (re-exported)
from gpusnap.store.local import LocalBackend
from gpusnap.store.lock import RunLock
from gpusnap.trust import TRUST_HINT, untrusted

RUN_JSON = "run.json"


def _describe_command_difference(old: dict, new: dict) -> str:
    old = old or {}
    new = new or {}
    parts = []
    if old.get("kind") != new.get("kind") or old.get("target") != new.get("target"):
        what = "module" if new.get("kind") == "module" else "script"
        parts.append(f"the {what} differs ({old.get('target')!r} there, {new.get('target')!r} here)")
    if old.get("args") != new.get("args"):
        parts.append(f"the argument list differs ({old.get('args')!r} there, {new.get('args')!r} here)")
    for key in sorted(set(old) | set(new)):
        if key not in ("kind", "target", "args") and old.get(key) != new.get(key):
            parts.append(f"{key} differs ({old.get(key)!r} there, {new.get(key)!r} here)")
    return "; ".join(parts) or "the command differs"


class RunDir:
    """An opened run directory. Readers never see a half-written snapshot: a snapshot exists
    only once its manifest has been renamed into ``snapshots/``."""

    def __init__(self, path: pathlib.Path, doc: dict, backend: Backend | None = None) -> None:
        self.path = pathlib.Path(path) if backend is None or isinstance(backend, LocalBackend) else path
        # Every read, write, listing and lock of the directory goes through this (store.backend).
        self.backend: Backend = backend or LocalBackend(self.path)
        self.identity: dict = doc.get("identity") or {}
        self.created: str = doc.get("created", "")
        # Random, written once with run.json: it names this run's keys in a distributed job's
        # c10d store (capture.dist.coordinator), which a store left over from another run then cannot steer.
        self.nonce: str = str(doc.get("nonce") or json.dumps(doc, sort_keys=True))  # older directories: all of run.json

    # ---- opening

    @classmethod
    def create(cls, path, identity: dict) -> "RunDir":
        """Create a run directory (0700, parents too) or open the existing one for the same
        command."""
        path = pathlib.Path(path)
        if path.exists() and not path.is_dir():
            raise RunDirError(f"{path} exists and is not a directory")
        if (path / RUN_JSON).exists():
            rd = cls.open(path)
            rd.check_writable()
            if rd.identity.get("command") != identity.get("command"):
                raise RunDirMismatch(
                    f"{path} belongs to another command: "
                    + _describe_command_difference(rd.identity.get("command"), identity.get("command")),
                    hint="pass another --dir, or run the original command",
                )
            return rd
        if path.is_dir() and any(path.iterdir()):
            raise RunDirError(f"{path} is a non-empty directory that is not a gpusnap run directory")
        missing = [p for p in [path, *path.parents] if not p.exists()]
        for p in reversed(missing):
            atomic.make_dir(p)
            os.chmod(p, 0o700)  # mkdir's mode goes through the umask
        os.chmod(path, 0o700)
        rd = cls(path, {"identity": identity})
        rd.check_writable()
        for sub in ("snapshots", "index", "packs"):
            atomic.make_dir(path / sub)
        doc = {"format": FORMAT_VERSION, "created": utc_now(), "identity": identity, "nonce": secrets.token_hex(16)}
        try:
            atomic.write_file(path / RUN_JSON, [json.dumps(doc, indent=1, sort_keys=True).encode()], noreplace=True)
        except atomic.FileExists:  # another node's supervisor made it first (store.shards.create_top)
            return cls.create(path, identity)
        rd.created, rd.nonce = doc["created"], doc["nonce"]
        return rd

    @classmethod
    def open(cls, path, *, trusted: bool = False, backend: Backend | None = None) -> "RunDir":
        """Open an existing run directory. ``trusted=True`` (restore, which unpickles) also
        refuses one that another user owns or that others can write to (``check_trusted``).
        ``backend``: where it lives when that is not the local directory ``path``."""
        if backend is None:
            path = pathlib.Path(path)
            backend = LocalBackend(path)
        try:
            raw = backend.get(RUN_JSON)
        except (FileNotFoundError, NotADirectoryError):
            raise RunDirError(f"{path} is not a gpusnap run directory", hint="pass the directory given to `gpusnap run --dir`") from None
        except PermissionError as exc:
            raise RunDirPermission(f"cannot read {path / RUN_JSON}: {exc.strerror}") from exc
        try:
            doc = json.loads(raw)
        except ValueError as exc:
            raise RunDirError(f"{path / RUN_JSON} is damaged: {exc}") from exc
        fmt = doc.get("format")
        if fmt != FORMAT_VERSION:
            raise FormatVersionError(f"{path} has format {fmt!r}; this gpusnap knows format {FORMAT_VERSION}")
        rd = cls(path, doc, backend)
        if trusted:
            rd.check_trusted()
        return rd

    @property
    def local(self) -> bool:
        """On a file system: owner, mode and symbolic links are the OS's to check. An object
        store has none of them (see ``check_owner``)."""
        return isinstance(self.backend, LocalBackend)

    def check_owner(self) -> None:
        """The directory itself is the user's own and nobody else can write to it.

        On an object store nothing is checked here, because nothing can be: an object has no
        owner or mode a client can read (S3 has disabled ACLs by default since 2023; who may write
        under a prefix is decided by bucket and IAM policies, which a client cannot evaluate, and
        GCS and Azure are alike). Whoever those policies let write under the prefix can make a
        restart run code, as whoever can write a local run directory can: keeping the prefix
        writable only by those who run gpusnap is the bucket owner's part. What gpusnap does
        check is the local level a restart reads from and unpickles (``store.levels.fetch``
        makes it 0700, and ``RunDir.open(..., trusted=True)`` checks it as any local directory),
        and that it caches the same run as the store (``run.json``'s nonce)."""
        if not self.local:
            return
        why = untrusted(os.stat(self.path))
        if why is not None:
            raise RunDirPermission(f"{self.path} {why}; a run directory is trusted data (restoring it runs code)",
                                   hint=TRUST_HINT)

    def check_trusted(self) -> None:
        """Before a restore or a lock: the directory and everything in it (shards included) is
        the user's own, nobody else can write to it, and none of it is a symbolic link. A
        snapshot is code: restart unpickles it, imports the modules it names and runs the
        command ``run.json`` records, so whoever can write here could run code as the user.
        What a restart moved aside of the program's files (``after-<id>/``) is checked as an
        entry but not within: gpusnap never reads it, and it holds what the program made, its
        symbolic links (a `latest` checkpoint's) and modes (a umask of 002) included."""
        self.check_owner()
        if not self.local:
            return  # no owners, modes or links in an object store: check_owner says what holds instead
        for dirpath, dirs, files in os.walk(self.path):
            for name in [d for d in dirs if d.startswith(AFTER)]:  # (a shard's own too)
                dirs.remove(name)
                files.append(name)  # its own entry, as a file's
            for name in dirs + files:
                entry = pathlib.Path(dirpath, name)
                try:
                    why = untrusted(os.lstat(entry))
                except FileNotFoundError:
                    continue  # a temp file its writer renamed or removed meanwhile
                if why is not None:
                    hint = f"remove it (rm {entry}); gpusnap never follows one in a run directory" \
                        if why == "is a symbolic link" else TRUST_HINT
                    raise RunDirPermission(f"{entry} {why}; a run directory is trusted data (restoring it runs code)", hint=hint)

    def check_writable(self) -> None:
        """Refuse a directory that is read-only to its owner even when we are root (root would
        bypass the mode bits and silently write into a directory someone froze)."""
        self.check_owner()
        if not self.local:
            return  # no mode: the store refusing the lock object, before the program starts, is the answer (RunDirPermission)
        mode = os.stat(self.path).st_mode
        if not (mode & stat.S_IWUSR) or not os.access(self.path, os.W_OK):
            raise RunDirPermission(
                f"{self.path} is read-only (mode {stat.S_IMODE(mode):04o})",
                hint="make it writable (chmod u+w) or pass another --dir",
            )

    def lock(self, purpose: str) -> RunLock:
        """Take the lock, once the directory has been found trusted: the lock's holder writes
        what the next restart will run."""
        self.check_trusted()
        return self.backend.lock(purpose)

    # ---- snapshots

    def snapshot_ids(self) -> list[str]:
        """Ids of every committed manifest file, readable or not, oldest first. A file in
        snapshots/ whose name is no snapshot id is no snapshot."""
        try:
            names = self.backend.list("snapshots")
        except FileNotFoundError:
            return []
        return by_number(n[: -len(".json")] for n in names if n.endswith(".json") and is_snapshot_id(n[: -len(".json")]))

    def checked_id(self, snap_id) -> str:
        """``snap_id`` when it is a snapshot id, else SnapshotNotFound: an id read from anywhere
        becomes part of a path only through here."""
        if not is_snapshot_id(snap_id):
            raise SnapshotNotFound(f"no snapshot {snap_id!r} in {self.path}: a snapshot id is {SNAP_DIGITS} or more digits, "
                                   f"such as {snapshot_id(1)}")
        return snap_id

    def load_manifest(self, snap_id: str) -> dict:
        """Read one manifest; SnapshotNotFound if absent, StoreError if unreadable."""
        key = f"snapshots/{self.checked_id(snap_id)}.json"
        try:
            raw = self.backend.get(key)
        except FileNotFoundError:
            raise SnapshotNotFound(f"no snapshot {snap_id} in {self.path}") from None
        try:
            m = json.loads(raw)
            if not isinstance(m, dict) or not isinstance(m.get("buffers"), dict):
                raise ValueError("no buffers table")
        except ValueError as exc:
            raise StoreError(f"manifest of snapshot {snap_id} is damaged: {exc}") from exc
        if m.get("format") != FORMAT_VERSION:
            raise FormatVersionError(
                f"snapshot {snap_id} has format {m.get('format')!r}; this gpusnap knows format {FORMAT_VERSION}"
            )
        m["id"] = snap_id
        return moved.here(m)

    def snapshots(self) -> list[SnapshotInfo]:
        """Committed snapshots whose manifest reads, oldest first (verify reports the others)."""
        out = []
        for sid in self.snapshot_ids():
            try:
                out.append(SnapshotInfo.from_manifest(self.load_manifest(sid)))
            except FormatVersionError:
                raise
            except StoreError:
                continue
        return out

    def next_snapshot_id(self) -> str:
        ids = [int(s) for s in self.snapshot_ids()]
        return snapshot_id(max(ids) + 1 if ids else 1)

    def resolve(self, snap_id: str | None) -> str:
        if snap_id is not None:
            return self.checked_id(snap_id)
        ids = self.snapshot_ids()
        if not ids:
            raise SnapshotNotFound(f"{self.path} has no snapshot yet", hint="take one with SIGUSR1 or `gpusnap run --every`")
        return ids[-1]

    def manifest(self, snap_id: str | None = None) -> dict:
        return self.load_manifest(self.resolve(snap_id))

    def begin_snapshot(self, snap_id: str, *, chunk_bytes: int | None = None, pack_bytes: int | None = None,
                       codec: str | None = None, lock_token: str | None = None, setup=None):
        """Start writing snapshot ``snap_id``; the sizes and the codec override
        knobs.CHUNK_BYTES, knobs.PACK_BYTES and knobs.CODEC for this writer only (tests, bench).
        ``lock_token``: the token of the lock the writer writes under (its run's), which must
        still be in the lock file when it commits. ``setup``: how the writer runs
        (``store.writer.WriterSetup``: a forked writer's threads, their priority, its windows)."""
        from gpusnap.store.writer import SnapshotWriter

        self.check_writable()
        if not is_snapshot_id(snap_id):
            raise StoreError(f"{snap_id!r} is no snapshot id: a snapshot id is {SNAP_DIGITS} or more digits")
        if self.backend.exists(f"snapshots/{snap_id}.json"):
            raise StoreError(f"snapshot {snap_id} already exists in {self.path}; committed snapshots are never rewritten")
        return SnapshotWriter(self, snap_id, chunk_bytes=chunk_bytes, pack_bytes=pack_bytes, codec=codec,
                              lock_token=lock_token, setup=setup)

    # ---- witnesses (store.witness)

    def write_witness(self, snap_id: str, data: bytes) -> None:
        from gpusnap.store import witness

        witness.write(self.backend, snap_id, data)

    def load_witness(self, snap_id: str) -> dict | None:
        from gpusnap.store import witness

        doc = witness.read(self.backend, snap_id)
        return moved.here(doc)

    # ---- reading, checking, pruning (implemented in their own modules)

    def read_buffer(self, record: dict, *, snapshot: str | None = None) -> bytearray:
        from gpusnap.store.reader import read_buffer

        return read_buffer(self, record, snapshot=snapshot)

    def verify(self, snap_id: str | None = None) -> list:
        if self.identity.get("dist"):  # a sharded directory: its global snapshots' shards
            from gpusnap.store.shards import verify
        else:
            from gpusnap.store.check import verify

        return verify(self, snap_id)

    def newest_intact(self):
        if self.identity.get("dist"):
            from gpusnap.store.shards import newest_intact
        else:
            from gpusnap.store.check import newest_intact

        return newest_intact(self)

    def prune(self, keep: int | None, drop: list[str] | None = None) -> dict:
        from gpusnap.store.gc import prune

        return prune(self, keep, drop)
