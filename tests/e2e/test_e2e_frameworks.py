"""Framework trainers under the plain `gpusnap run`. The step loops of the transformers Trainer
(transformers.trainer) and of Lightning's `Trainer.fit` (lightning.pytorch.loops) live in
site-packages, which gpusnap instruments by default (gpusnap/frameworks); an Accelerate loop is
the program's own, over a DataLoader wrapper that fast-forward positions by its batch sampler. Each is run uninterrupted, and again under
`gpusnap run` with SIGUSR1 at a random step, kill -9 of the whole group a few steps later, then
`gpusnap restart`: the final bytes must be the uninterrupted run's. One seed per program by
default (printed); GPUSNAP_TEST_SEEDS=1,2,3 runs more.

A trainer gpusnap does not know, or a step loop reached through a library's wrapper, still says, at the first optimizer step, which loop steps the optimizer and which
`--instrument` modules would make its boundaries safe points."""

from __future__ import annotations

import os
import random
import signal
import time

import pytest
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
    start_plain,
    wait_for,
)

from gpusnap.errors import EXIT_PREEMPTED

pytestmark = pytest.mark.slow  # end-to-end runs: the full suite, not the quick loop

SEEDS = [int(s) for s in os.environ.get("GPUSNAP_TEST_SEEDS", "1").split(",")]
ENV = {"OMP_NUM_THREADS": "1"}

# name: (module to import, program, arguments after OUT, the optimizer steps after which each
# snapshot is taken (one epoch's: replay skips whole epochs; several: the run is killed and
# restarted that many times before it may finish), pause per step (s), what restart must say[, and
# how it must say it positioned the loader: by batch sampler unless named]).
# Steps are paced so that a snapshot commits well before the end, even on a loaded machine.
TRAINERS = {
    "transformers": (
        "transformers", "hf_trainer.py", ["--epochs", "4", "--accumulate", "2"], (12,), "0.15",
        "started the DataLoaderShard iterator at",
    ),
    # Accelerate's retry loop around the Trainer; a snapshot in the first epoch, and one after the
    # restart in the third (accelerate's GradientState lists the loader once more per epoch)
    "transformers-auto-batch": (
        "transformers", "hf_trainer.py", ["--epochs", "3", "--auto-batch"], (0, 48), "0.15",
        "started the DataLoaderShard iterator at",
    ),
    "accelerate": ("accelerate", "accelerate_loop.py", ["--epochs", "4"], (15,), "0.1", "in main to iteration"),
    # a collate function that draws, which accelerate's shard runs one batch ahead of the loop
    "accelerate-noisy": ("accelerate", "accelerate_loop.py", ["--epochs", "3", "--noisy"], (0,), "0.1", "in main to iteration"),
    # accelerator.accumulate(model) over 3 micro-batches, an evaluation after each epoch: the
    # witness's record of the next epoch's first iteration digests the evaluation's batches, and
    # its item took a freed one's address now and then (refused, 2 of 15, until the item was
    # told from the batches by identity)
    "accelerate-accumulate": ("accelerate", "accelerate_accumulate.py", [], (0,), "0.1", "in main to iteration"),
    # masked-LM pretraining on a `datasets` corpus: the collator draws the masks one batch ahead
    # (from the global generator; whole words, from a generator of its own seeded by `seed`)
    "transformers-mlm": ("datasets", "hf_mlm.py", ["--epochs", "2"], (0,), "0.15", "started the DataLoaderShard iterator at"),
    # a compute_loss subclass, a callback with state, a collator, evaluations during training: the
    # snapshot comes after one (the evaluation's prepared DataLoader, which the replay never makes)
    "transformers-custom": (
        "transformers", "hf_custom.py", ["--epochs", "2"], (10,), "0.15", "started the DataLoaderShard iterator at",
    ),
    # fine-tuning as guides set it up: batches grouped by length, NEFTune noise, a checkpoint and an
    # evaluation every 8 steps, the best loaded back from disk at the end, early stopping
    "transformers-best": ("transformers", "hf_best.py", [], (10,), "0.15", "started the DataLoaderShard iterator at"),
    # a GPT-2 in a hand-written loop: accumulation, a linear warmup schedule, sampled generations
    "transformers-loop": ("transformers", "gpt_loop.py", ["--epochs", "3"], (0,), "0.1", "in main to iteration"),
    # a Lightning Fabric loop with torchmetrics objects, its loader's DistributedSampler set to the
    # epoch by Fabric's wrapper: a snapshot in the second or third epoch
    "fabric": ("lightning", "fabric_loop.py", ["--epochs", "3", "--distributed-sampler"], (10,), "0.1", "in main to iteration"),
    # a fabric loop whose 2 workers jitter each sample: consumed, and past the first epoch refused
    # (3 of 3: the replay's count of iter() calls gave the DistributedSampler another epoch),
    # until the count was put back on that path too
    "fabric-workers": (
        "lightning", "fabric_loop.py", ["--epochs", "3", "--distributed-sampler", "--workers", "2"], (10,), "0.1",
        "in main to iteration", "by consuming",
    ),
    # an Accelerate loop over a streaming IterableDataset (a DataLoaderDispatcher, consumed):
    # refused past the first epoch (3 of 3: the replay's epoch count went to set_epoch) until the
    # count was put back
    "accelerate-stream": ("accelerate", "accelerate_stream.py", [], (20,), "0.1", "in main to iteration", "by consuming"),
    # a streaming IterableDataset split between 2 workers, a collator that draws, `max_steps`:
    # Accelerate dispatches such a loader's batches, and the Trainer advances the dispatcher's
    # iterator by hand, which has no index sampler to skip by. Refused, 3 of 3, until a new one
    # took the batches again and had to hold the batches the run's held
    "transformers-stream": (
        "transformers", "hf_stream.py", ["--workers", "2", "--drop-tokens"], (0,), "0.15",
        "started the DataLoaderDispatcher iterator at", "by taking batches",
    ),
    # the same with no workers: the collator draws from the global generator, and the batches
    # taken again differ; the dataset's own iterator then proves the place
    "transformers-stream-main": (
        "transformers", "hf_stream.py", ["--drop-tokens"], (0,), "0.15", "started the DataLoaderDispatcher iterator at",
        "by taking batches",
    ),
    # two-stage fine-tuning, the head alone with a first Trainer, then everything with a second,
    # from a snapshot in the second: refused, 2 of 2 (accelerate's GradientState lists a Trainer's
    # loader once per epoch, the first Trainer's included, which the replay, passing over that
    # Trainer's loop, never listed), until the replay's list was kept (frameworks/accelerate.py)
    "transformers-two-phase": (
        "transformers", "hf_two_phase.py", [], (45,), "0.15", "started the DataLoaderShard iterator at",
    ),
    # a masked LM as the transformers examples write it: at start, the last checkpoint in the
    # output directory, if any, passed to train(resume_from_checkpoint=...); a checkpoint every 5
    # steps. The replay's start found the one the run saved before the snapshot, and in the first
    # epoch its `_run_epoch` skipped the batches the run had taken: refused, 2 of 4 ("its
    # DataLoader has 3 batches"), until a loop's start gave its first iteration the run's locals
    "transformers-example-resume": (
        "datasets", "hf_example_resume.py", ["--epochs", "1"], (6,), "0.15", "started the DataLoaderShard iterator at",
    ),
}


