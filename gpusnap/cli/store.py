"""`gpusnap ls`, `inspect`, `verify`, `gc`, `export`: look into a run directory, check it, trim
it, take the weights out of it. Nothing here imports torch; export imports numpy lazily."""

from __future__ import annotations

import json
import time

import click

from gpusnap.cli import cli, trust_dir_option
from gpusnap.errors import GpusnapError, SnapshotNotFound, StoreDamaged, UsageError


def _open(path: str):
    """The run directory DIR names: a local one, or the shared level of a URL (read there)."""
    from gpusnap.store import RunDir, location

    local, url = location.resolve(path)
    return location.open_shared(url) if url is not None else RunDir.open(local)


def human_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    x = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if x < 1024 or unit == "TiB":
            return f"{int(x)} {unit}" if unit == "B" else f"{x:.1f} {unit}"
        x /= 1024
    return f"{n} B"


def _secs(x) -> str:
    return "-" if x is None else f"{x:.3f} s"


def _ratio(x) -> str:
    return "-" if not x else f"{x:.2f}x"


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


@cli.command("ls")
@click.argument("run_dir", metavar="DIR")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of snapshots.")
def ls_cmd(run_dir, as_json):
    """List the committed snapshots of DIR, oldest first."""
    rd = _open(run_dir)
    snaps, level = rd.snapshots(), _levels(rd)
    if level is not None:  # a URL: the snapshots this machine committed that have not reached the store yet too
        snaps = sorted(snaps + [s for s in level.pop(None).snapshots() if s.id not in {x.id for x in snaps}],
                       key=lambda s: int(s.id))
        # One committed on this machine since the levels were read is local only.
        level = {s.id: level.get(s.id, "local") for s in snaps}
    if as_json:
        click.echo(json.dumps([dict(s.to_json(), **({"level": level[s.id]} if level is not None else {})) for s in snaps],
                              indent=1))
        return
    if not snaps:
        click.echo(f"no snapshots in {rd.path}")
        return
    rows = [["ID", "CREATED", "ITERATION", "STALL", "DURABLE", "DIRTY", "WRITTEN", "TOTAL", "INTERVAL", "OVERHEAD",
             "RESUMED FROM"] + (["LEVEL"] if level is not None else [])]
    for s in snaps:
        rows.append([s.id, s.created, "-" if s.iteration is None else str(s.iteration),
                     _secs(s.stall_s), _secs(s.durable_s),
                     "-" if s.dirty_bytes is None else human_bytes(s.dirty_bytes),
                     human_bytes(s.bytes_written), human_bytes(s.bytes_total), _interval(s.every, s.interval_s),
                     "-" if s.overhead is None else f"{s.overhead * 100:.2f}%", s.resumed_from or "-"]
                    + ([level[s.id]] if level is not None else []))
    for line in _table(rows):
        click.echo(line)


def _levels(rd) -> dict | None:
    """For the shared level of a URL: {snapshot id: "local", "shared" or "local+shared"}, and
    under None this machine's local level (an empty one when it has none). None for a path."""
    if rd.local:
        return None
    from gpusnap.store import RunDir, levels, location

    path = location.local_dir(rd.backend.location)
    try:
        local = RunDir.open(path)
    except GpusnapError:
        local = None
    out: dict = levels.levels(local, rd)
    out[None] = local or _NoSnapshots()
    return out


class _NoSnapshots:
    def snapshots(self) -> list:
        return []


def _interval(every, interval_s) -> str:
    """``auto 52 s`` (the interval --every auto kept), ``600 s`` (--every 10m), ``-``."""
    if every == "auto":
        return "auto" if interval_s is None else f"auto {interval_s:.0f} s"
    return "-" if interval_s is None else f"{interval_s:g} s"


def _shard_of(rd, snapshot: str | None, rank: int | None):
    """(the run directory to read, the snapshot id there, the global manifest or None): a
    sharded directory is read through one rank's shard, as its global manifest names it."""
    from gpusnap.store import shards

    if not shards.is_sharded(rd):
        if rank is not None:
            raise UsageError(f"{rd.path} is not a distributed run; --rank does not apply")
        return rd, snapshot, None
    top = rd.manifest(snapshot)
    rank = 0 if rank is None else rank
    named = shards.shards_of(top)
    if rank not in named:
        raise SnapshotNotFound(f"snapshot {top['id']} has no rank {rank} (its ranks: 0..{top.get('world_size', 0) - 1})")
    return shards.open_shard(rd, rank), named[rank], top


