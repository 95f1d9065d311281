"""The program's files roll back with it (gpusnap/files): a program is snapshotted at a random
step, runs on writing, rewriting, rotating and removing files, is killed -9, and restarted; its
files must then be what an uninterrupted run left, every one compared (logs and metrics byte for
byte, checkpoints by their tensors and values, TensorBoard event files by their events), as
well as its final state. What was written after the snapshot is found again in
DIR/after-<id>/, and a file that cannot be put back stops the restart (exit 6) unless --force.
One seed per program by default (printed); GPUSNAP_TEST_SEEDS=1,2,3 runs more."""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import pytest
import torch
from harness import (
    Run,
    assert_same,
    copy_programs,
    gpusnap,
    interrupt,
    kill_and_restart,
    load_final,
    plain,
    programs_and_out,
    progress,
    ref_and_out,
    request_snapshot,
    start_plain,
    wait_for,
)

pytestmark = pytest.mark.slow  # end-to-end runs: the full suite, not the quick loop

SEEDS = [int(s) for s in os.environ.get("GPUSNAP_TEST_SEEDS", "1").split(",")]
ENV = {"OMP_NUM_THREADS": "1"}
# The runs killed after a snapshot: its writer at the trainee's priority, so that on a busy
# machine it commits while the program still has steps to go (at the default idle priority
# it waits for a free core).
PACED = {**ENV, "GPUSNAP_WRITER_PRIORITY": "0"}
TORCH_FILES = (".pt", ".pth", ".ckpt", ".bin")


def _tree(top: Path) -> dict[str, Path]:
    return {str(p.relative_to(top)) + ("/" if p.is_dir() else ""): p for p in sorted(top.rglob("*"))}


def _same_paths(value, ref: str, out: str):
    """``value`` with the reference run's directory named as the interrupted run's: the only
    difference two runs in two directories may have."""
    if isinstance(value, str):
        return value.replace(ref, out)
    if isinstance(value, dict):
        return {_same_paths(k, ref, out): _same_paths(v, ref, out) for k, v in value.items()
                if not (isinstance(k, str) and ("runtime" in k or "per_second" in k))}  # timings
    if isinstance(value, (list, tuple)):
        return type(value)(_same_paths(v, ref, out) for v in value)
    if hasattr(value, "tolist") and not isinstance(value, torch.Tensor):  # numpy arrays (RNG states)
        return value.tolist()
    if hasattr(value, "__dict__") and not isinstance(value, (torch.Tensor, type)):
        return {"__class__": type(value).__qualname__, **_same_paths(vars(value), ref, out)}
    return value