# Shapes the default run covers elsewhere (GPUSNAP_TEST_CORPUS=all runs them): two restarts in
# one run (test_e2e_corpus's distill twice), a hand-written loop over a transformers model (the
# corpus's nanogpt_style, word_lm), a collator that draws one batch ahead (transformers-mlm),
# Trainer checkpoints rotated on disk (test_e2e_files.py's hf_trainer --save-steps), a subclass
# with evaluations during training (transformers-mlm's Trainer; an evaluation's loader left behind:
# test_e2e_restart.py's snapshot while the program evaluates, and the Lightning tests).
# The plain Trainer itself: transformers-mlm, and test_e2e_files.py's hf_trainer.py.
MORE_TRAINERS = ("transformers-auto-batch", "transformers-loop", "accelerate-noisy", "transformers-best", "transformers-custom",
                 "transformers", "accelerate-accumulate", "transformers-stream-main", "fabric-workers",
                 "transformers-two-phase", "transformers-example-resume")


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.more) if n in MORE_TRAINERS else n for n in TRAINERS])
def test_a_framework_trainer_restarts_to_the_same_bytes(tmp_path, name, seed):
    module, program, args, floors, pause_s, how, positioned = (*TRAINERS[name], "by batch sampler")[:7]
    pytest.importorskip(module)
    started = time.monotonic()
    rnd = random.Random(f"{name}/{seed}")
    print(f"program {name} seed {seed}")
    programs, out = programs_and_out(tmp_path)
    script = programs / "frameworks" / program
    ref = tmp_path / "ref"
    ref.mkdir()
    plain(script, ref, *args, cwd=tmp_path, env=ENV)
    total = progress(ref)
    print(f"reference: {total} steps in {time.monotonic() - started:.1f} s")

    slow = {**ENV, "TEST_STEP_SLEEP_S": pause_s}
    restarted = kill_and_restart(script, args, tmp_path, out, rnd, total, ENV, slow, floors)
    assert f"{how} " in restarted.stderr and positioned in restarted.stderr, "positioned otherwise"
    assert_same(load_final(ref), load_final(out))
    print(f"{name}: {time.monotonic() - started:.1f} s")