@cli.command("inspect")
@click.argument("run_dir", metavar="DIR")
@click.argument("snapshot", required=False, metavar="[SNAP]")
@click.option("--rank", type=int, default=None, metavar="R", help="A distributed run: show this rank's shard (default 0).")
@click.option("--json", "as_json", is_flag=True, help="Print the manifest and a summary as JSON.")
def inspect_cmd(run_dir, snapshot, rank, as_json):
    """Show what a snapshot (default: the newest) holds: roots, objects by path, buffers,
    live-only objects, dedup and compression ratios, stall and write times. In a distributed
    run, each rank's shard of the global snapshot, then one rank's contents (--rank)."""
    rd, snapshot, top = _shard_of(_open(run_dir), snapshot, rank)
    m = rd.manifest(snapshot)
    st = m.get("stats") or {}
    if as_json:
        click.echo(json.dumps({"global": top, "shard": m} if top is not None else m, indent=1))
        return
    echo = click.echo
    if top is not None:
        echo(f"global snapshot {top['id']} of {top.get('world_size')} ranks  created {top.get('created', '-')}  "
             f"iteration {top.get('iteration') if top.get('iteration') is not None else '-'}")
        rows = [["RANK", "SHARD", "STALL", "WRITE", "WRITTEN", "TOTAL"]]
        for r, shard in sorted((top.get("shards") or {}).items(), key=lambda kv: int(kv[0])):
            rows.append([r, shard.get("snapshot") or "-", _secs(shard.get("stall_s")), _secs(shard.get("write_s")),
                         human_bytes(shard.get("bytes_written")), human_bytes(shard.get("bytes_total"))])
        for line in _table(rows):
            echo("  " + line)
        echo(f"rank {rd.identity.get('rank')}:")
    head = f"snapshot {m['id']}  created {m.get('created', '-')}"
    head += f"  iteration {m.get('iteration') if m.get('iteration') is not None else '-'}"
    head += f"  reason {m.get('reason') or '-'}  resumed from {m.get('resumed_from') or '-'}"
    echo(head)
    echo(f"stall {_secs(m.get('stall_s'))}  write {_secs(m.get('write_s'))}")
    schedule = m.get("schedule")
    if schedule:
        budget = f" (budget {schedule['budget'] * 100:g}%)" if schedule.get("budget") else ""
        overhead = "-" if schedule.get("overhead") is None else f"{schedule['overhead'] * 100:.2f}%"
        every = _interval(schedule["every"], schedule.get("interval_s")) if schedule.get("every") else "none"
        echo(f"timer: {every}; snapshots so far cost {overhead} of training time{budget}")
    echo(
        f"bytes: {human_bytes(st.get('bytes_total'))} total, {human_bytes(st.get('bytes_new'))} new "
        f"(dedup {_ratio(st.get('dedup_ratio'))}), {human_bytes(st.get('bytes_written'))} written "
        f"(compression {_ratio(st.get('compression_ratio'))}); chunks {st.get('chunks_new', 0)} new "
        f"of {st.get('chunks_total', 0)}"
    )
    roots = m.get("roots") or {}
    echo("roots:")
    frames = roots.get("frames") or []
    echo("  frames:  " + (", ".join(f"{f.get('file')}:{f.get('line')} {f.get('function')}" for f in frames) or "-"))
    echo("  globals: " + (", ".join(roots.get("globals") or []) or "-"))
    echo("  rng:     " + (", ".join(roots.get("rng") or []) or "-"))
    objects = m.get("objects") or []
    echo(f"objects ({len(objects)}):")
    if objects:
        rows = [["PATH", "TYPE", "DTYPE", "SHAPE", "BUFFER"]]
        for o in objects:
            shape = o.get("shape")
            rows.append([o.get("path", "?"), o.get("type", "?"), o.get("dtype") or "",
                         "" if shape is None else str(list(shape)), o.get("buffer") or ""])
        for line in _table(rows):
            echo("  " + line)
    bufs = m.get("buffers") or {}
    echo(f"buffers ({len(bufs)}):")
    if bufs:
        rows = [["NAME", "KIND", "DTYPE", "SHAPE", "BYTES", "CHUNKS", "PATH"]]
        for name, b in bufs.items():
            shape = b.get("shape")
            rows.append([name, b.get("kind") or "-", b.get("dtype") or "-", "-" if shape is None else str(list(shape)),
                         human_bytes(b.get("nbytes")), str(len(b.get("chunks") or [])), b.get("path") or "-"])
        for line in _table(rows):
            echo("  " + line)
    _device_memory(m, echo)
    live = m.get("live_only") or []
    echo(f"live-only, not captured ({len(live)}):")
    for o in live:
        echo(f"  {o.get('path', '?')}  {o.get('type', '?')}")
    modules = m.get("modules") or {}
    if modules:
        echo(f"modules ({len(modules)}), exportable with `gpusnap export`:")
        for path, state in modules.items():
            echo(f"  {path}  {len(state)} tensors")


