"""The file journal as a restart reads it: which paths the run touched after a snapshot, and
whether the journal can say so in full.

The trainee and its forked workers append the journal (``watch``) to a file in the run
directory's local level, through their own descriptor: lines come from several processes at
once, from inside the program's own calls (the audit hook), and only ``O_APPEND`` on a local file
keeps each line whole at the cost of one ``write``. Everything else reaches it through the run
directory's backend (``store.backend``): a restart reads it with ``get``, and appends its own
line with ``append``.

On a run directory on an object store the journal reaches the store by the levels' copy
(``store.levels``), put whole, before the manifest of each snapshot it copies (so a snapshot in
the store always has its marker there), and again whenever it grew. Each copy ends with a line
``{"copied": TIME, "closed": BOOL}``: ``closed`` when the run had ended (the supervisor's last
copy, once the trainee is gone), so that the copy is the whole journal. A copy that is not closed
was cut short by a lost machine: what the program first wrote after TIME is unknown. A restart
that finds such a line after its snapshot's marker refuses, unless the run's files were lost
with the machine too (none of the paths it knows is here) or ``--force``; once it has put the
files back it appends ``{"restarted": ID}``, after which the cut is settled: the files were put
back by what was known, and what followed is in the journal again.

A journal kept on the machine that wrote it is whole (a killed process's writes are in the page
cache), so a local run never meets a cut; a journal that lacks the snapshot's marker is cut too.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from gpusnap import moved

JOURNAL = "files.jsonl"


@dataclass
class After:
    """What a journal says of the paths touched after a snapshot's marker."""

    paths: dict = field(default_factory=dict)  # path -> its state before its first touch after the marker
    at: dict = field(default_factory=dict)  # path -> when that touch was (time_ns), where the journal says
    cut: str | None = None  # why writes after the marker may be missing from the journal, or None


def read(rd) -> bytes | None:
    """The journal of run directory ``rd`` (a shard's own), or None when it has none."""
    try:
        return rd.backend.get(JOURNAL)
    except FileNotFoundError:
        return None


def after(data: bytes | None, token: str | None) -> After:
    """path -> its state before its first touch, for every path the journal names after the
    marker ``token`` (the first line of each path after it counts), with when that was, and
    whether that is all.
    No journal at all says nothing (a verify's scratch copy has none)."""
    if not token or data is None:
        return After()
    found: dict = {}
    at: dict = {}
    seen = False
    cut = None
    for line in data.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a line torn by kill -9
        if not seen:
            seen = record.get("token") == token
            continue
        if "copied" in record:  # the end of a store's copy (store.levels)
            if not record.get("closed") and cut is None:
                cut = f"the run's file journal reached the store last at {record['copied']}"
            continue
        if "restarted" in record:  # a restart put the files back past the cut
            cut = None
            continue
        p = record.get("path")
        if p is not None and p not in found:
            found[p] = record.get("before")
            if record.get("at") is not None:
                at[p] = record["at"]
    if not seen:
        return After(cut="the run's file journal does not hold the snapshot's marker")
    return After(paths=moved.here(found), at=moved.here(at), cut=cut)


def restarted(rd, snap_id: str) -> None:
    """Say in ``rd``'s journal that a restart from ``snap_id`` settled a cut."""
    rd.backend.append(JOURNAL, json.dumps({"restarted": snap_id, "pid": os.getpid()}, separators=(",", ":")).encode() + b"\n")
