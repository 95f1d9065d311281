"""A killed run continues with the same bytes: each script style is run uninterrupted, and again
under `gpusnap run` with SIGUSR1 at a random step, kill -9 of the whole process group a few steps
later, then `gpusnap restart`. Seeds are printed (pytest shows them on failure); set
GPUSNAP_TEST_SEEDS=1,2,3 to run more."""

from __future__ import annotations

import json
import os
import pathlib
import random
import shutil
import subprocess
import sys
import tempfile

import forkserver
import pytest
from harness import (
    Run,
    assert_same,
    copy_programs,
    gpusnap,
    interrupt,
    load_final,
    plain,
    progress,
    ref_and_out,
    request_snapshot,
    wait_for,
)

SEEDS = [int(s) for s in os.environ.get("GPUSNAP_TEST_SEEDS", "1").split(",")]  # CI time: one seed a style

# name: (program, arguments after OUT, steps the run reports in total)
STYLES = {
    "a-epochs-dataloader-workers0": ("style_a.py", [0, 3], 60),
    "a-epochs-dataloader-workers2": ("style_a.py", [2, 2], 40),
    "b-main-train_epoch-locals": ("style_b.py", [3], 60),
    "c-while-grad-accumulation": ("style_c.py", [20], 60),
    "d-trainer-fit": ("style_d.py", [4], 48),
    "e-bf16-autocast-numpy-generator": ("style_e.py", [60], 60),
    "f-manual-sgd-global-lr": ("style_f.py", [60], 60),
}
SLOW = {"TEST_STEP_SLEEP_S": "0.03"}


QUICK = "a-epochs-dataloader-workers0"  # the one style the quick loop (-m "not slow") runs
# Its run directory on tmpfs, where packs are written from where each entry lies, not from a
# window (gpusnap/store/pack.py).
ON_TMPFS = "b-main-train_epoch-locals"


@pytest.fixture
def run_dir(tmp_path, request):
    """The run's directory: under the test's own, or on /dev/shm for ON_TMPFS."""
    style = request.node.callspec.params["style"]
    if style != ON_TMPFS or not os.access("/dev/shm", os.W_OK):
        yield tmp_path / "snaps"
        return
    where = pathlib.Path(tempfile.mkdtemp(prefix="gpusnap-test-", dir="/dev/shm"))
    try:
        yield where / "snaps"
    finally:
        shutil.rmtree(where, ignore_errors=True)


# A trainer class's fit() and manual SGD on a global rate: shapes the corpus covers (class_state,
# closures, lbfgs_series); bf16 weights under autocast and a numpy generator: tensor_kinds (bf16),
# ema_checkpointed (autocast), test_e2e_interpreters' numpy generator. Run with GPUSNAP_TEST_CORPUS=all.
MORE_STYLES = ("d-trainer-fit", "f-manual-sgd-global-lr", "e-bf16-autocast-numpy-generator")


def _marks(style: str) -> list:
    return [] if style == QUICK else [pytest.mark.slow] + ([pytest.mark.more] if style in MORE_STYLES else [])


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("style", [pytest.param(s, marks=_marks(s)) for s in STYLES])
def test_killed_run_restarts_to_the_same_bytes(tmp_path, run_dir, style, seed):
    program, args, total = STYLES[style]
    rnd = random.Random(f"{style}/{seed}")
    print(f"style {style} seed {seed}")
    programs = copy_programs(tmp_path)
    ref, out = ref_and_out(tmp_path)
    plain(programs / program, ref, *args, cwd=tmp_path)

    run = Run("run", "--dir", run_dir, programs / program, out, *args, cwd=tmp_path, env=SLOW)
    snap = interrupt(run, out, run_dir, tmp_path, rnd, total)
    print(f"snapshot {snap['id']} at iteration {snap['iteration']}, killed at step {progress(out)}")

    restarted = gpusnap("restart", run_dir, cwd=tmp_path)
    assert restarted.returncode == 0, restarted.stderr
    assert f"restored snapshot {snap['id']}" in restarted.stderr
    print(*[line for line in restarted.stderr.splitlines() if "fast-forward" in line or "restored snapshot" in line], sep="\n")
    if program == "style_a.py":  # workers that draw no random numbers: no skipped batch is loaded
        assert "by batch sampler" in restarted.stderr
    assert_same(load_final(ref), load_final(out))