def _events(folder: Path) -> list:
    """The events of every TensorBoard event file in ``folder``, in order: a restarted run goes
    on in a file of its own (its name has the time and pid), which TensorBoard reads as one run."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    out = []
    for path in sorted(folder.glob("events.out.tfevents.*")):
        for event in EventFileLoader(str(path)).Load():
            for value in event.summary.value:
                out.append((value.tag, event.step, value.SerializeToString()))
    return sorted(out)


def assert_same_files(ref: Path, out: Path) -> None:
    """Every file and directory under ``out`` is the one under ``ref``."""
    a, b = _tree(ref), _tree(out)
    events = {name for name in a if "events.out.tfevents." in name}
    assert sorted(set(a) - events) == sorted(set(b) - {n for n in b if "events.out.tfevents." in n}), "other files"
    for folder in sorted({str(Path(name).parent) for name in events}):
        assert _events(ref / folder) == _events(out / folder), f"{folder}: other TensorBoard events"
    for name, path in a.items():
        if name.endswith("/") or name in events:
            continue
        where = f"{name} of the restarted run"
        if name.endswith(TORCH_FILES) and path.read_bytes()[:4] == b"PK\x03\x04":  # torch.save's zip
            assert_same(_same_paths(torch.load(path, weights_only=False), str(ref), str(out)),
                        _same_paths(torch.load(b[name], weights_only=False), str(ref), str(out)), where)
        elif name.endswith(".json"):
            assert _same_paths(json.loads(path.read_text()), str(ref), str(out)) == json.loads(b[name].read_text()), where
        else:
            assert path.read_bytes().replace(str(ref).encode(), str(out).encode()) == b[name].read_bytes(), where


def _run_and_kill(run: Run, out: Path, run_dir: Path, snap_at: int, kill: callable) -> str:
    """Snapshot at step ``snap_at``; kill -9 the whole group once ``kill(snapshot step)`` says so."""
    wait_for(lambda: progress(out) >= snap_at, f"step {snap_at}", proc=run)
    snap_id = request_snapshot(run, run_dir)
    committed_at = progress(out)
    wait_for(lambda: kill(committed_at), "the moment to kill", proc=run)
    run.kill_group()
    assert not list(out.glob("final.*")), f"the program finished before it was killed (committed at step {committed_at})"
    print(f"snapshot {snap_id} asked at step {snap_at}, committed by step {committed_at}, killed at step {progress(out)}")
    return snap_id


@pytest.mark.parametrize("seed", SEEDS)
def test_every_kind_of_write_is_put_back_as_the_snapshot_left_it(tmp_path, seed):
    """files_ops.py writes, appends, rewrites, renames, replaces, removes, truncates, maps,
    makes and removes directories (one kind a step), and checks at each step that its files are
    as the step before left them: a restart must find them as they were at the snapshot, the
    replayed setup's log line and rewrite undone. Killed after every kind ran again."""
    rnd = random.Random(f"files_ops/{seed}")
    programs, out = programs_and_out(tmp_path)
    program = programs / "notorch" / "files_ops.py"
    ref = tmp_path / "ref"
    ref.mkdir()
    plain(program, ref, 40, cwd=tmp_path)
    snap_at = rnd.randint(3, 20)
    run = Run("run", "--dir", "snaps", "--files-exclude", out / "trees", program, out, 40, cwd=tmp_path,
              env={"TEST_STEP_SLEEP_S": "0.05"})
    kill_after = rnd.randint(12, 16)
    snap_id = _run_and_kill(run, out, tmp_path / "snaps", snap_at, lambda at: progress(out) >= min(at + kill_after, 38))
    restarted = gpusnap("restart", "snaps", cwd=tmp_path)
    assert restarted.returncode == 0, restarted.stderr
    said = [line for line in restarted.stderr.splitlines() if line.startswith(f"gpusnap: files back to snapshot {snap_id}: ")]
    assert len(said) == 1 and f"moved aside; what they held after it is in {tmp_path}/snaps/after-{snap_id}/" in said[0], restarted.stderr
    assert (out / "final.json").read_bytes() == (ref / "final.json").read_bytes()
    assert_same_files(ref / "work", out / "work")
    # Nothing was deleted: the killed run's run.log, as it was when killed, is beside the snapshots.
    log = [json.loads(line) for line in (tmp_path / "snaps" / "log.jsonl").read_text().splitlines()]
    files = next(e for e in log if e.get("event") == "files")
    aside = dict(files["copied"] + files["moved"])
    manifest = json.loads((tmp_path / "snaps" / "snapshots" / f"{snap_id}.json").read_text())
    at_snapshot = next(e for e in manifest["files"]["entries"] if e["path"] == str(out / "work" / "run.log"))
    killed_log = Path(aside[str(out / "work" / "run.log")]).read_text()
    assert killed_log.count("starting") == 1 and len(killed_log) > at_snapshot["size"]
    # gc and verify leave them alone: they are the program's files, not the store's debris.
    (tmp_path / "snaps" / f"after-{snap_id}" / "x.tmp-1-0a0b0c0d").write_text("the program's own name")
    assert gpusnap("gc", "snaps", "--keep", "1", cwd=tmp_path).returncode == 0
    assert gpusnap("verify", "snaps", cwd=tmp_path).returncode == 0
    assert Path(aside[str(out / "work" / "run.log")]).read_text() == killed_log
    assert (tmp_path / "snaps" / f"after-{snap_id}" / "x.tmp-1-0a0b0c0d").exists()


