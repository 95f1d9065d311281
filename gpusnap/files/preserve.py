"""The files a restart cannot write back, kept from the replay's hands until the merge.

A snapshot keeps a file's content while the kept files fit in ``--files-max``; a larger one (a
checkpoint of a large model) is recorded by its length and last bytes only. The restart's first
pass leaves such a file as it is, where it only grew. But the replay runs the program's setup
again, and a setup that starts from a clean output directory (``shutil.rmtree(run_dir)``), or
rotates the last run's file away (``os.replace(log, log + ".old")``), removed the run's
checkpoint for good: the merge's pass had nothing to write back, said so in a warning, and the
restarted run ended without it, exit 0 (corpus/clean_start.py with a small ``--files-max``, 2 of
2).

So from the replay's first line to the merge, before the replay removes, renames, replaces or
rewrites such a file (or a directory holding one), the audit hook keeps it: a hard link in
``DIR/after-<id>.replay/`` (its content outlives the removal; a copy where the run directory is
on another file system, or where the file is rewritten in place). The merge's pass
(``rollback.settle``) puts each back from there; what is left there afterwards is removed.
Each kept path is a line of ``kept.jsonl`` there, as the verify's guard writes its own: the replay's
DataLoader workers keep theirs too.
"""

from __future__ import annotations

import os
import shutil

from gpusnap.files import guard
from gpusnap.files.paths import ancestors
from gpusnap.store.info import AFTER, REPLAY_KEPT

_DESTROYS = frozenset({"remove", "moved", "replaced", "rewrite"})  # watch's kinds that end a file's content there

_dir: str | None = None
_guarded: frozenset[str] = frozenset()  # the files the snapshot holds by length only
_holding: frozenset[str] = frozenset()  # the directories above them
_kept: set[str] = set()


def stash_dir(run_dir: str, snap_id: str) -> str:
    return os.path.join(run_dir, f"{AFTER}{snap_id}{REPLAY_KEPT}")


def install(table: dict, run_dir: str, snap_id: str) -> None:
    """Before the replay's first line: guard the files of snapshot ``snap_id``'s table that it
    holds by length only."""
    global _dir, _guarded, _holding
    guarded = {e["path"] for e in table.get("entries") or () if e.get("kind") == "file" and not e.get("buffer")}
    if not guarded:
        return
    _dir, _guarded = stash_dir(run_dir, snap_id), frozenset(guarded)
    _holding = frozenset(at for path in guarded for at in ancestors(path))


def uninstall() -> None:
    global _dir, _guarded, _holding
    _dir, _guarded, _holding = None, frozenset(), frozenset()
    _kept.clear()


def keep(path: str, kind: str) -> None:
    """``watch``'s, before the replay's first write of kind ``kind`` to ``path``."""
    if _dir is None or kind not in _DESTROYS:
        return
    if path in _guarded:
        _keep([path], copy=kind == "rewrite")
    elif path in _holding and kind != "rewrite":
        _keep([p for p in _guarded if p.startswith(path + "/")], copy=False)


def _keep(paths, copy: bool) -> None:
    """``copy``: the file is about to be rewritten in place, where a link would see the new
    content."""
    records = []
    for path in paths:
        if path in _kept or not os.path.isfile(path):
            continue
        _kept.add(path)
        os.makedirs(_dir, mode=0o700, exist_ok=True)
        to = os.path.join(_dir, f"{os.getpid()}-{len(_kept)}-{os.urandom(4).hex()}")
        if (copy or not _linked(path, to)) and not _copied(path, to):
            continue  # (not kept: the merge's pass says it is left as the replay wrote it)
        records.append({"path": path, "copy": to})
    if records:
        guard.note_kept(_dir, records)


def _linked(path: str, to: str) -> bool:
    try:
        os.link(path, to)
        return True
    except OSError:  # the run directory is on another file system
        return False


def _copied(path: str, to: str) -> bool:
    try:
        shutil.copy2(path, to)
        return True
    except OSError:
        return False


def kept(folder: str | None = None) -> dict[str, str]:
    """path -> its kept copy in ``folder`` (this replay's), the last kept of each that is there
    still: a restart refused before its merge left its copies, which the next restart's first
    pass puts back (``left_by``), and its replay keeps again what it takes away again."""
    folder = folder or _dir
    if folder is None:
        return {}
    return {r["path"]: r["copy"] for r in guard.read_kept(folder) if os.path.lexists(r["copy"])}


def release() -> dict[str, str]:
    """At the merge, before its pass writes: what was kept (``kept``), and nothing more kept from
    here on (the pass's own moves and writes are no replay's)."""
    global _guarded, _holding
    found = kept()
    _guarded, _holding = frozenset(), frozenset()
    return found


def left_by(run_dir: str, snap_id: str) -> dict[str, str]:
    """What an earlier restart from snapshot ``snap_id`` kept from its replay and never put back
    (refused, or killed, before its merge): for the next restart's first pass."""
    return kept(stash_dir(run_dir, snap_id))


def put(path: str, copy: str, in_place: bool) -> None:
    """Put the kept ``copy`` back at ``path``: into the file itself where the program holds it
    open (its descriptors then write on where the snapshot left it), else in its place."""
    from gpusnap.files import disk

    if in_place:
        with guard.mapped(copy) as (data, mode):
            disk.write_in_place(path, data, mode)
        return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    guard.put_copy(copy, path)


def done(failed=()) -> None:
    """After the merge's pass: the kept copies go, unless one could not be put back (``failed``:
    the paths the pass could not put back), which stays there for the next restart."""
    if _dir is not None and not any(path in failed for path in kept()):
        shutil.rmtree(_dir, ignore_errors=True)
    uninstall()