if os.environ.get("GPUSNAP_TEST_CORPUS") == "all":  # CI time: the masks come from the collator's own generator
    TRAINERS["transformers-mlm-whole-word"] = ("datasets", "hf_mlm.py", ["--epochs", "2", "--whole-word", "--collator-seed", "7"],
                                               (0,), "0.15", "started the DataLoaderShard iterator at")


# name: (module to import, program, the loop the notice names, modules it names)
UNKNOWN = {
    "a library's trainer": (None, "unknown_trainer.py", "site-packages/minitrainer.py:", ["minitrainer"]),
    # (a library's own step loop, the program's: test_e2e_stepper.py)
    "a library's wrapper": (None, "wrapped_loop.py", "wrapped_loop.py:18 (train), called through", ["trainerlib"]),
}


@pytest.mark.parametrize("name", UNKNOWN)
def test_a_step_loop_gpusnap_does_not_instrument_is_named_at_the_first_step(tmp_path, name):
    module, program, loop, modules = UNKNOWN[name]
    if module:
        pytest.importorskip(module)
    programs, out = programs_and_out(tmp_path)
    run = Run("run", "--dir", "snaps", programs / "frameworks" / program, out, cwd=tmp_path, env=ENV)
    wait_for(lambda: progress(out) >= 2, "two optimizer steps", timeout=180, proc=run)
    run.kill_group()
    err = run.proc.stderr.read()
    notices = [line for line in err.splitlines() if line.startswith("gpusnap: the optimizer steps inside a loop at")]
    assert len(notices) == 1, err
    assert loop in notices[0] and "which gpusnap does not instrument" in notices[0]
    for needed in modules:
        assert f"--instrument {needed}" in notices[0]


# name: (program, arguments after OUT, the step by which the snapshot is asked for (None: any),
# steps in all, snapshot after step, how restart positions the trainer's DataLoader iterator)
LIGHTNING = {
    # past the first epoch: the iterator is made again, by its index sampler
    "fit": ("lightning_fit.py", [], None, 60, 20, "again at their saved batches (by batch sampler)"),
    # a LightningDataModule whose 2 persistent workers jitter samples with numpy's global generator
    # (seed_everything(workers=True)), past the first epoch: the replay's fresh workers are given
    # the generators the original's started the epoch with, and the epoch's batches are taken again
    "datamodule-persistent-workers": ("lightning_dm.py", ["--epochs", "6", "--workers", "2", "--persistent", "--augment"],
                                      None, 102, 20, "with their workers' random number generators where the epoch"),
}
if os.environ.get("GPUSNAP_TEST_CORPUS") == "all":  # CI time: it passes where "fit" does
    # a LightningDataModule, in the first epoch (17 batches): the replay's iterator is advanced
    LIGHTNING["datamodule"] = ("lightning_dm.py", [], 14, 51, 0, "advanced the DataLoader iterator at")
    # Lightning's BackboneFinetuning past the unfreezing (epoch 2: a parameter group added to the
    # optimizer, its rate raised each epoch by the callback): exact at the first try, 3 of 3
    LIGHTNING["finetune"] = ("lightning_finetune.py", [], None, 80, 45, "again at their saved batches (by batch sampler)")
    # a GAN with manual optimization (two optimizers, toggle_optimizer, manual_backward), past its
    # first epoch: exact at the first try, 3 of 3
    LIGHTNING["gan-manual"] = ("lightning_gan_manual.py", [], None, 48, 18, "again at their saved batches (by batch sampler)")
    # the callbacks guides stack: StochasticWeightAveraging from epoch 2 (its own rates, the
    # weights averaged each epoch), accumulation over 2 batches from epoch 1, validation twice an
    # epoch, early stopping, a learning-rate monitor into a CSVLogger, past the averaging's start
    # (optimizer step 30): exact at the first try, 6 of 6 (and 3 of 3 in the first epoch)
    LIGHTNING["swa-callbacks"] = ("lightning_swa.py", [], None, 60, 30, "again at their saved batches (by batch sampler)")


