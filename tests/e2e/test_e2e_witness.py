"""Every restart proves itself (graph/witness.py): the run that takes a snapshot records the
iterations after it, a restart compares its own and refuses (exit 6) on the first difference,
and `gpusnap verify --replay` asks the same question without touching the run directory.

The wrong restores are injected into the restart by tools/chaos/inject/sitecustomize.py (the random
module's generator put back one draw further, one batch skipped, a parameter moved by one ulp),
and each must be refused, the snapshot left intact: the same snapshot then restarts verified, to
the bytes of an uninterrupted run. A SIGTERM snapshot trains on while its writer writes, to leave
its witness, and stops with exit 75."""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import time
from pathlib import Path

import pytest
from harness import REPO, Run, assert_same, copy_programs, gpusnap, load_final, plain, programs_and_out, progress, ref_and_out, wait_for

pytestmark = pytest.mark.slow  # end-to-end runs: the full suite, not the quick loop

INJECT = REPO / "tools" / "chaos" / "inject"
ENV = {"OMP_NUM_THREADS": "1"}
SLOW = {**ENV, "TEST_STEP_SLEEP_S": "0.05"}


def injected(fault: str) -> dict:
    return {**ENV, "GPUSNAP_TEST_WRONG_RESTORE": fault, "PYTHONPATH": f"{INJECT}{os.pathsep}{REPO}"}


def stopped(script, args, tmp_path, at_step: int, env: dict = SLOW):
    """`gpusnap run` the program and SIGTERM it at ``at_step``: exit 75 and a snapshot; returns
    its witness (None: it has none) and the run's stderr."""
    out = tmp_path / "out"
    run = Run("run", "--dir", "snaps", script, out, *args, cwd=tmp_path, env=env)
    wait_for(lambda: progress(out) >= at_step, f"step {at_step}", timeout=180, proc=run)
    run.signal(signal.SIGTERM)
    rc, _, err = run.wait()
    assert rc == 75, err
    found = list((tmp_path / "snaps").glob("witness/*.json"))
    assert len(found) <= 1, found
    return (json.loads(found[0].read_text()) if found else None), err