def _device_memory(m: dict, echo) -> None:
    """Device memory by kind, by owner (raw allocations by call site, tensors, arrays and
    cuda.core Buffers by object path; Buffers of pinned host memory too), what was copied and
    not kept, and what nothing accounts for."""
    allocations = m.get("allocations") or []
    device = m.get("device")
    if device is None:
        return
    owned = [(name, b) for name, b in (m.get("buffers") or {}).items()
             if (b.get("device") == "cuda" and b.get("dirty_bytes") is not None) or b.get("kind") == "core"]
    by_kind: dict[str, int] = {}
    for a in allocations:
        by_kind[a["kind"]] = by_kind.get(a["kind"], 0) + a["nbytes"]
    for _, b in owned:
        memory = b.get("memory", "device")
        by_kind[memory] = by_kind.get(memory, 0) + b["nbytes"]
    kinds = ", ".join(f"{kind} {human_bytes(n)}" for kind, n in sorted(by_kind.items())) or "-"
    echo(f"device memory: {kinds}; {human_bytes(device.get('dirty_bytes'))} dirty (copied off the GPU), "
         f"the rest reused from {device.get('reused_from') or '-'}")
    rows = [["OWNER", "API", "KIND", "DEVICE", "BYTES", "DIRTY", "BUFFER"]]
    for a in allocations:
        rows.append([f"{a['call_site']} #{a['ordinal']}", a["api"], a["kind"], str(a["device"]), human_bytes(a["nbytes"]),
                     human_bytes(a["dirty_bytes"]), a["buffer"]])
    for name, b in owned:
        api = "cuda.core Buffer" if b.get("kind") == "core" else f"{b.get('kind')} allocator"
        dirty = "-" if b.get("dirty_bytes") is None else human_bytes(b["dirty_bytes"])  # host memory: copied whole
        rows.append([b.get("path") or "?", api, b.get("memory", "device"), str(b.get("device_index", "-")),
                     human_bytes(b["nbytes"]), dirty, name])
    for line in _table(rows):
        echo("  " + line)
    for ordinal, nbytes in sorted((device.get("unreached_bytes") or {}).items()):
        echo(f"  unreached on device {ordinal}: {human_bytes(nbytes)} that the allocators handed out and no object "
             f"of the program's roots holds (workspaces, autograd's saved tensors): copied, not kept")
    for ordinal, nbytes in sorted((device.get("unaccounted_bytes") or {}).items()):
        echo(f"  unaccounted on device {ordinal}: {human_bytes(nbytes)} in use by nothing gpusnap reads (the CUDA "
             f"context, libraries' own memory, allocations made outside the allocators it knows): not in the snapshot")


@cli.command("verify")
@click.argument("run_dir", metavar="DIR")
@click.argument("snapshot", required=False, metavar="[SNAP]")
@click.option("--json", "as_json", is_flag=True, help="Print the findings as a JSON list.")
@click.option("--replay", is_flag=True,
              help="Restart SNAP (default: the newest intact) in a scratch copy of DIR, run the iterations its "
                   "witness recorded, compare, and stop: would this snapshot restart correctly? Exits 0 when they "
                   "match (or it has no witness: then it only restores), 6 when they differ. DIR is left as it is, "
                   "and so are the program's files: what the replay writes to them is put back afterwards.")
