"""`gpusnap run`, `gpusnap restart`, `gpusnap snap`: start a program under the supervisor, continue
it from a snapshot, ask a running one for a snapshot. Nothing here imports torch."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import sys
import tempfile

import click

from gpusnap import atomic, knobs, lifeline
from gpusnap.cli import cli, trust_dir_option
from gpusnap.errors import GpusnapError, NoActiveRun, RunDirMismatch, SnapshotError, SnapshotNotFound, UsageError
from gpusnap.errors import RestoreError as RestoreRefused
from gpusnap.launch import options as opt
from gpusnap.launch import torchrun
from gpusnap.store import location
from gpusnap.store.location import local_dir

_PASSTHROUGH = {"ignore_unknown_options": True, "allow_interspersed_args": False}

EXIT_CODES_HELP = """\b
Exit status:
  the program's own       it exited by itself (killed by signal N: 128+N)
  75                      stopped by SIGTERM or a spot notice (--notices) after a committed
                          snapshot: requeue the job and it continues (`gpusnap run` again
                          resumes, or `gpusnap restart DIR`)
  76                      stopped by SIGTERM or a spot notice, but no snapshot was committed
                          within --grace (or before the notice's deadline)
  1..6                    gpusnap refused before starting the program (2: bad arguments,
                          3: run directory, 4: snapshot store, 6: restart refused); the
                          message says why"""

SCHEDULE_HELP = """\b
Snapshots are taken:
  on --signal (SIGUSR1), on SIGTERM (then the program stops, --on-term snapshot),
  every --every, on `gpusnap snap DIR`, and when the program calls gpusnap.snapshot().
  --every auto measures what each snapshot costs training (the stall, and how much slower
  the program's iterations run while the writer works and just after) and keeps the
  interval as short as --overhead allows; `gpusnap ls DIR` shows the interval and the
  measured overhead.
A snapshot is taken at the next iteration boundary of the training loop and holds the whole
program: the main thread's frames and their locals, the globals of the script and of the
modules under its directory (and --instrument), every CPU tensor, numpy array and RNG state
they reach, the device memory behind its torch and CuPy CUDA tensors and the raw memory it
allocated through cuda-python (only the chunks that changed since the last snapshot are copied
off the GPU; --paranoid copies all), and where each loop stands. Open files, sockets, threads
and DataLoader workers are not saved; a restart re-creates them by running the setup code
again, and places CUDA tensors on the same GPU, another one (GPUSNAP_DEVICE_MAP) or the CPU
when the machine has no GPU.
The files the program writes (logs, metrics, checkpoints; its DataLoader workers' too) are part
of a snapshot: a restart puts them back as they were at the snapshot before the program runs
again, and moves what was written after it into DIR/after-<id>/ (nothing is deleted)."""


def _files_options(f):
    from gpusnap.files import DEFAULT_EXCLUDES

    defaults = ", ".join(DEFAULT_EXCLUDES)
    for deco in reversed([
        click.option("--files-exclude", "files_exclude", multiple=True, metavar="GLOB",
                     help="Leave the files matching GLOB alone: not recorded, never put back (repeatable). A GLOB without / "
                          "matches a file or directory name anywhere (__pycache__, *.lock); one with / a path and everything "
                          "under it (~/scratch, ./wandb, /data/*/tmp; relative to the working directory). Always left "
                          f"alone: the run directory, /dev, /proc, /sys, files tempfile makes for libraries, and the caches {defaults}. "
                          "`--files-exclude /` leaves every file alone."),
        click.option("--files-max", "files_max", metavar="SIZE", default=None,
                     help=f"Keep at most SIZE of file contents per snapshot, smallest files first (default "
                          f"{knobs.FILES_MAX_BYTES / 2**20:g}MiB, GPUSNAP_FILES_MAX_BYTES; unchanged files cost nothing). A larger file "
                          "is kept by its length: an appended log is cut back, but a restart refuses (exit 6; --force goes on) "
                          "when such a file was removed or rewritten after the snapshot."),
    ]):
        f = deco(f)
    return f


def _schedule_options(f):
    for deco in reversed([
        click.option("--every", "every", metavar="DURATION|auto",
                     help="Also snapshot periodically: 90s, 10m, 1h, 1h30m, 45 (seconds); auto: as often as --overhead allows, "
                          "from the measured cost of each snapshot."),
        click.option("--overhead", "overhead", metavar="PERCENT", default=None,
                     help=f"With --every auto: the share of training time snapshots may cost. Default {knobs.AUTO_OVERHEAD * 100:g}% "
                          "(GPUSNAP_AUTO_OVERHEAD)."),
        click.option("--signal", "signal_name", metavar="NAME", default="USR1", show_default=True,
                     help="Signal that asks for a snapshot: " + ", ".join(s[3:] for s in opt.SNAPSHOT_SIGNALS) + " (with or without SIG, any case)."),
        click.option("--on-term", type=click.Choice(["snapshot", "exit"]), default="snapshot", show_default=True,
                     help="On SIGTERM: snapshot at the next safe point, then exit 75 (snapshot); or pass SIGTERM to the program (exit)."),
        click.option("--grace", metavar="DURATION", default=None,
                     help=f"How long a SIGTERM snapshot may take before the program is killed (exit 76). Default {opt.format_duration(knobs.DEFAULT_GRACE_S)} (GPUSNAP_DEFAULT_GRACE_S)."),
        click.option("--keep", metavar="N", default=None, help="Keep only the N newest snapshots (older ones are pruned after each commit)."),
        click.option("--paranoid", is_flag=True, help="Copy all device memory at every snapshot, unchanged chunks included (GPUSNAP_PARANOID=1)."),
        click.option("-q", "--quiet", "verbosity", flag_value=0, help="Say only what goes wrong, and why the run stops."),
        click.option("-v", "--verbose", "verbosity", flag_value=2, help="Also say every snapshot request and connection."),
        click.option("--notices", type=click.Choice(["off", "auto", "aws", "gcp", "azure"]), default="off", show_default=True,
                     help="Watch the cloud's metadata service for a spot/preemption notice (auto: whichever answers); "
                          "on one, snapshot and stop with exit 75 before the machine goes, as on SIGTERM."),
    ]):
        f = deco(f)
    return f


@cli.command(context_settings=_PASSTHROUGH, epilog=SCHEDULE_HELP + "\n\n" + EXIT_CODES_HELP)
@click.option("--dir", "run_dir", metavar="DIR", help="Run directory (snapshots, log). Default: ./gpusnap-runs/<script stem or module name>.")
@_schedule_options
@_files_options
@click.option("--instrument", multiple=True, metavar="PATH_OR_MODULE", help="Also instrument these sources (files, directories, or module names; repeatable).")
@click.option("--at", "at", metavar="FILE:LINE", help="The step loop: the loop statement at FILE:LINE (when gpusnap cannot find it).")
@click.option("--resume", default="auto", show_default=True, metavar="auto|never|ID",
              help="auto: continue from the newest intact snapshot in DIR, if any, unless the program ran to its end last time; "
                   "never: start fresh (snapshots go on into DIR); ID: continue from that snapshot.")
@trust_dir_option
@torchrun.options
@click.argument("program", nargs=-1, type=click.UNPROCESSED, metavar="SCRIPT|-m MODULE [ARGS]...")
def run(run_dir, every, overhead, signal_name, on_term, grace, keep, paranoid, verbosity, notices, files_exclude, files_max,
        instrument, at, resume, program, **dist):
    """Run a Python program under gpusnap, unmodified.

    \b
    gpusnap run [OPTIONS] SCRIPT [ARGS]...
    gpusnap run [OPTIONS] -m MODULE [ARGS]...

    Options go before SCRIPT (or -m MODULE, which runs a module as `python -m` does);
    everything after it is the program's own and reaches it untouched, even if it looks like
    a gpusnap option.

    \b
    Examples:
      gpusnap run train.py --epochs 3
      gpusnap run --every 10m --keep 3 --dir /scratch/run1 train.py --lr 3e-4
      gpusnap run --every auto --overhead 0.5% --keep 3 train.py
      gpusnap run -m mypkg.train --config big.yaml
      kill -USR1 <gpusnap pid>          # snapshot now
      gpusnap snap ./gpusnap-runs/train # same, and wait for the commit
      sbatch --signal=B:USR1@120 ...    # Slurm: snapshot 2 minutes before the time limit
      gpusnap run --nproc-per-node 4 train.py             # a torchrun job on this node
      gpusnap run --nproc-per-node 8 --nnodes 2 --rdzv-backend c10d \
          --rdzv-endpoint node0:29400 --rdzv-id job1 --dir /shared/run1 train.py   # on each node
    """
    from gpusnap.launch.supervisor import Launch

    cwd = os.getcwd()
    # -m is not a click option: everything after `-m MODULE` is the module's, as with python -m.
    program = list(program)
    module = None
    if program and program[0].startswith("-m"):
        if program[0] != "-m":
            module, program = program[0][2:], program[1:]
        elif len(program) >= 2:
            module, program = program[1], program[2:]
        else:
            raise UsageError("-m needs a module name", hint="gpusnap run [OPTIONS] -m MODULE [ARGS]...")
    elif program and program[0].startswith("-") and program[0] != "-":
        raise UsageError(f"no such option: {program[0]}", hint="gpusnap options go before SCRIPT; see gpusnap run --help")
    if module is not None:
        kind, target, args = "module", opt.check_module(module, cwd), list(program)
        given = module
        default_name = module
    else:
        if not program:
            raise UsageError("no script to run", hint="gpusnap run [OPTIONS] SCRIPT [ARGS]... or -m MODULE")
        given, args = program[0], list(program[1:])
        target = opt.resolve_script(given, cwd)
        kind = "script"
        default_name = os.path.splitext(os.path.basename(target))[0]
    launch = Launch(kind=kind, target=given, args=args, cwd=cwd, run_dir="")
    _apply_schedule(launch, every, overhead, signal_name, on_term, grace, keep, notices, verbosity, paranoid)
    _apply_files(launch, files_exclude, files_max)
    launch.at = opt.resolve_at(at, cwd)
    launch.instrument = opt.resolve_instrument(instrument, cwd)
    launch.torchrun = torchrun.arguments(dist)
    if resume not in ("auto", "never") and not resume.strip():
        raise UsageError("--resume takes auto, never or a snapshot id")
    path, url = location.resolve(run_dir if run_dir else os.path.join("gpusnap-runs", default_name))
    if url is not None and launch.torchrun is not None:
        raise UsageError("a distributed run cannot keep its directory on an object store yet",
                         hint="pass a directory on a shared filesystem (NFS, Lustre) that every node mounts")
    if url is not None:
        location.probe(url)
    from gpusnap.store.local import check_creatable

    check_creatable(path)
    if resume not in ("auto", "never") and not os.path.exists(os.path.join(path, "run.json")):
        raise SnapshotNotFound(f"no snapshot {resume} in {path}: it holds no run yet")
    launch.run_dir = path
    launch.store = url

    identity = {
        "command": {"kind": kind, "target": target, "args": args},
        "cwd": cwd,
        "python": sys.version.split()[0],
        "instrument": launch.instrument,
        "at": launch.at,
        "files": {"exclude": launch.files_exclude, "max_bytes": launch.files_max},  # what restart keeps watching
    }
    if launch.torchrun is not None:
        identity["dist"] = {"torchrun": launch.torchrun}
    _supervise(launch, identity, resume)


@cli.command(epilog=EXIT_CODES_HELP)
@click.argument("run_dir", metavar="DIR")
@click.option("--snapshot", "snapshot_id", metavar="ID", help="Continue from this snapshot (default: the newest that verifies).")
@click.option("--force", is_flag=True, help="Restore even where the program changed in ways that can be overridden, "
                                           "and leave files that cannot be put back as they are.")
@_schedule_options
@trust_dir_option
@_files_options
@torchrun.options
def restart(run_dir, snapshot_id, force, every, overhead, signal_name, on_term, grace, keep, paranoid, verbosity, notices,
            files_exclude, files_max, **dist):
    """Continue the program of run directory DIR from a snapshot.

    Runs the same command, in the same working directory, as the `gpusnap run` that made DIR,
    and continues it from the snapshot: setup code runs again, the loops skip ahead to where
    they were, and the saved state is written over the live one. Before that, the files the
    program wrote go back to their state at the snapshot (what was written after it moves into
    DIR/after-<id>/). Scheduling options are not remembered; pass them again. --files-exclude
    and --files-max are those the run was started with, unless given here.

    \b
    A distributed run (made by `gpusnap run --nproc-per-node ...`) restarts with the torchrun
    options it was started with, or with those given here (new nodes, a new rendezvous); the
    number of ranks must stay the same. Run it on every node.

    \b
    Examples:
      gpusnap restart ./gpusnap-runs/train
      gpusnap restart /scratch/run1 --snapshot 000007 --every 10m
    """
    from gpusnap.store.rundir import RunDir

    path, url = location.resolve(run_dir)
    if url is not None:  # the newest snapshot that reached the store, unless this machine has a newer one
        from gpusnap.store.levels import fetch

        fetch(location.open_shared(url), pathlib.Path(path), say=lambda line: _say(line, level=1))
    rd = RunDir.open(path, trusted=True)  # restoring unpickles: refuse another user's directory
    rd.check_writable()
    launch = _restart_launch(rd, path, force, dist, moved=url is not None)
    launch.store = url
    _apply_schedule(launch, every, overhead, signal_name, on_term, grace, keep, notices, verbosity, paranoid)
    recorded = rd.identity.get("files") or {}
    _apply_files(launch, files_exclude or recorded.get("exclude") or (), files_max)
    if files_max is None:
        launch.files_max = recorded.get("max_bytes")
    _supervise(launch, None, snapshot_id or "auto", rd=rd, require_snapshot=True)


def _restart_launch(rd, path: str, force: bool, dist: dict, moved: bool = False):
    """The Launch that runs run directory ``rd``'s recorded command again (scheduling aside).
    ``moved``: the run may come from another machine (its store is shared), where the program's
    files were elsewhere: when the recorded working directory is missing here, the current one
    takes its place (the next machine's copy of the program's files)."""
    from gpusnap.launch.supervisor import Launch

    ident = rd.identity
    command = ident.get("command") or {}
    kind, target, args = command.get("kind"), command.get("target"), list(command.get("args") or [])
    cwd = ident.get("cwd") or os.getcwd()
    if moved and not os.path.isdir(cwd):
        if kind == "script" and os.path.isabs(target):
            target = os.path.join(os.getcwd(), os.path.relpath(target, cwd))
        knobs.MOVED_FROM = os.environ["GPUSNAP_MOVED_FROM"] = cwd  # the trainee reads it too
        cwd = os.getcwd()
    if kind not in ("script", "module") or not target:
        raise GpusnapError(f"{path}/run.json names no command to restart")
    if not os.path.isdir(cwd):
        raise UsageError(f"the run's working directory {cwd} does not exist", hint="restart on a machine that has it")
    if ident.get("dist") and torchrun.arguments(dist) is None and "--node-rank" in (ident["dist"].get("torchrun") or []):
        # Recorded by the node that made the directory: every node would take its rank.
        raise UsageError(f"{path} was started with a static rendezvous (--node-rank), which differs per node",
                         hint="pass this node's torchrun options to restart (--nproc-per-node, --nnodes, "
                              "--node-rank, --master-addr, --master-port)")
    if kind == "script":
        opt.resolve_script(target, cwd)
        rel = os.path.relpath(target, cwd)
        given = target if rel.startswith("..") else rel
    else:
        given = opt.check_module(target, cwd)
    if not rd.snapshot_ids():
        raise SnapshotNotFound(f"{path} has no snapshot to restart from",
                               hint="run the program with `gpusnap run` and take a snapshot (SIGUSR1, --every, `gpusnap snap`)")
    launch = Launch(kind=kind, target=given, args=args, cwd=cwd, run_dir=path, force=force)
    launch.at = ident.get("at")
    launch.instrument = list(ident.get("instrument") or [])
    if ident.get("dist"):
        launch.torchrun = torchrun.arguments(dist) or list(ident["dist"].get("torchrun") or [])
    elif torchrun.arguments(dist) is not None:
        raise UsageError(f"{path} holds a single-process run; torchrun options do not apply to it",
                         hint="restart it without --nproc-per-node and the other torchrun options")
    return launch


def verify_by_replay(run_dir: str, snapshot: str | None, verbosity: int | None) -> None:
    """``gpusnap verify --replay``: restart SNAP in a scratch copy of DIR, compare the iterations
    after the merge with its witness, stop, and remove the copy. DIR itself is only read, and
    the program's files end as they were (``files.guard``)."""
    from gpusnap.files import guard
    from gpusnap.store import shards
    from gpusnap.store.rundir import RunDir

    path, url = location.resolve(run_dir)
    if url is not None:  # replayed from the local level, made from the store's newest snapshot when missing
        from gpusnap.store.levels import fetch

        fetch(location.open_shared(url), pathlib.Path(path), say=lambda line: _say(line, level=1))
    rd = RunDir.open(path, trusted=True)
    if shards.is_sharded(rd):
        raise UsageError(f"{path} holds a distributed run: `verify --replay` replays single-process runs only",
                         hint="restart it with `gpusnap restart DIR` on its nodes: a restart checks itself against the witness")
    if snapshot is not None and snapshot not in rd.snapshot_ids():
        raise SnapshotNotFound(f"no snapshot {snapshot} in {path}")
    launch = _restart_launch(rd, path, False, {}, moved=url is not None)
    _apply_schedule(launch, None, None, "USR1", "snapshot", None, None, "off", verbosity, False)
    scratch = scratch_copy(path)
    try:
        # The restart puts the program's files back to the snapshot's state (this process, before
        # the replay; the trainee, at the merge), and the replay writes them: all of it is undone.
        guard.install(os.path.join(scratch, guard.GUARD_DIR))
        launch.run_dir = scratch
        launch.verify_replay = True
        _say(f"replaying {'snapshot ' + snapshot if snapshot else 'the newest intact snapshot'} of {path} in a scratch copy", level=1)
        _supervise(launch, None, snapshot or "auto", rd=RunDir.open(scratch, trusted=True), require_snapshot=True)
    finally:
        _put_back_verify_writes(scratch)
        shutil.rmtree(scratch, ignore_errors=True)


def _put_back_verify_writes(scratch: str) -> None:
    """The replay wrote the program's files as a restart would: they go back to what they were."""
    from gpusnap.files import guard

    guard.uninstall()
    done, failed = guard.put_back(os.path.join(scratch, guard.GUARD_DIR))
    if done:
        _say(f"put back {done} path{'s' if done != 1 else ''} the replay wrote", level=1)
    for path, why in failed:
        _say(f"warning: {path} is left as the replay wrote it: {why}")


def scratch_copy(path: str) -> str:
    """A private copy of run directory ``path`` to restart in: hard links to its committed files
    (which nothing ever rewrites) beside it where the file system allows, copies elsewhere;
    not its lock, log or supervisor files."""
    parent, name = os.path.split(path.rstrip("/"))
    try:
        scratch = tempfile.mkdtemp(prefix=f".{name}.verify-", dir=parent)
    except OSError:
        scratch = tempfile.mkdtemp(prefix=f"gpusnap-verify-{name}-")
    for folder, dirs, files in os.walk(path):
        rel = os.path.relpath(folder, path)
        target = os.path.normpath(os.path.join(scratch, rel))
        os.makedirs(target, mode=0o700, exist_ok=True)
        for file in files:
            if (rel == "." and file != "run.json") or atomic.is_temp(file):
                continue  # the lock, the run log, the supervisor's files: the scratch run's own
            source = os.path.join(folder, file)
            try:
                os.link(source, os.path.join(target, file))
            except OSError:
                shutil.copy2(source, os.path.join(target, file))
    return scratch


def _apply_schedule(launch, every, overhead, signal_name, on_term, grace, keep, notices, verbosity, paranoid) -> None:
    global _verbosity
    if knobs.PROBLEMS:  # the trainee and its writers read the same environment
        raise UsageError(knobs.PROBLEMS[0], hint="fix or unset it; gpusnap/knobs.py lists every GPUSNAP_ setting")
    launch.every_s, auto = opt.parse_every(every)
    launch.overhead = opt.parse_overhead(overhead, auto, knobs.AUTO_OVERHEAD)
    launch.signal = opt.parse_signal(signal_name)
    launch.on_term = on_term
    launch.grace_s = opt.parse_duration(grace, "--grace") if grace is not None else knobs.DEFAULT_GRACE_S
    launch.keep = opt.parse_keep(keep)
    launch.notices = notices
    launch.paranoid = bool(paranoid)
    launch.verbosity = _verbosity = 1 if verbosity is None else verbosity


def _apply_files(launch, files_exclude, files_max) -> None:
    launch.files_exclude = [p for p in files_exclude if p.strip()]
    launch.files_max = opt.parse_size(files_max, "--files-max") if files_max is not None else None


def _supervise(launch, identity, resume: str, rd=None, require_snapshot: bool = False) -> None:
    from gpusnap.launch.supervisor import Supervisor, string_hash_seed
    from gpusnap.store import shards
    from gpusnap.store.rundir import RunDir

    if rd is None:
        rd = shards.create_top(launch.run_dir, identity) if launch.torchrun is not None else RunDir.create(launch.run_dir, identity)
    launch.hash_seed = string_hash_seed(rd.nonce)
    if shards.is_sharded(rd) != (launch.torchrun is not None):
        held = "a distributed run (torchrun)" if shards.is_sharded(rd) else "a single-process run"
        raise RunDirMismatch(f"{rd.path} holds {held}",
                             hint="pass the same torchrun options as the run that made it, or another --dir")
    # The nodes of a distributed run share the directory: each rank locks its own shard instead.
    lock = rd.lock("run") if launch.torchrun is None else None
    launch.lock_token = lock.token if lock is not None else None
    if lock is not None and lock.note():
        _say(lock.note())
    uploader = shared_lock = None
    try:
        if launch.store is not None:
            uploader, shared_lock = _start_uploads(rd, launch)
        launch.resume = _choose_snapshot(rd, resume, require_snapshot, anew_after_end=launch.torchrun is None)
        if launch.resume is not None and launch.torchrun is not None:
            _check_world_size(rd, launch)
        status = Supervisor(launch).run()
    finally:
        if uploader is not None:
            uploader.stop()  # what the run committed last (a preempted run's stop snapshot) goes too
            if uploader.summary():
                _say(uploader.summary(), level=1)
        if shared_lock is not None:
            shared_lock.release()
        if lock is not None:
            lock.release()
    sys.exit(status)


def _start_uploads(rd, launch):
    """The shared level's lock (one run writes a store at a time) and its uploader."""
    from gpusnap.store.levels import Uploader
    from gpusnap.store.objects import open_backend

    shared = open_backend(launch.store)
    shared_lock = shared.lock("run")  # also where missing credentials or bucket are found, before the program starts
    return Uploader(rd, shared, keep=launch.keep, say=lambda line: _say(line, level=1)).start(), shared_lock


def _check_world_size(rd, launch) -> None:
    saved = rd.load_manifest(launch.resume).get("world_size")
    now = torchrun.world_size(launch.torchrun)
    if now is not None and saved is not None and now != saved:
        raise RestoreRefused(
            f"snapshot {launch.resume} was taken by {saved} ranks and this job would have {now}: gpusnap restores "
            "each rank from its own shard and does not reshard",
            hint=f"restart with {saved} ranks in all (--nnodes x --nproc-per-node), or start afresh with --resume never")


def _choose_snapshot(rd, resume: str, require: bool, anew_after_end: bool = True) -> str | None:
    if resume == "never":
        return None
    if resume != "auto":
        if resume not in rd.snapshot_ids():
            raise SnapshotNotFound(f"no snapshot {resume} in {rd.path}")
        rd.load_manifest(resume)  # a damaged manifest is refused here, not in the trainee
        _say(f"resuming from snapshot {resume}", level=1)
        return resume
    if not rd.snapshot_ids():
        if require:
            raise SnapshotNotFound(f"{rd.path} has no snapshot to restart from")
        return None
    if not require and anew_after_end and _finished(rd):
        # A scheduler requeues only a job that did not end well, so the same command again after a
        # clean end is somebody running the program anew; `gpusnap restart DIR` still continues.
        # Not for a distributed run: its nodes share the log, and each would read another's start.
        _say(f"the program in {rd.path} ran to its end last time: starting from the beginning", level=1)
        if _verbosity >= 1:
            click.echo("hint: `gpusnap restart DIR` continues from its newest snapshot instead", err=True)
        return None
    info, skipped = rd.newest_intact()
    for sid, why in skipped:
        _say(f"skipping snapshot {sid}: {why}")
    if info is None:
        if require:
            raise SnapshotNotFound(f"{rd.path} has no intact snapshot to restart from",
                                   hint="see `gpusnap verify DIR`; start over with `gpusnap run --resume never`")
        _say("no intact snapshot to resume from: starting from the beginning", level=1)
        return None
    at = f" (iteration {info.iteration})" if getattr(info, "iteration", None) is not None else ""
    newest = " (the newest)" if not skipped else ""
    _say(f"resuming from snapshot {info.id}{at}{newest}", level=1)
    return info.id


def _finished(rd) -> bool:
    """Whether the last run in ``rd`` ended with the program's own exit status 0."""
    from gpusnap.launch.runfiles import LOG_FILE
    from gpusnap.store.local import LocalBackend

    try:
        log = LocalBackend(rd.path).get(LOG_FILE)
    except OSError:
        return False
    last = None
    for line in log.splitlines():
        if b'"event":"exit"' in line or b'"event":"start"' in line:
            last = line
    try:
        ev = json.loads(last) if last else {}
    except ValueError:  # a torn last line: the supervisor died mid-write, so not a clean end
        return False
    return ev.get("event") == "exit" and ev.get("source") == "supervisor" and ev.get("status") == 0


_verbosity = 1  # run/restart: --quiet 0, --verbose 2


def _say(line: str, level: int = 0) -> None:
    if level <= _verbosity:
        click.echo(f"gpusnap: {line}", err=True)


@cli.command()
@click.argument("run_dir", metavar="DIR")
@click.option("--no-wait", is_flag=True, help="Return once the request is delivered, without waiting for the commit.")
@click.option("--timeout", metavar="DURATION", default=None, help="Give up waiting after this long (exit 5). Default: wait.")
def snap(run_dir, no_wait, timeout):
    """Ask the program running in DIR for a snapshot now.

    Waits until the snapshot is committed and prints it (exit 0); exits 5 when it failed or
    was skipped, 3 when no run is active in DIR.

    \b
    Example:
      gpusnap snap ./gpusnap-runs/train
    """
    from gpusnap.launch import control
    from gpusnap.launch.events import describe, warning
    from gpusnap.launch.runfiles import SUPERVISOR_FILE, supervisor_file
    from gpusnap.store.local import LocalBackend

    timeout_s = opt.parse_duration(timeout, "--timeout") if timeout is not None else None
    path = local_dir(run_dir)
    if not os.path.isdir(path):
        raise NoActiveRun(f"no run directory {path}")
    local = LocalBackend(path)
    names = set(local.list())
    key = next((k for k in (SUPERVISOR_FILE, supervisor_file(True)) if k in names), None)  # then: this host's node
    if key is None:
        hosts = sorted(n[len("supervisor-"):-len(".json")] for n in names if n.startswith("supervisor-") and n.endswith(".json"))
        if hosts:
            raise NoActiveRun(f"no node of the run in {path} runs on this host (its nodes: {', '.join(hosts)})",
                              hint="run `gpusnap snap DIR` on one of them: a snapshot asked of one node is global")
        raise NoActiveRun(f"no run is active in {path}")
    try:
        info = json.loads(local.get(key))
        pid, sock_path = int(info["pid"]), str(info["socket"])
    except FileNotFoundError:
        raise NoActiveRun(f"no run is active in {path}") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise NoActiveRun(f"no run is active in {path} ({key} is unreadable: {exc})") from exc
    if not lifeline.alive(pid):
        raise NoActiveRun(f"no run is active in {path} (its supervisor, pid {pid}, is gone)")
    try:
        sock = control.connect(sock_path)
    except OSError as exc:
        raise NoActiveRun(f"no run is active in {path} (cannot reach pid {pid}: {exc.strerror or exc})") from exc
    with sock:
        control.send(sock, {"op": "snapshot", "reason": "request", "wait": not no_wait})
        sock.settimeout(timeout_s)
        result = None
        try:
            for msg in control.messages(sock):
                if msg.get("op") == "accepted":
                    _say("snapshot requested" + (" (queued until the program connects)" if msg.get("queued") else ""))
                    if no_wait:
                        return
                elif msg.get("op") == "event":
                    result = msg
                    break
        except TimeoutError:
            raise SnapshotError(f"no result within {timeout}", hint="the request stays pending; see DIR/log.jsonl") from None
    if result is None:
        raise SnapshotError("the run ended before the snapshot was committed")
    ev = {k: v for k, v in result.items() if k != "op"}
    if ev.get("event") == "committed":
        _say(describe(ev))
        warned = warning(ev)
        if warned is not None:
            _say(warned[0])
            click.echo(f"hint: {warned[1]}", err=True)
        return
    raise SnapshotError(describe(ev))