# The full set runs both (CI's time): lightning_fit.py restarts to the same bytes in the SIGTERM
# test below; the persistent workers' generators: tests/graph/test_workers.py, and a
# LightningDataModule with two persistent workers restarts in test_e2e_files.py.
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.more) for n in LIGHTNING])
def test_a_lightning_fit_restarts_to_the_same_bytes(tmp_path, name, seed):
    """The plain command: a snapshot at a random step lands in Lightning's step loop; after
    kill -9, restart puts the shuffled DataLoader's iterator inside the trainer's CombinedLoader
    at its batch by its index sampler (no skipped batch loaded), and merges the trainer's state
    (loop progress, optimizer, LR schedule, logged metrics, logger, callbacks). A validation run
    in the middle of each epoch leaves its own CombinedLoader iterator behind, which restart must
    leave alone. Lightning's step loop is instrumented: no notice says otherwise, the optimization
    helpers between that loop and the optimizer's step notwithstanding."""
    pytest.importorskip("lightning")
    program_name, args, by, total, floor, how = LIGHTNING[name]
    started = time.monotonic()
    rnd = random.Random(f"lightning/{seed}" if name == "fit" else f"lightning-{name}/{seed}")
    print(f"seed {seed}")
    program = copy_programs(tmp_path) / "frameworks" / program_name
    ref, out = ref_and_out(tmp_path)
    reference = start_plain(program, ref, *args, cwd=tmp_path, env=ENV)  # beside the run: most of each is start-up

    # Paced so that the snapshot commits well before the end, the workers' CPU notwithstanding.
    pause_s = "0.15" if "--workers" in args else "0.05"
    run = Run("run", "--dir", "snaps", program, out, *args, cwd=tmp_path, env={**ENV, "TEST_STEP_SLEEP_S": pause_s})
    snap = interrupt(run, out, tmp_path / "snaps", tmp_path, rnd, total, floor=floor, by=by)
    print(f"snapshot {snap['id']} at iteration {snap['iteration']}, killed at step {progress(out)}")
    assert floor < snap["iteration"] <= progress(out)
    assert "does not instrument" not in run.proc.stderr.read()

    restarted = gpusnap("restart", "snaps", cwd=tmp_path, env=ENV)
    print(*[line for line in restarted.stderr.splitlines() if line.startswith("gpusnap:")], sep="\n")
    assert restarted.returncode == 0, restarted.stderr
    assert f"restored snapshot {snap['id']}" in restarted.stderr
    assert how in restarted.stderr
    assert "does not instrument" not in restarted.stderr
    _, err = reference.communicate(timeout=240)
    assert reference.returncode == 0 and progress(ref) == total, err
    assert_same(load_final(ref), load_final(out))
    print(f"lightning {name}: {time.monotonic() - started:.1f} s")


def test_a_lightning_fit_stopped_by_sigterm_to_the_whole_job_finishes_on_requeue(tmp_path):
    """A scheduler's SIGTERM goes to the whole job: Lightning's own handler (its signal connector,
    which chains the handler it found: gpusnap's) hears it too, and stops the fit at its next
    batch. It runs after the stop snapshot's witness, so the requeued `gpusnap run` is verified,
    and ends with the uninterrupted run's bytes."""
    pytest.importorskip("lightning")
    program = copy_programs(tmp_path) / "frameworks" / "lightning_fit.py"
    ref, out = ref_and_out(tmp_path)
    reference = start_plain(program, ref, cwd=tmp_path, env=ENV)
    run = Run("run", "--dir", "snaps", program, out, cwd=tmp_path, env={**ENV, "TEST_STEP_SLEEP_S": "0.05"})
    wait_for(lambda: progress(out) >= 25, "step 25", proc=run)
    os.killpg(run.proc.pid, signal.SIGTERM)
    code, _, err = run.wait()
    assert code == EXIT_PREEMPTED, err
    assert "Received SIGTERM" in err  # Lightning's handler ran, after the snapshot
    again = gpusnap("run", "--dir", "snaps", program, out, cwd=tmp_path, env=ENV)
    assert again.returncode == 0, again.stderr
    assert " verified: " in again.stderr, again.stderr
    _, err = reference.communicate(timeout=240)
    assert reference.returncode == 0, err
    assert_same(load_final(ref), load_final(out))