@pytest.mark.parametrize("seed", SEEDS)
def test_a_loop_with_workers_logging_and_rotating_checkpoints(tmp_path, seed):
    """files_loop.py: a logging FileHandler, a results.json rewritten per epoch, a CSV line a
    step, a checkpoint an epoch (the one before the last two removed) and samples its two
    DataLoader workers write. With --files-max below the size of a checkpoint, the restart
    refuses to go on without the checkpoint the killed run removed, naming it, and changes
    nothing; with --force it goes on, and the files end as the uninterrupted run's."""
    rnd = random.Random(f"files_loop/{seed}")
    programs, out = programs_and_out(tmp_path)
    program = programs / "files_loop.py"
    ref = tmp_path / "ref"
    ref.mkdir()
    reference = start_plain(program, ref, cwd=tmp_path, env=ENV)
    run = Run("run", "--dir", "snaps", "--files-max", "2k", program, out, cwd=tmp_path,
              env={**PACED, "TEST_STEP_SLEEP_S": "0.1"})
    # In the second epoch (12 steps each), killed after the third has removed the first checkpoint.
    snap_id = _run_and_kill(run, out, tmp_path / "snaps", rnd.randint(13, 20),
                            lambda at: progress(out) >= max(at, 37) + rnd.randint(0, 3))
    manifest = json.loads((tmp_path / "snaps" / "snapshots" / f"{snap_id}.json").read_text())
    entries = {e["path"]: e for e in manifest["files"]["entries"]}
    first = str(out / "checkpoints" / "epoch0.pt")
    assert entries[first]["why"] == "too large" and "buffer" not in entries[first]
    assert entries[str(out / "results.json")]["buffer"] in manifest["buffers"]
    assert any(p.startswith(str(out / "samples")) for p in entries), "the workers' files"

    before = {name: path.stat().st_mtime_ns for name, path in _tree(out).items()}
    refused = gpusnap("restart", "snaps", cwd=tmp_path, env=ENV)
    assert refused.returncode == 6, refused.stderr
    assert not list((tmp_path / "snaps").glob("after-*"))
    lines = refused.stderr.strip().splitlines()
    assert lines[-2] == (f"gpusnap: cannot put {first} back as it was at snapshot {snap_id}: it was removed after the snapshot, "
                         "and its content at the snapshot was too large to keep (2771 bytes; --files-max 2000 bytes in all)")
    assert lines[-1].startswith("hint: restart with --force to go on with those files as they are now")
    assert {name: path.stat().st_mtime_ns for name, path in _tree(out).items()} == before, "the refusal changed files"

    restarted = gpusnap("restart", "snaps", "--force", cwd=tmp_path, env=ENV)
    assert restarted.returncode == 0, restarted.stderr
    assert f"gpusnap: warning: {first} is left as it is (--force): it was removed after the snapshot" in restarted.stderr
    _, err = reference.communicate(timeout=240)
    assert reference.returncode == 0, err
    assert_same_files(ref, out)


