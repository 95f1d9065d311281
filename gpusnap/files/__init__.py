"""The program's files: they roll back with it.

A snapshot holds the program's memory; the files it wrote are part of its state too (a CSV
logger's header, a checkpoint rotated away, a results file rewritten every epoch). This package
records them and puts them back:

    watch      the audit hook: every path the program (and its forked workers) writes, with its
               state before the first write; the run's journal (``DIR/files.jsonl``)
    journal    the journal as a restart reads it, and whether it is whole (a store's copy of a
               run whose machine was lost is cut short)
    record     at each snapshot: in the stall, what changed and what to read; in the writer,
               contents through the store's chunks, and the manifest's ``files`` table
    rollback   on restart: before the replay (the supervisor), the files go back to the
               snapshot's state, anything newer moved into ``DIR/after-<id>/``; at the merge
               (the trainee), what the replayed setup wrote is undone
    disk       what that does to the file system: moves aside, writes, cuts, the program's
               open files
    paths      normalizing paths, and the excluded ones

The calls below are the whole interface: boot's agent installs, the capture agent stages and
the writer puts, the supervisor rolls back, the replay settles. Layers (tests/test_layers.py):
``files`` reads and writes through ``store`` and imports nothing above it. What it keeps in the
run directory (the journal, ``after-<id>/``) goes through the directory's backend where it is
not the program's own writing (``journal``, ``rollback``: why the journal's writers and the
moves aside stay file-system calls on the local level).
"""

from __future__ import annotations

import os
import sys

from gpusnap import knobs
from gpusnap.files import guard, preserve, record, rollback, watch
from gpusnap.files.paths import DEFAULT_EXCLUDES, Excludes
from gpusnap.store.info import AFTER

__all__ = ["DEFAULT_EXCLUDES", "install", "stage", "forked", "put", "protect", "settle", "before_replay", "refused_elsewhere"]


def install(config: dict, shard_dir: str, always_excluded=()) -> None:
    """Watch the program's writes (the trainee, before its first line). ``config`` is the boot
    configuration: ``files`` holds ``exclude`` (patterns after the defaults) and ``max_bytes``;
    ``files: false`` turns the watch off."""
    options = config.get("files")
    if options is False or not config.get("run_dir"):
        return
    options = options or {}
    if "/" in (options.get("exclude") or ()):
        return  # --files-exclude /: every file is left alone, and nothing is watched
    patterns = [*DEFAULT_EXCLUDES, *(options.get("exclude") or ())]
    cwd = os.getcwd()
    excludes = Excludes(patterns, cwd, always=[config["run_dir"], os.path.realpath(config["run_dir"]), *always_excluded])
    try:
        watch.install(os.path.join(shard_dir, watch.JOURNAL), excludes)
    except OSError as exc:  # the program runs on; its snapshots keep no file, and say nothing of them
        print(f"gpusnap: warning: the program's files will not be kept: cannot open the file journal in {shard_dir}: "
              f"{exc.strerror or exc}", file=sys.stderr, flush=True)
        return
    record.install(knobs.FILES_MAX_BYTES if options.get("max_bytes") is None else options["max_bytes"])
    if config.get("verify_replay"):
        guard.install(os.path.join(config["run_dir"], guard.GUARD_DIR))


stage = record.stage
forked = record.forked
put = record.put


def settle(rundir, manifest: dict, config: dict, say) -> dict | None:
    """At the merge: undo what the replayed setup wrote, then carry the snapshot's files on."""
    table = manifest.get("files")
    if not watch.active() or not table:
        return None
    if not rollback.ours(table, config):
        return None  # another node's files
    after = (config.get("files") or {}).get("after") or os.path.join(str(rundir.path), f"{AFTER}{manifest['id']}")
    source = rollback.Source(manifest["id"], table, manifest.get("buffers") or {},
                             lambda record: rundir.read_buffer(record, snapshot=manifest["id"]))
    plan = rollback.settle(source, after, preserve.release())
    plan.apply()
    preserve.done({path for path, _ in plan.failed})
    record.resumed(manifest["id"], table)
    for path, why in plan.problems:
        say(f"warning: {path} is left as the replay wrote it: it was {why}")
    for path, why in plan.failed:
        say(f"warning: {path} is left as the replay wrote it: it {why}")
    return plan.report()


def protect(rundir, manifest: dict, config: dict) -> None:
    """Before the replay's first line: keep from its hands the files its snapshot holds by
    length only (``preserve``), until ``settle`` puts them back."""
    table = manifest.get("files")
    if watch.active() and table and rollback.ours(table, config):
        preserve.install(table, str(rundir.path), manifest["id"])


before_replay = rollback.before_replay
refused_elsewhere = rollback.refused_elsewhere