def test_a_forked_reference_ends_with_the_bytes_of_a_fresh_interpreters(tmp_path):
    """The references of these tests are forked from an interpreter that has imported torch
    (tests/forkserver.py): with DataLoader workers, a program run so ends as `python program.py`
    does, byte for byte."""
    if os.environ.get("GPUSNAP_TEST_FORKSERVER") == "0":
        pytest.skip("GPUSNAP_TEST_FORKSERVER=0: every reference is a subprocess")
    programs = copy_programs(tmp_path)
    forked, fresh = ref_and_out(tmp_path)
    env = forkserver.server_environment()
    reference = forkserver.start([programs / "style_a.py", forked, 2, 2], tmp_path, env, sys.executable)
    assert isinstance(reference, forkserver.Reference)
    _, err = reference.communicate(timeout=240)
    assert reference.returncode == 0, err
    done = subprocess.run([sys.executable, programs / "style_a.py", fresh, "2", "2"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    assert_same(load_final(fresh), load_final(forked))
    assert (fresh / "progress").read_text() == (forked / "progress").read_text()


@pytest.mark.slow
def test_a_snapshot_taken_while_the_program_evaluates_restarts_past_that_epochs_training(tmp_path):
    """A snapshot asked for during an evaluation that follows each epoch's training (each in a
    function of its own) lands at a boundary of the evaluation's loop. Its replay runs the epoch
    again up to there, and the epoch's training loop, which had run its course, stepped an
    optimizer on the way: the restart was refused. It is passed over now, by the manifest's
    ``finished``."""
    programs = copy_programs(tmp_path)
    ref, out = ref_and_out(tmp_path)
    plain(programs / "eval_between.py", ref, cwd=tmp_path)
    run = Run("run", "--dir", "snaps", programs / "eval_between.py", out, cwd=tmp_path)
    wait_for(lambda: (out / "phase").exists() and (out / "phase").read_text() == "eval 1", "the second evaluation", proc=run)
    snap = request_snapshot(run, tmp_path / "snaps")
    run.kill_group()
    manifest = json.loads((tmp_path / "snaps" / "snapshots" / f"{snap}.json").read_text())
    assert [(f["function"], f["ran"]) for f in manifest["finished"]] == [("train_one_epoch", 6)], manifest["finished"]
    restarted = gpusnap("restart", "snaps", cwd=tmp_path)
    assert restarted.returncode == 0, restarted.stderr
    assert "passed over " in restarted.stderr and "in train_one_epoch: it ran its course (6 iterations)" in restarted.stderr
    assert_same(load_final(ref), load_final(out))


@pytest.mark.more  # restarted, snapshotted and killed again: test_e2e_corpus's phase-one restart (CI's time)
def test_restart_twice_in_a_row(tmp_path):
    rnd = random.Random("twice")
    programs = copy_programs(tmp_path)
    ref, out = ref_and_out(tmp_path)
    args = [programs / "style_a.py", out, 0, 4]
    plain(programs / "style_a.py", ref, 0, 4, cwd=tmp_path)

    first = interrupt(Run("run", "--dir", "snaps", *args, cwd=tmp_path, env=SLOW), out, tmp_path / "snaps", tmp_path, rnd, 80)
    # The killed run's progress can be past the next signal's step already: SIGUSR1 would reach the
    # restart before it handles the signal. Only the restarted program's own steps count.
    (out / "progress").unlink()
    second_run = Run("restart", "snaps", cwd=tmp_path, env=SLOW)
    second = interrupt(second_run, out, tmp_path / "snaps", tmp_path, rnd, 80, floor=first["iteration"] + 2)
    assert second["iteration"] > first["iteration"]

    restarted = gpusnap("restart", "snaps", cwd=tmp_path)
    assert restarted.returncode == 0, restarted.stderr
    assert_same(load_final(ref), load_final(out))
    listed = gpusnap("ls", "snaps", "--json", cwd=tmp_path).stdout
    assert f'"resumed_from": "{first["id"]}"' in listed.replace('":"', '": "')