@click.option("-q", "--quiet", "verbosity", flag_value=0, default=None, help="--replay: only what went wrong and the verdict.")
def verify_cmd(run_dir, snapshot, as_json, replay, verbosity):
    """Read every chunk of SNAP (default: every snapshot) and check it against its name.
    Exits 4 when anything is damaged, and says what to run next.

    With --replay, restart SNAP in a scratch copy of DIR and check its first iterations against
    the witness the run that took it recorded (see `gpusnap restart`).

    \b
    Examples:
      gpusnap verify ./gpusnap-runs/train
      gpusnap verify --replay ./gpusnap-runs/train 000004
    """
    if replay:
        if as_json:
            raise UsageError("--json and --replay do not go together", hint="run them one at a time")
        from gpusnap.cli.run import verify_by_replay

        verify_by_replay(run_dir, snapshot, verbosity)
        return
    from gpusnap.store.check import leftovers

    rd = _open(run_dir)
    t0 = time.perf_counter()
    findings = rd.verify(snapshot)
    ids = [snapshot] if snapshot else rd.snapshot_ids()
    from gpusnap.store import shards

    extra = shards.leftovers(rd) if shards.is_sharded(rd) else leftovers(rd)
    if as_json:
        click.echo(json.dumps({"snapshots": ids, "findings": [f.to_json() for f in findings],
                               "leftovers": [{"kind": x.kind, "path": x.path} for x in extra]}, indent=1))
    else:
        click.echo(f"checked {len(ids)} snapshot{'s' if len(ids) != 1 else ''} in {time.perf_counter() - t0:.2f} s")
        bad = {f.snapshot for f in findings}
        for sid in ids:
            click.echo(f"  {sid}  {'DAMAGED' if sid in bad else 'ok'}")
        for f in findings:
            click.echo(str(f))
        if extra:
            click.echo(f"leftovers, not damage (`gpusnap gc {rd.path}` removes them):")
            for x in extra:
                click.echo(f"  {x.kind}  {x.path}")
    if not findings:
        if not as_json:
            click.echo("no damage")
        return
    damaged = sorted({f.snapshot for f in findings if f.snapshot})
    intact = [s for s in ids if s not in damaged]
    if any(f.snapshot is None for f in findings):
        intact = []
    if snapshot:
        hint = f"run `gpusnap verify {rd.path}` to check the other snapshots"
    elif intact:
        hint = f"restart from the newest intact snapshot: `gpusnap restart {rd.path} --snapshot {intact[-1]}`"
    else:
        hint = f"no snapshot verifies; start the program afresh with `gpusnap run --resume never --dir {rd.path}`"
    kinds = {f.kind for f in findings}
    if kinds & {"chunk_unindexed", "index_damaged"} and any(x.kind == "unindexed_pack" for x in extra):
        hint += f"; packs that no index names may hold the missing chunks: `gpusnap gc {rd.path}` re-indexes them"
    what = f"snapshot{'s' if len(damaged) != 1 else ''} {', '.join(damaged)}" if damaged else "the index"
    raise StoreDamaged(f"{len(findings)} problem{'s' if len(findings) != 1 else ''} found in {what}", hint=hint)


@cli.command("gc")
@click.argument("run_dir", metavar="DIR")
@click.option("--keep", type=int, default=None, metavar="N", help="Keep the newest N snapshots (default: all).")
@click.option("--json", "as_json", is_flag=True, help="Print what was removed as JSON.")
@trust_dir_option
def gc_cmd(run_dir, keep, as_json):
    """Remove the snapshots beyond the newest N, then every chunk, pack and temp file nothing
    references. Crash-safe at every step; refuses while a run holds the directory."""
    from gpusnap.store import shards

    rd = _open(run_dir)
    if shards.is_sharded(rd):  # the global manifests' retention, then each rank's shard
        locks = shards.lock_all(rd, "gc")
        try:
            report = shards.prune(rd, keep)
        finally:
            for lock in locks:
                lock.release()
    else:
        with rd.lock("gc") as lock:
            if lock.note():
                click.echo(f"gpusnap: {lock.note()}", err=True)
            report = rd.prune(keep)
    if as_json:
        click.echo(json.dumps(report, indent=1))
        return
    gone = report["removed_snapshots"]
    click.echo(
        f"removed {len(gone)} snapshot{'s' if len(gone) != 1 else ''}"
        + (f" ({', '.join(gone)})" if gone else "")
        + f", {report['removed_packs']} pack{'s' if report['removed_packs'] != 1 else ''}"
        + f", {report['removed_temp']} temp file{'s' if report['removed_temp'] != 1 else ''}"
        + f"; freed {human_bytes(report['removed_bytes'])}"
    )
    if report["reindexed_chunks"]:
        click.echo(f"re-indexed {report['reindexed_chunks']} chunks found in packs no index named")
    if report.get("no_room"):
        click.echo("the disk is full: gc removed what no snapshot needs and no index names, but had no room to write "
                   "the new index it needs to remove the rest; run gc again once there is room for it")
    for kept in report["kept_unknown"]:
        click.echo(f"kept {kept['path']}: pack version {kept['version']}, which this gpusnap cannot read "
                   "(a newer gpusnap wrote it; gc with that version removes it when nothing needs it)")


@cli.command("export")
@click.argument("run_dir", metavar="DIR")
@click.argument("snapshot", required=False, metavar="[SNAP]")
@click.option("--out", "out", required=True, metavar="FILE.safetensors", help="Where to write the tensors.")
@click.option("--module", "module", metavar="PATH", help="Only the module at this object path (keys unprefixed).")
@click.option("--rank", type=int, default=None, metavar="R", help="A distributed run: this rank's weights (default 0).")
def export_cmd(run_dir, snapshot, out, module, rank):
    """Write the tensors of the program's modules, by their state_dict names, to a safetensors
    file (keys are prefixed with the module path when there are several modules)."""
    from gpusnap.store.export import export_safetensors

    rd, snapshot, _ = _shard_of(_open(run_dir), snapshot, rank)
    r = export_safetensors(rd, snapshot, out, module=module)
    click.echo(f"wrote {r['tensors']} tensors ({human_bytes(r['nbytes'])}) of snapshot {r['snapshot']} to {out}")
