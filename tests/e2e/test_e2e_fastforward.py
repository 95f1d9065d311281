"""Fast-forward is exact or refuses, through the real CLI: loops over a shuffled DataLoader seen
through tqdm, enumerate and islice restart to the same bytes; a generator whose items depend on
random numbers the loop body also draws is refused (exit 6, naming the loop) and, with --force,
restored with a warning; a seeded generator is consumed exactly; an iterator advanced by hand in
a step loop is put back where it stood (a DataLoader's) or refused (a generator's); an exception
raised while a source is re-created is a one-line refusal. Each run is stopped by SIGTERM (a
snapshot, then exit 75) at a random step of its second epoch, and restarted; the seed is printed
(GPUSNAP_TEST_SEEDS=N picks another)."""

from __future__ import annotations

import os
import random
import signal

import pytest
from harness import Run, assert_same, copy_programs, gpusnap, load_final, plain, progress, snapshots, wait_for

pytestmark = pytest.mark.slow  # end-to-end runs: the full suite, not the quick loop

SEED = int(os.environ.get("GPUSNAP_TEST_SEEDS", "1").split(",")[0])
SLOW = {"TEST_STEP_SLEEP_S": "0.03"}


def _snapshot_then_stop(tmp_path, program: str, args: list, per_epoch: int, name: str, reference: bool = True):
    """Run the program (and, when ``reference``, once plainly); at a random step of its second
    epoch (of three or more) send SIGTERM: a snapshot, then exit 75, as on preemption (no race
    with the program's end, whatever the load). Returns (ref, out, snapshot)."""
    rnd = random.Random(f"{name}/{SEED}")
    programs = copy_programs(tmp_path)
    ref, out = tmp_path / "ref", tmp_path / "out"
    ref.mkdir()
    out.mkdir()
    if reference:
        plain(programs / program, ref, *args, cwd=tmp_path)
    run = Run("run", "--dir", "snaps", programs / program, out, *args, cwd=tmp_path, env=SLOW)
    stop_at = rnd.randint(per_epoch + 2, 2 * per_epoch - 2)
    print(f"{name}: seed {SEED}, SIGTERM at step {stop_at}")
    wait_for(lambda: progress(out) >= stop_at, f"step {stop_at}", proc=run)
    run.signal(signal.SIGTERM)
    code, _, err = run.wait()
    assert code == 75, err
    assert not (out / "final.pt").exists(), "the program finished before it was stopped"
    return ref, out, snapshots(tmp_path / "snaps", tmp_path)[-1]


def _refusal(result) -> list[str]:
    lines = [line for line in result.stderr.splitlines() if line.startswith(("gpusnap: restore refused", "hint:"))]
    assert len(lines) == 2 and lines[0].startswith("gpusnap: restore refused") and lines[1].startswith("hint: "), result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    return lines


# Every wrapper is seen through alike (tests/restore/test_fastforward.py positions each): for
# CI's time, the others than tqdm run only with GPUSNAP_TEST_CORPUS=all.
WRAPPERS = ["tqdm"] + (["tqdm-enumerate", "islice", "enumerate-tqdm"] if os.environ.get("GPUSNAP_TEST_CORPUS") == "all" else [])


@pytest.mark.parametrize("style", WRAPPERS)
def test_a_wrapped_shuffled_loader_restarts_to_the_same_bytes(tmp_path, style):
    ref, out, snap = _snapshot_then_stop(tmp_path, "ff_wrappers.py", [style, 3], 9 if style == "islice" else 12, style)
    restarted = gpusnap("restart", "snaps", cwd=tmp_path)
    assert restarted.returncode == 0, restarted.stderr
    assert f"restored snapshot {snap['id']}" in restarted.stderr
    assert_same(load_final(ref), load_final(out))
    assert "by batch sampler" in restarted.stderr, "the DataLoader inside the wrapper was not seen"


@pytest.mark.more  # the loader inside tqdm's iterator: the tqdm wrapper above (CI's time)
def test_a_progress_bar_in_a_local_restarts_to_the_same_bytes(tmp_path):
    ref, out, snap = _snapshot_then_stop(tmp_path, "ff_wrappers.py", ["pbar", 3], 12, "pbar")
    restarted = gpusnap("restart", "snaps", cwd=tmp_path)
    assert restarted.returncode == 0, restarted.stderr
    assert_same(load_final(ref), load_final(out))