def tree_state(root) -> dict:
    """Every file under ``root``: its content's digest and its modification time."""
    return {str(p.relative_to(root)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
            for p in sorted(root.rglob("*")) if p.is_file()}


FAULTS = {
    "rng": "the random module's random number generator stands elsewhere than in the run that took it",
    "batch": "(the first after the snapshot) consumed another batch than in the run that took it",
    "ulp": "the parameters differ from the run that took it",
    "epoch": "(the first after a DataLoader started again) consumed another batch than in the run that took it",
}
# CI's time: a batch and the parameters (each restart costs a program's start); the full set injects each.
INJECTED = FAULTS if os.environ.get("GPUSNAP_TEST_CORPUS") == "all" else {k: FAULTS[k] for k in ("batch", "ulp")}


def snapshotted_past_an_epoch(script, tmp_path, rnd):
    """SIGUSR1 in the first epoch (10 batches), kill -9 once the witness holds the next epoch's
    first iteration; returns the witness."""
    out = tmp_path / "out"
    run = Run("run", "--dir", "snaps", script, out, cwd=tmp_path, env=SLOW)
    at = rnd.randint(2, 6)
    wait_for(lambda: progress(out) >= at, f"step {at}", timeout=180, proc=run)
    run.signal(signal.SIGUSR1)
    witness = tmp_path / "snaps" / "witness" / "000001.json"
    wait_for(lambda: witness.exists() and json.loads(witness.read_text())["epoch"], "the next epoch in the witness",
             timeout=180, proc=run)
    run.kill_group()
    return json.loads(witness.read_text())


def test_each_wrong_restore_is_refused_and_the_snapshot_then_restarts_verified(tmp_path):
    rnd = random.Random("witness")
    script = copy_programs(tmp_path) / "corpus" / "collate_draws.py"
    ref, out = ref_and_out(tmp_path)
    plain(script, ref, cwd=tmp_path, env=ENV)
    doc = snapshotted_past_an_epoch(script, tmp_path, rnd)
    assert len(doc["iterations"]) == 3 and doc["params"]["exact"], doc
    first = doc["iterations"][0]["iteration"]
    assert [r["iteration"] for r in doc["iterations"]] == [first, first + 1, first + 2]
    assert doc["epoch"]["iteration"] == 11, doc["epoch"]  # the second epoch's first batch

    before = tree_state(tmp_path / "snaps")
    replayed = gpusnap("verify", "--replay", "snaps", cwd=tmp_path, env=ENV)
    assert replayed.returncode == 0, replayed.stderr
    assert "verified: the 3 iterations after it match the run that took it" in replayed.stderr
    assert tree_state(tmp_path / "snaps") == before, "verify --replay changed the run directory"
    assert [p.name for p in tmp_path.iterdir() if ".verify-" in p.name] == [], "the scratch copy was left behind"

    for fault, says in INJECTED.items():
        bad = gpusnap("restart", "snaps", cwd=tmp_path, env=injected(fault))
        print(fault, *[line for line in bad.stderr.splitlines() if "refused" in line], sep="\n")
        assert bad.returncode == 6, bad.stderr
        assert f"gpusnap: restore refused: snapshot {doc['snapshot']} restarted to other state" in bad.stderr
        assert says in bad.stderr, bad.stderr
        assert "hint: the snapshot is intact" in bad.stderr
    replayed = gpusnap("verify", "--replay", "snaps", cwd=tmp_path, env=injected("ulp"))
    assert replayed.returncode == 6 and FAULTS["ulp"] in replayed.stderr, replayed.stderr

    good = gpusnap("restart", "snaps", cwd=tmp_path, env=ENV)
    assert good.returncode == 0, good.stderr
    assert f"snapshot {doc['snapshot']} verified: the 3 iterations after it match the run that took it" in good.stderr
    assert_same(load_final(ref), load_final(out))
    log = [json.loads(line) for line in (tmp_path / "snaps" / "log.jsonl").read_text().splitlines()]
    diverged = [e for e in log if e.get("event") == "diverged"]
    assert len(diverged) == len(INJECTED) and all(e["id"] == doc["snapshot"] for e in diverged)  # (verify's: in its copy)
    assert [e["verified"] for e in log if e.get("event") == "restored"][-1] == "checking"


def test_a_sigterm_snapshot_trains_on_to_leave_its_witness(tmp_path):
    script = copy_programs(tmp_path) / "corpus" / "collate_draws.py"
    ref, out = ref_and_out(tmp_path)
    plain(script, ref, cwd=tmp_path, env=ENV)
    at = random.Random("sigterm").randint(4, 20)
    print(f"SIGTERM at step {at}")
    doc, err = stopped(script, [], tmp_path, at)  # (30 steps: it stops 3 iterations after the snapshot)
    assert doc is not None and len(doc["iterations"]) == 3, doc
    restarted = gpusnap("restart", "snaps", cwd=tmp_path, env=ENV)
    assert restarted.returncode == 0, restarted.stderr
    assert f"snapshot {doc['snapshot']} verified: the 3 iterations after it match" in restarted.stderr
    assert_same(load_final(ref), load_final(out))


def test_a_restart_without_a_witness_says_it_is_unverified(tmp_path):
    script = copy_programs(tmp_path) / "corpus" / "collate_draws.py"
    ref, out = ref_and_out(tmp_path)
    plain(script, ref, cwd=tmp_path, env=ENV)
    doc, _ = stopped(script, [], tmp_path, 6, env={**SLOW, "GPUSNAP_WITNESS_STOP_S": "0"})
    assert doc is None
    restarted = gpusnap("restart", "snaps", cwd=tmp_path, env=ENV)
    assert restarted.returncode == 0, restarted.stderr
    assert "unverified: it has no witness" in restarted.stderr
    log = [json.loads(line) for line in (tmp_path / "snaps" / "log.jsonl").read_text().splitlines()]
    assert [e["verified"] for e in log if e.get("event") == "restored"] == ["unverified"]
    assert_same(load_final(ref), load_final(out))


def test_the_witness_of_an_earlier_snapshot_of_the_same_id_proves_nothing(tmp_path):
    """An id is taken again after its snapshot failed, or was torn and moved aside, and its
    witness file stays. The new snapshot's own witness is not written yet when the run dies: its
    restart must not compare with the old one (tools/chaos.py, seed 20261128, refused such a
    restart: "consumed another batch"), but say it is unverified and restart to the right bytes."""
    script = copy_programs(tmp_path) / "corpus" / "collate_draws.py"
    ref, out = ref_and_out(tmp_path)
    plain(script, ref, cwd=tmp_path, env=ENV)
    earlier, _ = stopped(script, [], tmp_path, 4)
    assert earlier is not None and earlier.get("token")
    manifest = tmp_path / "snaps" / "snapshots" / "000001.json"
    manifest.rename(tmp_path / "torn-000001.json")  # as a torn manifest is moved aside
    (out / "progress").unlink()  # the run starts over: wait for its own steps
    doc, _ = stopped(script, [], tmp_path, 8, env={**SLOW, "GPUSNAP_WITNESS_STOP_S": "0"})
    assert json.loads(manifest.read_text())["witness_token"] != earlier["token"]
    assert doc == earlier  # the file on disk is still the earlier snapshot's
    restarted = gpusnap("restart", "snaps", cwd=tmp_path, env=ENV)
    assert restarted.returncode == 0, restarted.stderr
    assert "unverified: it has no witness" in restarted.stderr
    assert_same(load_final(ref), load_final(out))


# Whole-word masking draws from the collator's own generator, the plain one from the global one:
# the witness compares the batches either way, so CI runs the plain one (GPUSNAP_TEST_CORPUS=all: both).
MASKING = [False, True] if os.environ.get("GPUSNAP_TEST_CORPUS") == "all" else [False]


@pytest.mark.parametrize("whole_word", MASKING, ids=["masked", "whole-word"][:len(MASKING)])
def test_the_masked_lm_trainer_without_its_fix_is_refused_by_the_witness(tmp_path, whole_word):
    """The held-out program that restarted to other bytes with exit 0: accelerate's shard had
    collated the next batch, masks drawn, before the snapshot. With gpusnap's fix switched off in
    the run that takes the snapshot, the restart is refused; with it, it is verified (and
    tests/e2e/test_e2e_frameworks.py restarts it to the same bytes, both maskings)."""
    pytest.importorskip("datasets")
    args = ["--epochs", "2"] + (["--whole-word"] if whole_word else [])
    script = copy_programs(tmp_path) / "frameworks" / "hf_mlm.py"
    at = random.Random(f"mlm/{whole_word}").randint(3, 12)
    print(f"SIGTERM at step {at}")
    stopped(script, args, tmp_path, at, env={**injected("no-fetch-ahead"), "TEST_STEP_SLEEP_S": "0.1"})
    restarted = gpusnap("restart", "snaps", cwd=tmp_path, env=ENV)
    assert restarted.returncode == 6, restarted.stderr
    assert "consumed another batch than in the run that took it" in restarted.stderr


def test_no_snapshot_while_a_process_the_program_started_runs(tmp_path):
    """mnist_hogwild's shape: trainers started with torch.multiprocessing work on shared weights
    while the main process joins them. A snapshot then would hold none of their work, and a
    restart would start them again: it is refused, naming where they were started."""
    script = copy_programs(tmp_path) / "corpus" / "hogwild.py"
    out = tmp_path / "out"
    out.mkdir()
    run = Run("run", "--dir", "snaps", script, out, cwd=tmp_path, env={**ENV, "TEST_STEP_SLEEP_S": "0.1"})
    wait_for(lambda: progress(out) >= 1, "the main process joining its trainers", proc=run)
    run.signal(signal.SIGUSR1)
    rc, _, err = run.wait()
    assert rc == 0, err
    started = [line for line in err.splitlines() if line.startswith("gpusnap: the program started process ")]
    assert len(started) == 1 and "at programs/corpus/hogwild.py:41 (__main__.train): while a process it started runs" in started[0], err
    skipped = [line for line in err.splitlines() if line.startswith("gpusnap: snapshot skipped:")]
    assert len(skipped) == 1, err
    assert "that the program started at programs/corpus/hogwild.py:41 (__main__.train) is running" in skipped[0]
    assert "hint: take the snapshot once the processes the program starts itself have ended" in err
    assert not list((tmp_path / "snaps" / "snapshots").glob("*.json"))


def test_a_pool_made_at_setup_is_named_with_the_way_to_make_it_per_use(tmp_path):
    """A multiprocessing.Pool made at start and mapped over each epoch keeps its processes for the
    whole run, so no snapshot is ever taken: said at its start, and at each skipped snapshot, with
    the hint that a pool made per use (the corpus's pool_augment --per-epoch, which restarts to
    the same bytes) ends before the steps."""
    script = copy_programs(tmp_path) / "corpus" / "pool_augment.py"
    out = tmp_path / "out"
    out.mkdir()
    run = Run("run", "--dir", "snaps", script, out, "--epochs", "2", cwd=tmp_path, env={**ENV, "TEST_STEP_SLEEP_S": "0.1"})
    wait_for(lambda: progress(out) >= 2, "the second step", proc=run)
    run.signal(signal.SIGUSR1)
    rc, _, err = run.wait()
    assert rc == 0 and progress(out) == 12, err
    hint = "make the pool where its work is handed out (`with Pool(n) as pool:` around the map)"
    started = [line for line in err.splitlines() if line.startswith("gpusnap: the program started process ")]
    assert len(started) == 1 and "pool_augment.py:37 (multiprocessing.pool.worker)" in started[0] and hint in started[0], err
    skipped = err.split("gpusnap: snapshot skipped: ")[1].splitlines()
    assert "(multiprocessing.pool.worker) is running" in skipped[0] and hint in skipped[1], err
    assert not list((tmp_path / "snaps" / "snapshots").glob("*.json"))


def test_a_process_the_program_starts_ends_on_sigterm_and_ignores_the_snapshot_signal(tmp_path):
    """Forked from the trainee, a process the program starts had gpusnap's handlers: SIGTERM asked
    for a stop snapshot and left it running, so a Pool's terminate() joined a worker that waited
    on the lock the pool held, forever (pool_augment.py --per-epoch pool hung, 2 of 6). It has
    the program's dispositions now: SIGTERM ends it, and the snapshot signal, sent to the whole
    job, is ignored (a plain run would not have heard it)."""
    programs, out = programs_and_out(tmp_path)
    run = Run("run", "--dir", "snaps", programs / "terminated_child.py", out, cwd=tmp_path, env=ENV)
    wait_for(lambda: (out / "child.pid").exists(), "the child's start", proc=run)
    child = int((out / "child.pid").read_text())
    os.kill(child, signal.SIGUSR1)
    time.sleep(0.5)
    state = (Path("/proc") / str(child) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    assert state != "Z", "the snapshot signal ended the program's child"
    (out / "go").touch()
    rc, _, err = run.wait()
    assert rc == 0, err
    assert json.loads((out / "result.json").read_text()) == {"exitcode": -signal.SIGTERM}, err


def test_ranks_the_program_spawns_itself_are_named_when_they_start(tmp_path):
    """The PyTorch examples' multi-process shape: `torch.multiprocessing.spawn` starts the ranks
    and joins them in torch's own code, where the main process reaches no boundary. A snapshot
    request then waited, without a word, until the program ended (a SIGTERM: until its grace ran
    out). Now the start says at once that no snapshot can be taken while they run, and how to
    launch ranks that gpusnap snapshots."""
    programs, out = programs_and_out(tmp_path)
    run = Run("run", "--dir", "snaps", programs / "spawned_ranks.py", out, 30, cwd=tmp_path, env={**ENV, "TEST_STEP_SLEEP_S": "0.05"})
    wait_for(lambda: progress(out) >= 3, "rank 0's third step", proc=run)
    run.signal(signal.SIGUSR1)
    rc, _, err = run.wait()
    assert rc == 0 and progress(out) == 30, err
    said = [line for line in err.splitlines() if line.startswith("gpusnap: the program spawned processes at ")]
    assert len(said) == 1 and "spawned_ranks.py:27 (torch.multiprocessing.spawn): while they run, no snapshot can be taken" in said[0], err
    assert "launch them with `gpusnap run --nproc-per-node N`" in said[0]
    assert not list((tmp_path / "snaps" / "snapshots").glob("*.json"))