@pytest.mark.parametrize("how", ["rotate", pytest.param("rmtree", marks=pytest.mark.more)])
def test_a_setup_that_clears_its_output_directory_leaves_the_run_its_files(tmp_path, how):
    """clean_start.py starts from a clean output directory: its setup renames the last run's
    `run/` to `run.old` (or removes it), then writes a checkpoint there each epoch. With
    --files-max below the checkpoints, the replayed setup took the run's directory away: the
    files under a directory it renamed were never put back, whatever their size, and a
    checkpoint the snapshot held by its length only was gone for good; the restart said
    exit 0 and ended with 3 files of 6 (2 of 2 each). The replay's hands are kept off
    such a file until the merge puts it back (files/preserve.py), and what was under a
    directory the replay renamed or removed goes back too."""
    script = copy_programs(tmp_path) / "corpus" / "clean_start.py"
    ref, out = ref_and_out(tmp_path)
    args = ["--rotate"] if how == "rotate" else []
    plain(script, ref, *args, cwd=tmp_path, env=ENV)
    small = {**ENV, "GPUSNAP_FILES_MAX_BYTES": "2500"}
    restarted = kill_and_restart(script, args, tmp_path, out, random.Random(how), progress(ref), small,
                                 {**small, "TEST_STEP_SLEEP_S": "0.1"}, floors=(14,))
    assert "is left as the replay wrote it" not in restarted.stderr, restarted.stderr
    manifest = json.loads(next((tmp_path / "snaps" / "snapshots").glob("*.json")).read_text())
    assert any(e.get("why") == "too large" for e in manifest["files"]["entries"]), "no checkpoint held by its length only"
    assert_same(load_final(ref), load_final(out))
    assert not list((tmp_path / "snaps").glob("after-*.replay")), "the kept copies stay behind"


@pytest.mark.more  # (CI's time: the default run has the restart that merges)
def test_a_restart_killed_in_its_replay_leaves_the_next_one_what_it_kept(tmp_path):
    """A restart killed -9 after its replay took the run's directory away (renamed to `run.old`),
    before its merge: the checkpoints the snapshot holds by length only are in
    `after-<id>.replay/`, and the next restart's first pass puts them back from there."""
    script = copy_programs(tmp_path) / "corpus" / "clean_start.py"
    ref, out = ref_and_out(tmp_path)
    plain(script, ref, "--rotate", cwd=tmp_path, env=ENV)
    small = {**ENV, "GPUSNAP_FILES_MAX_BYTES": "2500"}
    run = Run("run", "--dir", "snaps", script, out, "--rotate", cwd=tmp_path, env={**small, "TEST_STEP_SLEEP_S": "0.1"})
    snap = interrupt(run, out, tmp_path / "snaps", tmp_path, random.Random(7), progress(ref), 14)
    stalled = Run("restart", "snaps", cwd=tmp_path, env={**small, "TEST_SETUP_SLEEP_S": "60"})
    wait_for(lambda: (out / "run.old").exists(), "the replay's rename", proc=stalled)
    stalled.kill_group()
    kept = tmp_path / "snaps" / f"after-{snap['id']}.replay"
    assert len((kept / "kept.jsonl").read_text().splitlines()) >= 1
    restarted = gpusnap("restart", "snaps", cwd=tmp_path, env=small)
    assert restarted.returncode == 0, restarted.stderr
    assert "is left as" not in restarted.stderr, restarted.stderr
    assert_same(load_final(ref), load_final(out))
    assert not kept.exists()


def test_verify_replay_leaves_the_programs_files_as_it_found_them(tmp_path):
    """`gpusnap verify --replay` restarts a snapshot as a restart would, its files put back to
    the snapshot's state (files_ops.py checks them at every step: the verify fails otherwise),
    and ends with every file as the finished run left it, byte for byte, the snapshot's later
    files included; nothing of it is left in DIR."""
    programs, out = programs_and_out(tmp_path)
    program = programs / "notorch" / "files_ops.py"
    run = Run("run", "--dir", "snaps", "--files-exclude", out / "trees", program, out, 30, cwd=tmp_path,
              env={"TEST_STEP_SLEEP_S": "0.05"})
    wait_for(lambda: progress(out) >= 9, "step 9", proc=run)
    snap_id = request_snapshot(run, tmp_path / "snaps")
    rc, _, err = run.wait()
    assert rc == 0, err
    finished = {name: (None if path.is_dir() else path.read_bytes()) for name, path in _tree(out).items()}
    top = sorted(os.listdir(tmp_path / "snaps"))
    verified = gpusnap("verify", "--replay", "snaps", snap_id, cwd=tmp_path)
    assert verified.returncode == 0, verified.stderr
    assert f"snapshot {snap_id} verified" in verified.stderr and "files back to snapshot" in verified.stderr, verified.stderr
    assert "the replay wrote" in verified.stderr, verified.stderr
    assert {name: (None if path.is_dir() else path.read_bytes()) for name, path in _tree(out).items()} == finished
    assert sorted(os.listdir(tmp_path / "snaps")) == top