def test_a_generator_interleaved_with_the_body_is_refused_and_force_warns(tmp_path):
    _, out, snap = _snapshot_then_stop(tmp_path, "ff_generators.py", ["interleaved", 3], 20, "interleaved", reference=False)
    refused = gpusnap("restart", "snaps", cwd=tmp_path)
    assert refused.returncode == 6, refused.stderr
    message, hint = _refusal(refused)
    assert "fast-forward of loop programs/ff_generators.py:33 (in <module>) reproduced a different item at iteration" in message
    assert "--force" in hint
    assert not (out / "final.pt").exists()

    forced = gpusnap("restart", "snaps", "--force", cwd=tmp_path)
    assert forced.returncode == 0, forced.stderr
    assert "warning: fast-forward of loop programs/ff_generators.py:33 (in <module>) reproduced a different item" in forced.stderr
    assert f"restored snapshot {snap['id']}" in forced.stderr and (out / "final.pt").exists()


def test_a_generator_with_its_own_seeded_rng_is_consumed_exactly(tmp_path):
    ref, out, _ = _snapshot_then_stop(tmp_path, "ff_generators.py", ["seeded", 3], 20, "seeded")
    restarted = gpusnap("restart", "snaps", cwd=tmp_path)
    assert restarted.returncode == 0, restarted.stderr
    assert_same(load_final(ref), load_final(out))
    assert "by consuming" in restarted.stderr


def test_a_dataloader_iterator_advanced_by_hand_is_put_back_where_it_stood(tmp_path):
    ref, out, _ = _snapshot_then_stop(tmp_path, "ff_manual_iter.py", ["loader", 4], 12, "manual-loader")
    restarted = gpusnap("restart", "snaps", cwd=tmp_path)
    assert restarted.returncode == 0, restarted.stderr
    assert_same(load_final(ref), load_final(out))
    assert "advanced the DataLoader iterator at globals[__main__].it by" in restarted.stderr


@pytest.mark.more  # run again to its place: the endless generator below, item by item (CI's time)
def test_a_generator_advanced_by_hand_is_run_again_to_its_place(tmp_path):
    ref, out, _ = _snapshot_then_stop(tmp_path, "ff_manual_iter.py", ["generator", 4], 12, "manual-generator")
    restarted = gpusnap("restart", "snaps", cwd=tmp_path)
    assert restarted.returncode == 0, restarted.stderr
    assert "ran the generator at globals[__main__].it to item" in restarted.stderr
    assert_same(load_final(ref), load_final(out))


def test_an_endless_generator_advanced_by_hand_is_run_again_item_by_item_to_its_place(tmp_path):
    """`while True: ... yield` over a generator of its own, made in setup and advanced by `next()`:
    refused before ("it stood in a `while` loop"); a `while` has no iterator to skip with, so
    restart takes its items until its loops stand where they stood, and its fingerprint proves it."""
    ref, out, _ = _snapshot_then_stop(tmp_path, "ff_manual_iter.py", ["stream", 4], 12, "manual-stream")
    restarted = gpusnap("restart", "snaps", cwd=tmp_path)
    assert restarted.returncode == 0, restarted.stderr
    assert "ran the generator at globals[__main__].endless to its saved place by taking" in restarted.stderr
    assert_same(load_final(ref), load_final(out))


@pytest.mark.more  # a source that cannot be put back is refused: the interleaved generator above (CI's time)
def test_a_generator_expression_advanced_by_hand_is_refused(tmp_path):
    _, out, _ = _snapshot_then_stop(tmp_path, "ff_manual_iter.py", ["genexpr", 4], 12, "manual-genexpr", reference=False)
    refused = gpusnap("restart", "snaps", cwd=tmp_path)
    assert refused.returncode == 6, refused.stderr
    message, _ = _refusal(refused)
    assert "cannot position the generator at globals[__main__].it" in message
    assert "programs/ff_manual_iter.py:44 (in <module>)" in message
    assert not (out / "final.pt").exists()


def test_an_exception_while_a_source_is_recreated_is_a_one_line_refusal(tmp_path):
    _, out, _ = _snapshot_then_stop(tmp_path, "ff_broken_iter.py", [6], 4, "broken", reference=False)
    refused = gpusnap("restart", "snaps", cwd=tmp_path, env={"BREAK_ITER": "1"})
    assert refused.returncode == 6, refused.stderr
    message, _ = _refusal(refused)
    assert message == (
        "gpusnap: restore refused: fast-forward of loop programs/ff_broken_iter.py:24 (in <module>) "
        "failed: RuntimeError: the data server is gone"
    )
    assert not (out / "final.pt").exists()