def test_a_scratch_directory_gone_with_the_machine_comes_back(tmp_path):
    """A `TemporaryDirectory` the program keeps each epoch's weights and a loss log in, and reads
    back at the end (corpus/scratch_average.py): after the kill every scratch directory is removed,
    as a spot VM's successor starts with an empty /tmp, and the restart puts the snapshot's back,
    so the run ends as an uninterrupted one. (Before tempfile's files were kept, the restored
    program's save into it failed; on the same machine its log got the lines after the snapshot
    twice.)"""
    script = copy_programs(tmp_path) / "corpus" / "scratch_average.py"
    ref, out, scratch = tmp_path / "ref", tmp_path / "out", tmp_path / "tmp"
    for d in (ref, out, scratch):
        d.mkdir()
    env = {**ENV, "TMPDIR": str(scratch)}
    plain(script, ref, cwd=tmp_path, env=env)
    total = progress(ref)
    made_by_ref = set(scratch.iterdir())
    run = Run("run", "--dir", "snaps", script, out, cwd=tmp_path, env={**env, "TEST_STEP_SLEEP_S": "0.04"})
    seed = random.randrange(1 << 16)
    print(f"seed {seed}")
    interrupt(run, out, tmp_path / "snaps", tmp_path, random.Random(seed), total, floor=13)  # past the first epoch
    gone = [d for d in scratch.iterdir() if d not in made_by_ref]
    assert gone and any(d.glob("epoch*.pt") for d in gone)
    for d in gone:
        shutil.rmtree(d)
    restarted = gpusnap("restart", "snaps", cwd=tmp_path, env=env)
    assert restarted.returncode == 0, restarted.stderr
    assert "made again" in restarted.stderr, restarted.stderr
    assert_same(load_final(ref), load_final(out))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("registered", ["method", "lambda"])
def test_a_file_opened_mid_run_goes_on_and_the_call_it_registered_with_atexit_runs(tmp_path, seed, registered):
    """corpus/exit_summary.py: a CSV logger made at the first step keeps its file open, and
    registers its close() with atexit, which writes a summary line as the interpreter exits. The
    restart was refused at the logger's first write (its file was live-only, the replay made
    none) until a file opened after setup was opened again; it then ended without the summary
    line, "verified", 3 of 3, until the program's atexit calls were kept (graph.exits). Where it
    registers `lambda: self.close()`, a function the replay never made, the restart was refused
    by name (3 of 3) until such a function was made again from its code (restore.functions)."""
    script = copy_programs(tmp_path) / "corpus" / "exit_summary.py"
    args = ["--lambda"] if registered == "lambda" else []
    ref, out = ref_and_out(tmp_path)
    plain(script, ref, *args, cwd=tmp_path, env=ENV)
    print(f"seed {seed}")
    kill_and_restart(script, args, tmp_path, out, random.Random(seed), progress(ref), ENV, {**ENV, "TEST_STEP_SLEEP_S": "0.04"})
    summary = (out / "summary.csv").read_text()
    assert summary == (ref / "summary.csv").read_text() and summary.endswith("# 72 rows\n"), summary[-200:]
    assert_same(load_final(ref), load_final(out))


def test_a_snapshot_without_a_file_table_restarts_leaving_files_alone(tmp_path):
    """`--files-exclude /` records no file (as snapshots made before gpusnap kept files): the
    restart continues the program and touches none of its files."""
    programs, out = programs_and_out(tmp_path)
    run = Run("run", "--dir", "snaps", "--files-exclude", "/", programs / "notorch" / "metrics_file.py", out, 60, 5, 2000,
              cwd=tmp_path, env={"TEST_STEP_SLEEP_S": "0.05"})
    snap_id = _run_and_kill(run, out, tmp_path / "snaps", 12, lambda at: progress(out) >= at + 8)
    manifest = json.loads((tmp_path / "snaps" / "snapshots" / f"{snap_id}.json").read_text())
    assert "files" not in manifest and not any(b.get("kind") == "file" for b in manifest["buffers"].values())
    log_before = (out / "train.log").read_text()
    restarted = gpusnap("restart", "snaps", cwd=tmp_path)
    assert restarted.returncode == 0, restarted.stderr
    assert "files back" not in restarted.stderr
    assert (out / "train.log").read_text().startswith(log_before), "the log was cut back"
    assert not list((tmp_path / "snaps").glob("after-*"))


def test_an_unchanged_file_costs_a_snapshot_nothing(tmp_path):
    """A 1 MB metrics file written at the first step: the first snapshot stores it, the next
    names the same chunks and writes none of its bytes; the log appended to at every step costs
    its new bytes only."""
    programs, out = programs_and_out(tmp_path)
    run = Run("run", "--dir", "snaps", programs / "notorch" / "metrics_file.py", out, 400, 1000, 1 << 20,
              cwd=tmp_path, env={"TEST_STEP_SLEEP_S": "0.05"})
    wait_for(lambda: progress(out) >= 3, "step 3", proc=run)
    first = request_snapshot(run, tmp_path / "snaps")
    at = progress(out)
    wait_for(lambda: progress(out) >= at + 5, f"step {at + 5}", proc=run)
    second = request_snapshot(run, tmp_path / "snaps")
    run.kill_group()
    a, b = (json.loads((tmp_path / "snaps" / "snapshots" / f"{s}.json").read_text()) for s in (first, second))

    def chunks(manifest, name):
        entry = next(e for e in manifest["files"]["entries"] if e["path"] == str(out / name))
        return manifest["buffers"][entry["buffer"]]["chunks"]

    assert sum(n for _, n in chunks(a, "metrics.csv")) == 1 << 20, "the metrics file is kept whole"
    assert chunks(a, "metrics.csv") == chunks(b, "metrics.csv")
    assert chunks(b, "train.log") != chunks(a, "train.log")
    assert b["stats"]["bytes_new"] < 100_000, b["stats"]


@pytest.mark.parametrize("seed", SEEDS)
def test_a_lightning_fit_with_loggers_and_checkpoints(tmp_path, seed):
    """The issue's case: a LightningDataModule with two persistent workers, the CSVLogger (and the
    TensorBoardLogger where tensorboard is installed), ModelCheckpoint(save_top_k=2,
    save_last=True), LearningRateMonitor and EarlyStopping, validation after every epoch of 16
    steps; snapshotted in the first epoch, before any validation, killed after one (eight epochs:
    Lightning's snapshots take seconds of the writer's CPU, and must commit first). Before
    gpusnap kept files, the restored CSV logger met a metrics.csv with the killed run's val_loss
    column and the restart died in its first logging call (ValueError from csv_logs.py)."""
    pytest.importorskip("lightning")
    try:
        import tensorboard  # noqa: F401

        args = ["--epochs", "8", "--tensorboard"]
    except ImportError:
        args = ["--epochs", "8"]
        print("tensorboard is not installed: the CSVLogger only")
    rnd = random.Random(f"lightning-files/{seed}")
    program = copy_programs(tmp_path) / "frameworks" / "lightning_files.py"
    ref, out = ref_and_out(tmp_path)
    reference = start_plain(program, ref, *args, cwd=tmp_path, env=ENV)
    run = Run("run", "--dir", "snaps", program, out, *args, cwd=tmp_path, env={**PACED, "TEST_STEP_SLEEP_S": "0.3"})
    validated = lambda: list(out.glob("logs/version_0/checkpoints/epoch=*.ckpt"))  # noqa: E731
    kill_after = rnd.randint(1, 4)
    _run_and_kill(run, out, tmp_path / "snaps", rnd.randint(2, 12),
                  lambda at: validated() and progress(out) >= max(at, 16) + kill_after)
    restarted = gpusnap("restart", "snaps", cwd=tmp_path, env=ENV)
    print(*[line for line in restarted.stderr.splitlines() if line.startswith("gpusnap:")], sep="\n")
    assert restarted.returncode == 0, restarted.stderr
    _, err = reference.communicate(timeout=240)
    assert reference.returncode == 0, err
    assert_same_files(ref, out)
    assert not (out / "logs" / "version_1").exists() and not (out / "tb" / "version_1").exists()


@pytest.mark.more  # the TensorBoardLogger of the Lightning test below, where tensorboard is installed (CI's time)
@pytest.mark.parametrize("seed", SEEDS)
def test_tensorboard_writers_made_after_setup_go_on_writing_after_a_restart(tmp_path, seed):
    """A SummaryWriter made in setup, and the writer per tag that add_scalars makes as it goes
    (tests/programs/corpus/tb_logging.py --grouped), killed after a snapshot and restarted: the
    event files hold every event of an uninterrupted run, once. The writers made after setup
    have no counterpart in the replay; before gpusnap/frameworks/tensorboard.py gave them a new
    lock, queue and thread, the restart was refused at their first event (a TypeError on the
    lock's placeholder)."""
    pytest.importorskip("tensorboard")
    rnd = random.Random(f"tb-logging/{seed}")
    script = copy_programs(tmp_path) / "corpus" / "tb_logging.py"
    ref, out = ref_and_out(tmp_path)
    plain(script, ref, "--grouped", cwd=tmp_path, env=ENV)
    kill_and_restart(script, ["--grouped"], tmp_path, out, rnd, progress(ref), ENV, {**ENV, "TEST_STEP_SLEEP_S": "0.04"})
    assert_same_files(ref, out)


@pytest.mark.parametrize("seed", SEEDS)
def test_a_transformers_trainer_that_rotates_its_checkpoints(tmp_path, seed):
    """A transformers Trainer saving a checkpoint every 5 steps and keeping 2 (save_total_limit):
    killed after two more saves, which removed checkpoints the snapshot saw (their weights
    written by safetensors and torch.save, natively). The restart makes them again from the
    snapshot and moves the later ones aside; in the end the checkpoints are the uninterrupted
    run's, file for file."""
    pytest.importorskip("transformers")
    rnd = random.Random(f"transformers-files/{seed}")
    program = copy_programs(tmp_path) / "frameworks" / "hf_trainer.py"
    args = ["--epochs", "2", "--save-steps", "5", "--save-total-limit", "2"]
    ref, out = ref_and_out(tmp_path)
    reference = start_plain(program, ref, *args, cwd=tmp_path, env=ENV)
    run = Run("run", "--dir", "snaps", program, out, *args, cwd=tmp_path, env={**PACED, "TEST_STEP_SLEEP_S": "0.15"})
    snap_at = rnd.randint(6, 14)
    snap_id = _run_and_kill(run, out, tmp_path / "snaps", snap_at, lambda at: progress(out) >= max(at, snap_at + 11) + rnd.randint(0, 3))
    manifest = json.loads((tmp_path / "snaps" / "snapshots" / f"{snap_id}.json").read_text())
    at_snapshot = {e["path"] for e in manifest["files"]["entries"] if e.get("kind") == "dir" and "/checkpoint-" in e["path"]}
    assert at_snapshot and not any(os.path.exists(p) for p in at_snapshot), "rotated away before the kill"
    restarted = gpusnap("restart", "snaps", cwd=tmp_path, env=ENV)
    assert restarted.returncode == 0, restarted.stderr
    _, err = reference.communicate(timeout=240)
    assert reference.returncode == 0, err
    assert_same_files(ref, out)
