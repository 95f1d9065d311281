"""Programs written the way people write them (tests/programs/corpus: the PyTorch examples' word
language model, DCGAN, MNIST, LBFGS time series, ImageNet, VAE and REINFORCE; tqdm loops; a
script's usual furniture, and torch's own (SWA, hooks, parametrizations); a torch.compile'd
model; a char-RNN in `while True`; closures that own the optimizer; a home-made trainer with
callbacks and a model class defined in a function; batches taken by hand; a streaming dataset
with workers; augmentation from a generator the dataset keeps; tensors of unusual kinds (a
sparse embedding and its last sparse gradient, parameters viewing one flat buffer, a Parameter
subclass, complex and bfloat16 weights, pruning, a GradScaler); a DQN agent writing its replay
buffer in place and its target network by hand; a script that checkpoints and resumes itself,
whose replay finds the checkpoint it saved before the snapshot; a TorchScript model under the
torch profiler; validation every few steps over a shuffled loader; pseudo-labels from an
itertools.cycle over the unlabeled loader; a DDP script run as one plain process; K-fold
cross-validation with a model made per fold; a pipeline of chained generators over JSON-lines
shards; an EMA over a checkpointed, autocast model; state on a script's classes and
functions, and in closures bound to its globals; a DP-SGD by hand with torch.func; lazy modules
materialized in the first step; a best state that shares the parameters' memory; losses summed over an accumulation window;
federated averaging over clients drawn each round;
a curriculum that switches loaders by its accuracies; sharpness-aware minimization; phases inside
`with` blocks that put state back at their exit; per-parameter settings keyed by the parameters or
their ids; a head replaced or tied at a phase change; an EMA that starts as the parameters;
settings changed process-wide: environment variables, torch's threads and default dtype; SWA
switched on late; objects that only a cached getter holds; a helper module imported inside the
loop; an output directory the script entered; an EMA on an optimizer's step hook; a warmup's hook removed
by its handle; a report kept in a StringIO; a hook for every module or optimizer; epochs' weights
and a loss log kept in a TemporaryDirectory; metrics in an SQLite database; statistics in a
WeakKeyDictionary; a log file never flushed by hand; a log handler added mid-run; an evaluator
run as a subprocess that appends to a results file; a CSV writer made at the first step; predictions written into a NumPy memmap;
spectral normalization put on a discriminator after warm-up; records of classes main() defines) continue
with the same bytes after a kill: each is run uninterrupted, and again under `gpusnap run` with
SIGUSR1 at a random step, kill -9 of the whole process group a few steps later, then `gpusnap
restart`. One seed per program by default (printed; pytest shows it on failure);
GPUSNAP_TEST_SEEDS=1,2,3 runs more.
The programs in ``MORE`` pass in shapes the others already cover; GPUSNAP_TEST_CORPUS=all runs
them too."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time

import pytest
from harness import _env, assert_same, copy_programs, kill_and_restart, load_final, plain, progress

from gpusnap.launch.supervisor import string_hash_seed
from gpusnap.store.rundir import RunDir

pytestmark = pytest.mark.slow  # end-to-end runs: the full suite, not the quick loop

SEEDS = [int(s) for s in os.environ.get("GPUSNAP_TEST_SEEDS", "1").split(",")]

# name: (program under programs/corpus, arguments after OUT[, snapshot after step, how restart must
# say it fast-forwarded[, optimizer steps before the first one the program reports]])
CORPUS = {
    "word_lm": ("word_lm.py", []),
    "tensor_kinds": ("tensor_kinds.py", []),
    "resumes_itself": ("resumes_itself.py", []),
    # state on the program's classes and functions (in closures bound to module globals too:
    # module_closures, the full set): both decide steps past the witness's first iterations (a
    # restart once said verified); past the first epoch (10 batches), which a class defined in
    # main() counts
    "class_state": ("class_state.py", [], 10, "gpusnap: fast-forward "),
    # No torch.optim: per-example gradients with torch.func over `params = {k: v.detach() ...}`,
    # rebound each step. The replay's dict shares the parameters' memory, the run's had parted:
    # the merge once wrote the model's first weights over it, and the witness, with no optimizer
    # to compare, said verified (3 of 3 silently wrong; now it digests the loop's tensors)
    "dp_sgd": ("dp_sgd.py", []),
    # `best = (val_loss, model.state_dict())` without a copy, one tuple made in the loop, past the
    # best epoch (51 steps; best_state_alias, the full set, keeps the state dict alone): the merge
    # took the snapshot's tuple, whose state dict viewed the snapshot's copies of the parameters,
    # and the restart said "verified" and saved another best (2 of 3), until such a tuple was built
    # anew from the live objects
    "best_state_alias-as-tuple": ("best_state_alias.py", ["--as-tuple"], 51, "gpusnap: merging "),
    # the same choice from a list of accuracies, past the switch: the replay's prefix takes the easy
    # loader, the run's loop the hard one. Once that loop's iterator was made again from the run's
    # loader, `loader` itself stayed the replay's: "verified", and the epoch's mean over the other
    # dataset (1 of 3) until a live-only object stood for one live object at all its places
    "curriculum_switch-by-history": ("curriculum_switch.py", ["--by-history"], 13, "gpusnap: fast-forward "),
    # A replay memory allocated at the first transition, an array written in place and a
    # torch.from_numpy tensor over it that batches are drawn from: the snapshot kept two copies,
    # the merge adopted both apart, and the restart said "verified" with other bytes (2 of 4; 2
    # refused), until the tensor's storage came back over the array's memory
    "lazy_buffer": ("lazy_buffer.py", []),
    # a counter that `@functools.cache def stats()` made on first use, past the first epoch: the
    # snapshot held nothing of CPython's cache, and the restart said "verified" (the counter
    # touches no parameter) with other final state, 2 of 2, until the program's caches kept
    # their entries (graph.caches)
    "cached_getters-counter": ("cached_getters.py", ["counter"], 6, "gpusnap: fast-forward "),
    # an output directory named by the start time, entered in setup (as Hydra's chdir does), the
    # epochs' metrics read back from it by a relative path: the replay's setup entered another,
    # and the restart said "verified" with other bytes, 3 of 3, until the working directory the
    # program changed was kept (graph.settings)
    "chdir_outputs-setup": ("chdir_outputs.py", ["setup"], 9, "settings the run's steps had changed"),
    # a train step defined at a phase change over torch.func.grad of a loss through
    # functional_call, the loop calling it through a local that held a plain step before: refused,
    # 2 of 2 ("the snapshot holds function main.<locals>.train_step here, the replayed program
    # main.<locals>.plain_step"); with functions made again, refused 2 of 2 in its first step
    # (the NameError of an empty cell: the names main() bound to torch.func's wrapper and the loss
    # were never bound in the replay) until they were made again too, and the wrapper's cell that
    # holds torch._functorch's module got it back by name
    "step_factory-func": ("step_factory.py", ["--style", "func"], 16, "gpusnap: fast-forward "),
    # a warmup's forward hook registered in setup, its handle's remove() at the phase change: the
    # restored handle's weak reference named the snapshot's copy of the hook dict, the hook stayed,
    # and the restart said "verified" with other bytes, 3 of 3, until handles were kept with their dicts
    "late_hooks-remove_hook": ("late_hooks.py", ["remove_hook"], 0, "gpusnap: fast-forward "),
    # a hook for every module (register_module_forward_hook) registered at the second epoch,
    # counting what each Tanh puts out: "verified" with another count, 3 of 3, until torch's
    # process-wide module hooks were kept (graph.roots)
    "global_hooks": ("global_hooks.py", [], 21, "gpusnap: fast-forward "),
    # each epoch's metrics inserted into an SQLite database, the best read back at the end: SQLite
    # writes natively, unseen, and the rows after the snapshot were there twice, exit 0, 2 of 6,
    # until the database was kept by the path sqlite3.connect opens
    "sqlite_metrics": ("sqlite_metrics.py", [], 13, "gpusnap: fast-forward "),
    # a metrics file opened in setup, a line per step, never flushed by hand: the lines in its
    # buffer at the snapshot were lost, "verified", 3 of 3, until buffers were flushed in the stall
    "buffered_log": ("buffered_log.py", [], 0, "gpusnap: fast-forward "),
    # a logging.FileHandler added to the script's logger at the third epoch: loggers pickle by
    # name and logging's registry held its handlers, so the restarted logger had none and the log
    # lost every line after the snapshot, "verified", 2 of 3, until the loggers were kept
    "late_logger": ("late_logger.py", [], 21, "gpusnap: fast-forward "),
    # spectral normalization put on a discriminator's layers at epoch 2 (torch makes each
    # parametrized module a class of its own, ParametrizedLinear), on a layer weight-normalized
    # since setup: the replay held plain Linear layers there, and the restart was refused, 2 of 2,
    # until such modules were made again from the snapshot (graph.madeclasses)
    "parametrize_late-setup": ("parametrize_late.py", ["--setup"], 18, "gpusnap: fast-forward "),
    # namedtuples, a dataclass and an Enum whose classes main() defines, made in the steps: the
    # replay memory's transitions were live-only with nothing of the replay's at their places
    # (refused, 2 of 2); the best evaluation, a namedtuple, kept the replay's setup value, read
    # back into each step's record: "verified" with other bytes, 1 of 2; the phase Enum member had
    # the run's name and value written over the replay's WARMUP member: refused by the witness,
    # 2 of 2. Each is made again of the replay's class now (restore.merge._made_object)
    "local_records": ("local_records.py", [], 12, "gpusnap: fast-forward "),
    # deprecated calls whose warnings, shown once per place, go to the log (captureWarnings): the
    # restarted process showed each again, "verified" with two more lines in the log, 2 of 2,
    # until the records of what was shown were kept (graph.warned)
    "warn_once": ("warn_once.py", [], 11, "gpusnap: fast-forward "),
    # a fresh output directory per run, the first free runs/exp{n} (as YOLO-style scripts take),
    # its results CSV opened in setup: the replay's setup found runs/exp taken and opened
    # runs/exp2/results.csv, whose file and csv.writer were kept, and the restarted run wrote its
    # later rows there, "verified", 2 of 2, until the run's file was opened again (restore.merge)
    "increment_dir": ("increment_dir.py", [], 10, "gpusnap: fast-forward "),
    # a trainer object that rebinds its own methods at phase changes (`self.score = self.top3`),
    # past the second: the merge kept the replay's bound method, and the scores after the restart
    # were top-1's, "verified" with other bytes, 2 of 2, until a method the run bound was bound to
    # its owner's counterpart (restore.merge); the loss's switch too: the full set
    "method_switch-score-only": ("method_switch.py", ["--score-only"], 21, "gpusnap: fast-forward "),
    # `record = history["finetune"].append` at the switch to fine-tuning, past the epoch after it:
    # the replay's `append` of the pretraining list stood (a builtin method is live-only), and the
    # restart said "verified" with the fine-tuning losses in the other list, 1 of 1, until such a
    # method of plain data was got from its owner's counterpart; the log's `write` moved to a
    # second log likewise: refused, 2 of 2 (the replay's `write` of the first log, which the merge
    # closed), until a file's builtin method was got from the file opened again
    "phase_history": ("phase_history.py", [], 31, "gpusnap: fast-forward "),
    # DDP's PowerSGD communication hook registered in setup: restore gives the replay's DDP a
    # reducer with the run's bucket layout, built anew without the hook, and the restart reduced
    # uncompressed gradients: refused by the witness, 2 of 2, until the run's hook was registered
    # on it again (frameworks.ddp); registered mid-run (late): the full set
    "ddp_one_process-powersgd": ("ddp_one_process.py", ["--powersgd", "setup"], 4, "gpusnap: fast-forward "),
    # `new_id = itertools.count().__next__` names each batch, `accumulate = epoch_total.add_`
    # sums each epoch's losses: a builtin method of an object the merge adopts or replaces was
    # the replay's, and the restart numbered batches from 0 again, "verified" with other bytes,
    # 2 of 2, until every builtin method was bound to what stands for its owner
    "sample_ids": ("sample_ids.py", [], 0, "gpusnap: fast-forward "),
}
MORE = {
    # the same with the loss switched after the warm-up: refused by the witness, 2 of 2, before
    "method_switch": ("method_switch.py", [], 21, "gpusnap: fast-forward "),
    # the replay memory's array allocated in setup, its `torch.from_numpy` tensor at the first
    # transition: the merge adopted the tensor over the snapshot's copy of the array, and the
    # restart's batches missed what it pushed: refused by the witness, 3 of 3, at the second or
    # the third iteration after the snapshot (the last it holds: a draw that missed the new rows
    # one iteration longer would have said "verified"), until such a tensor was moved onto the
    # live array (restore.kinds)
    "lazy_buffer-memory-first": ("lazy_buffer.py", ["--memory-first"], 2, "gpusnap: fast-forward "),
    "ddp_one_process-powersgd-late": ("ddp_one_process.py", ["--powersgd", "late"], 18, "gpusnap: fast-forward "),
    # a GCN's normalized sparse adjacency built in setup: the merge wrote through a storage a
    # sparse tensor has not ("Cannot access storage of SparseTensorImpl"), refused, 2 of 2, until
    # sparse tensors took the snapshot's in place
    "gcn": ("gcn.py", [], 0, "gpusnap: fast-forward "),
    # torch.ao's WeightNormSparsifier prepared after a dense epoch: its __getstate__, copied from
    # the optimizers', leaves out `enable_mask_update` and the model, and its first step() after
    # the restart was refused, 2 of 3, until a sparsifier was pickled with its whole __dict__
    "ao_sparsify": ("ao_sparsify.py", [], 10, "gpusnap: fast-forward "),
    # `model.forward = types.MethodType(noisy_forward, model)` after the warm-up (--local: a
    # function main() makes), past the epoch after it: refused, 2 of 2 ("'Sequential' object has
    # no attribute 'noisy_forward'"), until such a method was kept as its function and owner
    "patched_forward": ("patched_forward.py", [], 31, "gpusnap: fast-forward "),
    "patched_forward-local": ("patched_forward.py", ["--local"], 31, "gpusnap: fast-forward "),
    # everything printed goes to a log file too, through a Tee object put in place of sys.stdout
    # at start (exact at the first try, 3 of 3)
    "tee_stdout": ("tee_stdout.py", [], 0, "gpusnap: fast-forward "),
    # the same log and writer made in setup (exact before and after), or a DictWriter made at the
    # first step (refused at its writerow before: its csv.writer was live-only)
    "csv_log": ("csv_log.py", [], 0, "gpusnap: fast-forward "),
    "csv_log-lazy_dict": ("csv_log.py", ["--lazy", "--dict"], 0, "gpusnap: fast-forward "),
    # the same memmap made before training (exact before and after: the replay's is kept)
    "memmap_preds-setup": ("memmap_preds.py", ["--setup"], 0, "gpusnap: fast-forward "),
    # each epoch's predictions a member of one zip archive opened in setup, closed at the end:
    # its directory, in the ZipFile's attributes, merged into the replay's, which writes on after
    # the run's members (exact from the start, 3 of 3)
    "zip_samples": ("zip_samples.py", [], 13, "gpusnap: fast-forward "),
    # the same with the database in write-ahead-log mode (its commits in metrics.db-wal): 3 of 6 so before
    "sqlite_metrics-wal": ("sqlite_metrics.py", ["--wal"], 13, "gpusnap: fast-forward "),
    "scratch_average-mkdtemp": ("scratch_average.py", ["--mkdtemp"], 13, "gpusnap: fast-forward "),
    "memory_buffers-best": ("memory_buffers.py", ["best"], 31, "gpusnap: fast-forward "),
    # the same, a weight constraint in the hook: refused by the witness, 3 of 3 (the parameters differ)
    "optimizer_hooks-clip": ("optimizer_hooks.py", ["--hook", "clip"], 21, "gpusnap: fast-forward "),
    # class weights an `lru_cache`'d getter made, reweighted in place each epoch: refused by the
    # witness, 2 of 2 each (made in the loop or in setup), until kept (graph.caches); the counter
    # made in setup, "verified" with other state as above
    "cached_getters-weights": ("cached_getters.py", ["weights"], 6, "gpusnap: fast-forward "),
    "cached_getters-weights_setup": ("cached_getters.py", ["weights", "--first-use", "setup"], 6, "gpusnap: fast-forward "),
    "cached_getters-counter_setup": ("cached_getters.py", ["counter", "--first-use", "setup"], 6, "gpusnap: fast-forward "),
    # the counter's getter defined inside main(): no snapshot could be taken at all ("Can't pickle
    # local object"), 4 of 4, until a cached function pickle cannot name was kept by value
    # a helper module of the script's imported inside the loop (report_utils.py keeps the epochs'
    # summaries and the best): refused, 3 of 3 ("module report_utils held state in the snapshot
    # but is not imported at the resume point"), until the restore imported it before the merge
    "late_import": ("late_import.py", [], 9, "gpusnap: fast-forward "),
    # the same, a directory for the fine-tuning phase entered at its epoch: "verified" with other
    # bytes where the snapshot lay past that epoch (1 of 3; floor 17), until kept
    "chdir_outputs-phase": ("chdir_outputs.py", ["phase"], 25, "settings the run's steps had changed"),
    "cached_getters-local": ("cached_getters.py", ["local"], 6, "gpusnap: fast-forward "),
    "cached_getters-local_setup": ("cached_getters.py", ["local", "--first-use", "setup"], 6, "gpusnap: fast-forward "),
    # an EMA kept in a dict that starts as the parameters themselves and is rebound each step: the
    # merge wrote the averages over the replay's parameters (refused, 4 of 4: they no longer
    # required grad), until one live tensor stood for one of the run's
    "ema_alias": ("ema_alias.py", []),
    # past a phase change (20 steps) that replaced the head, the old one's weight staying in the
    # optimizer (refused, 1 of 3, both its weights written into the replay's head), tied the
    # output weight to the embedding's (refused, "tying differs", 2 of 3), made a new optimizer,
    # or registered a buffer (exact at the first try)
    "swap_head-replace": ("swap_head.py", ["replace"], 21, "gpusnap: fast-forward "),
    "swap_head-tie": ("swap_head.py", ["tie"], 21, "gpusnap: fast-forward "),
    "swap_head-new_optimizer": ("swap_head.py", ["new_optimizer"], 21, "gpusnap: fast-forward "),
    "swap_head-buffer": ("swap_head.py", ["buffer"], 21, "gpusnap: fast-forward "),
    # past the first epoch: a dataset whose pseudo-labels each epoch's end rewrites, loaded in the
    # main process after the merge (hard_mining's loop shape; with workers: test_e2e_refusals.py)
    "self_training": ("self_training.py", [], 12, "gpusnap: fast-forward "),
    # a process group of one made by the script itself (no torchrun), DDP and a DistributedSampler
    "ddp_one_process": ("ddp_one_process.py", []),
    # validation every few steps over a shuffled loader: imagenet_style's and furniture's draws, between steps
    "periodic_eval": ("periodic_eval.py", []),
    # a replay buffer written in place and a target network by _foreach_lerp_ (furniture's EMA is the same shape)
    "dqn_replay": ("dqn_replay.py", []),
    # `for batch in tqdm(loader)`: tests/e2e/test_e2e_fastforward.py restarts it, and three other wraps
    "tqdm_loop-for": ("tqdm_loop.py", ["--variant", "for"]),
    # a collate function that masks tokens at random, in the main process: skipped by sampler, the
    # merge puts the generator where the original's fetches had left it (tests/e2e/test_e2e_witness.py
    # restarts this program to the same bytes three times)
    "collate_draws": ("collate_draws.py", ["--epochs", "5"], 0, "by batch sampler"),
    "imagenet_style": ("imagenet_style.py", []),
    "vae": ("vae.py", []),
    "next_batch-fresh": ("next_batch.py", ["--variant", "fresh"]),
    "next_batch-reiter": ("next_batch.py", ["--variant", "reiter"], 12, "made the DataLoader iterator at frame[1].locals.train_iter again"),
    "reinforce": ("reinforce.py", []),
    "semi_supervised": ("semi_supervised.py", []),
    "char_rnn": ("char_rnn.py", []),
    "stream_workers": ("stream_workers.py", []),
    "collate_draws-workers": ("collate_draws.py", ["--workers", "2"], 0, "by consuming"),
    "augment_rng-persistent": ("augment_rng.py", ["--persistent"], 12, "persistent workers' generators put back"),
    # activation checkpointing with dropout, bf16 autocast, accumulation, an AveragedModel EMA
    "ema_checkpointed": ("ema_checkpointed.py", ["--epochs", "3"]),
    "nanogpt_style": ("nanogpt_style.py", []),
    "ppo": ("ppo.py", []),
    "wgan_gp": ("wgan_gp.py", []),
    # state in a helper module of the script's folder (a global step bumped through `global`)
    "module_helpers": ("module_helpers.py", []),
    # a DataLoader made each epoch over a growing Subset, a dropout rate raised mid-run
    "curriculum_subsets": ("curriculum_subsets.py", []),
    # a backbone unfrozen at an epoch, a layer frozen for the last one: past both (refused by its
    # witness while a merge left the replay's requires_grad; tests/graph/test_graph.py checks it in CI)
    "finetune_unfreeze": ("finetune_unfreeze.py", ["--epochs", "5"], 25, "gpusnap: fast-forward "),
    # Out of the default run for CI's time (2026-11-30); where the default run covers each shape:
    # (a CNN under StepLR over a shuffled DataLoader: word_lm, furniture, dcgan)
    "mnist_cnn": ("mnist_cnn.py", []),
    # (a progress bar updated by hand: test_e2e_fastforward.py's tqdm wrappers and its bar in a local)
    "tqdm_loop-pbar": ("tqdm_loop.py", ["--variant", "pbar"]),
    # (SWA and module hooks: furniture's EMA, ema_checkpointed (MORE) and tensor_kinds' parametrizations)
    "swa_hooks": ("swa_hooks.py", []),
    # (a home-made trainer class with callbacks: test_e2e_restart.py's trainer-fit (MORE too) and class_state)
    "config_trainer": ("config_trainer.py", []),
    # (an IterableDataset streaming lines: shard_pipeline, epoch_stream)
    "line_stream": ("line_stream.py", []),
    # (a batch sampler of its own: kfold_cv's sampler, hard_mining)
    "bucketed_batches": ("bucketed_batches.py", []),
    # past the first epoch: persistent workers hold the first epoch's copy of a dataset each epoch
    # relabels (as the replay's fresh ones do: not refused, unlike new workers each epoch)
    # (its refusal with new workers each epoch: test_e2e_refusals.py)
    "self_training-persistent": ("self_training.py", ["--workers", "2", "--persistent"], 12, "gpusnap: fast-forward "),
    # past the first pass: replay runs the program's cycle() generator again to its place
    # (covered by cycle_unlabeled and test_e2e_fastforward.py's generators advanced by hand)
    "next_batch-cycle": ("next_batch.py", ["--variant", "cycle"], 12, "ran the generator at frame[1].locals.train_iter to item"),
    # workers draw a random flip per sample: fast-forward must take the skipped batches
    # (covered by augment_rng-spawn and shard_pipeline)
    "imagenet_style-workers": ("imagenet_style.py", ["--workers", "2"], 0, "by consuming"),
    # workers draw from a generator the dataset holds: the same, though no global state moves
    # (covered by augment_rng-spawn, the same program with spawned workers)
    "augment_rng": ("augment_rng.py", [], 0, "by consuming"),
    # the same in 2 persistent workers, past the first epoch: the replay's fresh workers are given
    # the generators the original's started the epoch with (covered by test_e2e_frameworks.py's
    # Lightning datamodule-persistent-workers)
    "collate_draws-persistent": ("collate_draws.py", ["--workers", "2", "--persistent", "--epochs", "5"], 10,
                                 "persistent workers' generators put back"),
    # one train() called twice, pretraining then fine-tuning, past the first call's 24 steps
    # (a finished phase passed over: covered by distill and epoch_stream)
    "pretrain_finetune": ("pretrain_finetune.py", [], 26, "gpusnap: passed over "),
    # the teacher's last weights (no best kept: test_e2e_refusals.py's noisy_student), then a
    # student over pseudo-labels that 2 persistent workers load, past the teacher's 18 steps: the
    # replay labels with its own, untrained teacher, and the workers, started after the merge
    # (the loader is positioned by its batch sampler), load the run's labels
    # each epoch seeded from its number, shards in an order `random` draws and rows in one NumPy
    # draws, early stopping from `best = float("inf")` (the epoch loop's recorded locals: a snapshot
    # in the first epoch failed; test_fastforward.py's infinite locals test, in the default run)
    "reseed_epochs": ("reseed_epochs.py", []),
    # (an iterator class of the script's own: stream_workers, shard_pipeline; hard examples kept
    # from the last batch: dqn_replay's buffer)
    "custom_stream": ("custom_stream.py", []),
    # fake-quantize modules resize their scale buffers at the first forward, which the replay
    # skips: refused as a shape mismatch, 3 of 3, until parameters and buffers took the
    # snapshot's shape in place (lazy_modules, in the default run, is the same mechanism)
    "qat_observers": ("qat_observers.py", []),
    # (torch's schedulers chained, one holding a weak method of itself: furniture's and
    # word_lm's schedulers; pruning: tensor_kinds, here applied and removed mid-run)
    "cyclic_momentum": ("cyclic_momentum.py", []),
    "prune_midrun": ("prune_midrun.py", []),
    # best_state_alias with the best starting as a deep copy: the merge copied into it (its shape
    # is the default run's; the join is the same)
    "best_state_alias-start-copied": ("best_state_alias.py", ["--start-copied"], 51, "gpusnap: merging "),
    "noisy_student-last-workers": ("noisy_student.py", ["--last", "--workers", "2"], 20, "gpusnap: passed over "),
    # one Adam per parameter, stepped inside backward by a hook: six optimizer steps an iteration
    # (its restart was refused by the witness's count of steps, 2 of 3, until it counted per iteration)
    "optim_in_backward": ("optim_in_backward.py", []),
    # (blocks joining a ModuleList and the optimizer mid-run: lazy_modules, finetune_unfreeze)
    "grow_depth": ("grow_depth.py", []),
    # (meta-parameters in a plain dict, functional inner loops: dp_sgd's torch.func)
    "maml_sine": ("maml_sine.py", []),
    # (a heap of deep-copied best states, a deque, lru_cache, ReduceLROnPlateau: best_state_alias)
    "topk_soup": ("topk_soup.py", []),
    # past the switch to the hard loader: the epoch loop's scalar locals give the replay's prefix
    # the run's accuracy, and it chooses as the run did
    "curriculum_switch": ("curriculum_switch.py", [], 13, "gpusnap: fast-forward "),
    # rotating its own checkpoints with glob and os.remove, a metrics CSV reopened each step
    # (files_loop and resumes_itself cover the file journal)
    "rotating_checkpoints": ("rotating_checkpoints.py", []),
    # float16 autocast on the CPU, a GradScaler that skips overflowing steps (tensor_kinds' scaler never skips)
    "amp_skips": ("amp_skips.py", []),
    # one iterator per task made in setup, advanced by hand for a task drawn each step, and made
    # again when it runs out, past the first remakes: refused, 3 of 3, until the states of each
    # iterator's first index were kept
    "multitask_iters": ("multitask_iters.py", ["--steps", "70"], 30, "gpusnap: fast-forward "),
    # past the first epoch: a bucketing batch sampler that shuffles with a random.Random it owns
    # (refused, 2 of 3, until the note kept its state with the torch generators')
    "sampler_own_random": ("sampler_own_random.py", [], 13, "gpusnap: fast-forward "),
    # an endless generator of sentences advanced by hand (refused, 3 of 3: "it stood in a `while`
    # loop", until restart ran it to its place), a vocabulary and an embedding that grow, and an
    # optimizer made again at each growth
    "growing_vocab": ("growing_vocab.py", [], 9, "ran the generator at frame[1].locals.stream to its saved place"),
    # a frozen dataclass of dicts and a NamedTuple made anew each step from setup's `params`: the
    # replay's `state.params` is `params`, the run's is not (refused, 3 of 3, until the merge gave
    # each of the run's two dicts its own object)
    "functional_state": ("functional_state.py", [], 0, "gpusnap: merging "),
    # a DataLoader seen through map, filter, itertools.chain, a generator expression or
    # zip_longest (consumed item by item to its place), and a `for ... else` (all exact at the first try)
    "iter_builtins-map": ("iter_builtins.py", ["map"], 13, "gpusnap: fast-forward "),
    "iter_builtins-filter": ("iter_builtins.py", ["filter"], 13, "gpusnap: fast-forward "),
    "iter_builtins-chain": ("iter_builtins.py", ["chain"], 18, "gpusnap: fast-forward "),
    "iter_builtins-genexpr": ("iter_builtins.py", ["genexpr"], 13, "gpusnap: fast-forward "),
    "iter_builtins-zip_longest": ("iter_builtins.py", ["zip_longest"], 13, "gpusnap: fast-forward "),
    "iter_builtins-for_else": ("iter_builtins.py", ["for_else"], 13, "gpusnap: fast-forward "),
    # (exact at the first try:) Lookahead as a plain class whose slow weights are keyed by the
    # parameters; MoCo's momentum encoder and queue buffers, in pretraining and in the linear probe
    # after it; accumulation by a token budget; a grid search with a model per setting; evolution
    # strategies (vector_to_parameters, no optimizer); shards memory-mapped by torch.load(mmap=True)
    "lookahead": ("lookahead.py", [], 16, "gpusnap: fast-forward "),
    "moco_queue": ("moco_queue.py", []),
    "moco_queue-probe": ("moco_queue.py", [], 19, "gpusnap: "),
    "token_budget": ("token_budget.py", [], 21, "gpusnap: fast-forward "),
    "hparam_sweep": ("hparam_sweep.py", [], 17, "gpusnap: "),
    "evolution_strategies": ("evolution_strategies.py", []),
    "mmap_shards": ("mmap_shards.py", [], 21, "gpusnap: fast-forward "),
    # progressive growing by recursion: a snapshot in a deeper level stands in several frames of
    # one function, the shallower levels' loops passed over (exact at the first try)
    "recursive_growth": ("recursive_growth.py", [], 17, "gpusnap: "),
    # evaluation on a pool's thread, its (step, future) pairs gathered at each epoch's end: refused,
    # 3 of 3 (the futures inside tuples kept their condition's placeholder), until a tuple made
    # after setup was built anew; then a restart's first submit waited for ever (the merged pool
    # started no thread) until executors were live-only. A snapshot waits for running futures.
    "async_eval": ("async_eval.py", [], 17, "gpusnap: fast-forward "),
    # a head, its optimizer and its StepLR made at a phase change (None before), past it: the
    # scheduler's wrapper of the optimizer's step came back as a placeholder, and the restart's
    # first step was refused, until the snapshot left that wrapper out
    "head_phase": ("head_phase.py", [], 31, "gpusnap: fast-forward "),
    # each epoch's re-warm inside a `with` that puts state back at exit, anywhere past the first
    # epoch (test_a_with_that_puts_state_back_at_its_exit_... snapshots inside the re-warm, in CI)
    "context_phases-lr": ("context_phases.py", ["lr"], 19, "gpusnap: fast-forward "),
    "context_phases-frozen": ("context_phases.py", ["frozen"], 19, "gpusnap: fast-forward "),
    "context_phases-fork_rng": ("context_phases.py", ["fork_rng"], 19, "gpusnap: fast-forward "),
    # past a phase change that made a view of a slice of the head's rows (a torch view): exact at
    # the first try, 3 of 3
    "late_hooks-slice": ("late_hooks.py", ["slice"], 25, "gpusnap: fast-forward "),
    # the Adam phase's LambdaLR, past the epoch that made it (phase_schedules, default set): its
    # lambda over `decay`, a local of main(): refused 2 of 3 before functions were made again
    "phase_schedules-adam": ("phase_schedules.py", [], 45, "gpusnap: fast-forward "),
    # the forward hook of late_hooks-forward_hook-dead_units (a lambda over `scale`, a local of
    # main() the loop rebinds each step), from an epoch after the one that registered it:
    # refused, 3 of 3 ("the snapshot's builtins.function is not captured (live-only), and the
    # replayed program has nothing at this place"), until the run's function was made again from
    # its code over main()'s own cell (restore.functions)
    "late_hooks-forward_hook": ("late_hooks.py", ["forward_hook"], 37, "gpusnap: fast-forward "),
    # gradient clamps registered on every parameter at a phase change (`p.register_hook(lambda g:
    # g.clamp(...))`), from a later epoch: the witness refused, naming nothing (2 of 3), before
    # hooks were counted; then the merge refused, naming the parameter (3 of 3), until a tensor's
    # hooks were kept and their functions made again
    "late_hooks-grad_hook": ("late_hooks.py", ["grad_hook"], 37, "gpusnap: fast-forward "),
    # forward hooks on every Linear made in a comprehension at a phase change, the module's name a
    # default argument, writing into main()'s dict, removed by their handles two epochs later
    # (act_capture), and a logging filter lambda added to a FileHandler at step 20 (log_filter,
    # whose final state holds its log's lines): refused, 1 of 2 and 2 of 2 on the code before
    # functions were made again
    "act_capture": ("act_capture.py", [], 21, "gpusnap: fast-forward "),
    "log_filter": ("log_filter.py", [], 21, "gpusnap: "),
    # step_factory's closure from a factory (over the model, the optimizer, a scale and a count
    # it rebinds): refused, 2 of 2, before functions were made again
    "step_factory-closure": ("step_factory.py", ["--style", "closure"], 16, "gpusnap: fast-forward "),
    # late_closures' other functions made at its phase change (a hook a helper registered, over
    # main()'s list; a LambdaLR's lambda over train()'s `warm`; a partial over a local function):
    # refused, 2 of 2 each, before functions were made again
    "late_closures-probe": ("late_closures.py", ["probe"], 22, "gpusnap: fast-forward "),
    "late_closures-nested": ("late_closures.py", ["nested"], 22, "gpusnap: fast-forward "),
    "late_closures-partial": ("late_closures.py", ["partial"], 22, "gpusnap: fast-forward "),
    # bookkeeping written thread-safe in a one-thread loop: a queue.Queue of hard batches, a meter
    # guarded by a threading.Lock, itertools.count, iter([...]) advanced at each epoch: exact at
    # the first try, 3 of 3
    "queue_meters": ("queue_meters.py", []),
    # a plain loop over a Hugging Face `datasets` stream (an IterableDataset of shards, a shuffle
    # buffer, set_epoch each epoch) batched by a DataLoader: consumed, exact at the first try, 3 of 3
    "hf_datasets_stream": ("hf_datasets_stream.py", [], 0, "by consuming"),
    # the transfer-learning tutorial's train_model: `for phase in ['train', 'val']` around one inner
    # loop over dataloaders[phase] under `with torch.set_grad_enabled(phase == 'train')`, the best
    # weights deep-copied and loaded back at the end: exact at the first try, 6 of 6
    "phase_dict": ("phase_dict.py", []),
    # SWA switched on at an epoch (an AveragedModel and SWALR made then, None before), past it:
    # exact at the first try, 3 of 3
    "swa_late": ("swa_late.py", [], 17, "gpusnap: fast-forward "),
    # an environment variable the script sets, or the default dtype it raises, at a phase change,
    # past it (18 steps): refused where the snapshot lay past that epoch (1 of 2 each), until kept
    "global_modes-environ": ("global_modes.py", ["environ"], 19, "gpusnap: fast-forward "),
    "global_modes-default_dtype": ("global_modes.py", ["default_dtype"], 19, "gpusnap: fast-forward "),
    # per-parameter settings keyed by the parameters, made at a phase change (past it): in a dict
    # or a set of the parameters, exact at the first try; by `id(p)` (a dict of names, made then
    # or in setup, and a set of ids) or by a layer's `id(m)`, refused 3 of 3 each ("the
    # parameters differ") until the ints the run took as ids of its tensors and modules became
    # the ids of the live ones (test_graph.py::test_ints_a_program_took_as_ids_..., in the default run)
    "param_keyed-dict": ("param_keyed.py", ["dict"], 25, "gpusnap: fast-forward "),
    "param_keyed-set": ("param_keyed.py", ["set"], 25, "gpusnap: fast-forward "),
    "param_keyed-ids": ("param_keyed.py", ["ids"], 25, "gpusnap: fast-forward "),
    "param_keyed-ids_setup": ("param_keyed.py", ["ids-setup"], 25, "gpusnap: fast-forward "),
    "param_keyed-id_set": ("param_keyed.py", ["id-set"], 25, "gpusnap: fast-forward "),
    "param_keyed-module_ids": ("param_keyed.py", ["module-ids"], 25, "gpusnap: fast-forward "),
    # From the default run, for CI's time (its 12 minutes): programs whose fault, when they had
    # one, was a refusal (a regression there fails safe), or whose shape a default test covers;
    # the full set runs them before each change lands.
    "scripted": ("scripted.py", []),
    # the same with the profiler started at step 12, past it: the replay's profiler never
    # started, the run's recorded on its schedule (frameworks/profiler.py starts its session)
    "scripted-profile_from": ("scripted.py", ["--profile-from", "12"], 14, "gpusnap: fast-forward "),
    # Training phases in turn, from a snapshot in the second: the replay runs the first phase's
    # loop zero times (it once stepped there, and was refused). A teacher's loop, then a
    # student's, in two functions (past the teacher's 30 steps), ...
    "distill": ("distill.py", [], 31, "gpusnap: passed over "),
    # torch.compile builds C++ kernels: ~5 s warm, ~20 s cold, per run (the most costly program)
    "compiled": ("compiled.py", []),
    "dcgan": ("dcgan.py", []),
    "lbfgs_series": ("lbfgs_series.py", []),
    "furniture": ("furniture.py", []),
    "closures": ("closures.py", []),
    # past the unlabeled loader's first pass (4 batches): cycle() gives its saved batches again
    # (5 epochs: in 3, a loaded machine saw the snapshot commit only at the program's last step)
    "cycle_unlabeled": ("cycle_unlabeled.py", ["--epochs", "5"], 6, "gpusnap: fast-forward "),
    # past the first epoch (12 batches): each epoch's WeightedRandomSampler weighs the losses of
    # epochs the replay skips; its order is drawn again once the merge has put its weights back
    "hard_mining": ("hard_mining.py", [], 12, "hard_mining.py:50 (in main) again from its merged sampler"),
    # past the first epoch (12 batches): the iterator was made again in an iteration replay skips,
    # from a sampler whose order a generator of the script's own draws
    "next_batch-reiter-own-generator": ("next_batch.py", ["--variant", "reiter", "--own-generator"], 12,
                                        "made the DataLoader iterator at frame[1].locals.train_iter again"),
    # spawned workers run nothing of gpusnap's: their loader counts as drawing
    "augment_rng-spawn": ("augment_rng.py", ["--context", "spawn", "--epochs", "1"], 0, "by consuming"),
    # past the first epoch (8 batches): each fold's SubsetRandomSampler draws from a generator of
    # its own, whose state at the epoch's start the loop's note keeps
    "kfold_cv": ("kfold_cv.py", [], 8, "by batch sampler"),
    # a chain of generators consumed through islice: the ones inside it move with it
    "shard_pipeline": ("shard_pipeline.py", [], 0, "by consuming"),
    # ...and a learning-rate range test on a deepcopy, then `while True` over epochs it counts
    # itself (`data.set_epoch(epoch)`: the replay's prefix reads the epoch its iteration started with).
    # The range test's 4 steps count in a snapshot's iteration
    "epoch_stream": ("epoch_stream.py", [], 0, "gpusnap: passed over ", 4),
    # Lazy modules with the optimizer made before the first forward: the run materialized the
    # parameters (and made each module its final class) in a step the replay skips; refused,
    # 3 of 3, until the merge materialized them in place
    "lazy_modules": ("lazy_modules.py", []),
    # Gradient accumulation by summing the losses (`window = window + loss / 4`, one backward per
    # 4 iterations): a snapshot inside the window lost the graph of its losses, and the witness
    # refused the restart (the full set, seed 1: snapshot at the 29th iteration). A snapshot now
    # waits for the window's step
    "summed_losses": ("summed_losses.py", []),
    # each round's clients drawn with NumPy, each trained over its own loader: the replay's round
    # prefix draws other clients, so its loop took another loader (refused by the witness, 2 of 6,
    # until the iterator was made again from the run's after the merge; seed 1 is one of them)
    "fedavg": ("fedavg.py", []),
    # SAM: an Optimizer subclass wrapping a base optimizer, whose momentum torch's __getstate__ left
    # out of the snapshot (refused by its witness, 3 of 3, until an optimizer's own attributes were kept)
    "sam_optimizer": ("sam_optimizer.py", []),
    # one root SeedSequence spawning an epoch's Philox stream, SFC64 and MT19937 generators beside
    # a torch.Generator: their states are made in the writer (pickled inline since a snapshot
    # failed where the writer's heap grew past its map, tests/graph/test_graph.py)
    "seed_tree": ("seed_tree.py", []),
    # Forward-Forward: layers in a plain list, each an nn.Linear with its own Adam and a
    # `train(x_pos, x_neg)` loop shadowing nn.Module.train, trained one after another
    "forward_forward": ("forward_forward.py", []),
    # pairs a Dataset draws with `random` in __getitem__, an epoch log appended to, the best
    # weights saved with torch.save
    "siamese_pairs": ("siamese_pairs.py", []),
    # a metrics log written with os.write through a descriptor that `os.open` made in setup with
    # O_TRUNC, which the replay opens (and truncates) again
    "raw_fd_log-trunc": ("raw_fd_log.py", ["--trunc"]),
    # each epoch's augmentation mapped over a multiprocessing.Pool, or a ProcessPoolExecutor, made
    # in a `with` per epoch: its processes have ended by the steps (a pool made at start blocks
    # every snapshot, tests/e2e/test_e2e_witness.py); exact at the first try, 2 of 2 each
    # pandas' display precision lowered once warm-up is over, each epoch's DataFrame of metrics
    # logged: "verified" with the default precision in the log's later lines, 2 of 2, until the
    # settings kept pandas' options; without it, the program's own warnings captured into the log
    # (exact at the first try, 2 of 2)
    "warn_log-pandas": ("warn_log.py", ["--pandas"], 31, "settings the run's steps had changed"),
    "warn_log": ("warn_log.py", [], 31, "gpusnap: fast-forward "),
    # a custom Sampler that counts its own epochs in __iter__ (the permutation seeded by the count):
    # the merged sampler had counted one more than when the run's loop started, its order was not
    # drawn again, and the witness refused, 1 of 3 (past the first epoch, with batches left in it),
    # until the order was drawn with the count the loop's note kept; exact 5 of 5 then
    "counting_sampler": ("counting_sampler.py", [], 12, "drew the order of the DataLoader of loop"),
    # detectron2's iteration-based shape: an infinite sampler over its own seeded generator, the
    # loader's iterator taken in setup and advanced by next() in `for iteration in range(...)`
    # (through its index sampler, or by taking the batches again; with 2 workers too);
    # torch.compile switched on once warm-up is over, of the model or of the train step: exact at
    # the first try, 2 of 2 each
    "infinite_sampler": ("infinite_sampler.py", [], 0, "advanced the DataLoader iterator at frame[1].locals.data_loader_iter by"),
    "infinite_sampler-workers": ("infinite_sampler.py", ["--workers", "2"], 0, "by taking batches"),
    "compile_late": ("compile_late.py", ["--backend", "aot_eager"], 20, "gpusnap: fast-forward "),
    "compile_late-step": ("compile_late.py", ["--backend", "aot_eager", "--step"], 20, "gpusnap: fast-forward "),
    # a run history in a shelve database (a list read, extended and written back each step); an
    # epoch summary appended with pandas' to_csv(mode="a"); torchmetrics' MetricCollection, a
    # MeanMetric and a MaxMetric across epochs; the popular EarlyStopping class that torch.save's
    # the whole model when it improves, steps inside try/except/finally: exact at the first try,
    # 2 of 2 each
    "shelve_history": ("shelve_history.py", []),
    "pandas_log": ("pandas_log.py", []),
    "metrics_collection": ("metrics_collection.py", []),
    "early_stop": ("early_stop.py", []),
    "late_knobs-numpy_print": ("late_knobs.py", ["numpy-print"], 31, "settings the run's steps had changed"),
    "late_knobs-disable": ("late_knobs.py", ["disable"], 31, "settings the run's steps had changed"),
    # the logger's own level set to WARNING at the same place: exact at the first try (loggers are kept)
    "late_knobs-level": ("late_knobs.py", ["level"], 31, "gpusnap: fast-forward "),
    "pool_augment-pool": ("pool_augment.py", ["--per-epoch", "pool"]),
    "pool_augment-executor": ("pool_augment.py", ["--per-epoch", "executor"]),
    # a CNN and its inputs switched to channels_last at a phase change (the weights' strides in
    # the final state); a RotatingFileHandler rolling the log over every 1.5 kB; a dataset opening
    # its records file lazily, whose __getstate__ drops the handle; a rollback to the state dicts
    # deep-copied every 6 steps when the loss spikes: exact at the first try, 2 of 2 each
    "channels_late": ("channels_late.py", []),
    "rotating_log": ("rotating_log.py", []),
    "lazy_handle": ("lazy_handle.py", []),
    "rollback_spike": ("rollback_spike.py", []),
    # the same for a model traced with torch.fx at epoch 2 and its graph rewritten (each
    # GraphModule has a class of its own): refused, 2 of 2; traced in setup and rewritten at
    # epoch 2, the replay's module kept its setup's code: refused by the witness, 2 of 2
    "parametrize_late": ("parametrize_late.py", [], 18, "gpusnap: fast-forward "),
    "fx_late": ("fx_late.py", [], 22, "gpusnap: fast-forward "),
    "fx_late-setup": ("fx_late.py", ["--setup"], 22, "gpusnap: fast-forward "),
    # an ensemble trained at once with torch.func (stack_module_state, functional_call under
    # vmap, one Adam over the stacked tensors); PyTorch's Transformer language-model tutorial
    # (positional encoding buffer, causal mask, bptt windows, a deep copy of the best model):
    # exact at the first try, 3 of 3 each
    # model classes main() defines, a second head of them (with a __slots__ config of another)
    # appended at epoch 2 and its parameters added to the optimizer as a group: the head was
    # live-only with nothing of the replay's at its place, and once made again, the optimizer's
    # state keyed by its parameters was refused (no counterpart): refused, 1 of 2, until both
    "local_head": ("local_head.py", [], 26, "gpusnap: fast-forward "),
    # dicts keyed by the members of an Enum main() defines: the keys stayed the snapshot's
    # placeholders, and the program's first lookup after the merge raised KeyError (refused, 2 of
    # 2), until such keys were the replay's members
    "local_enum_keys": ("local_enum_keys.py", [], 22, "gpusnap: fast-forward "),
    # a tracker of a class main() defines put in a module global at epoch 1, holding another of
    # its classes: made at finish (globals merge before the locals), the class it held stayed the
    # snapshot's placeholder, and the next step called it (refused, 1 of 2)
    "local_global": ("local_global.py", [], 14, "gpusnap: fast-forward "),
    # a config dataclass main() defines, the first kept as `initial`, the live one replaced by
    # dataclasses.replace at epoch 2: the replay holds one object at both names, and both of the
    # run's merged into it, the restarted run training at the initial learning rate (refused by
    # the witness past epoch 2, 2 of 2; a value only the log read would have been out of its
    # sight), until the second was made of its own
    "local_config_replace": ("local_config_replace.py", [], 38, "gpusnap: fast-forward "),
    "ensemble_vmap": ("ensemble_vmap.py", []),
    "transformer_lm": ("transformer_lm.py", []),
    # Out of the default run for CI's time (2026-12-03): silent wrong restores, each fixed with a
    # unit test of its mechanism in tests/graph, tests/restore or tests/files (in CI), whose kind a
    # program of the default run keeps end to end (views: lazy_buffer; settings: chdir_outputs;
    # hooks: late_hooks-remove_hook, global_hooks; functions made again: step_factory-func; files:
    # sqlite_metrics, buffered_log, late_logger; caches: cached_getters; aliasing:
    # best_state_alias-as-tuple; state on classes: class_state).
    # closures bound to module globals: class_state's kind (tests/graph/test_statics.py)
    "module_closures": ("module_closures.py", []),
    # `best_state = model.state_dict()` without a copy, at an epoch's end, past the best epoch
    # (51 steps): the snapshot's state dict shares the parameters' memory. Adopted apart from
    # them, it missed the later steps, and the restart ended with stale weights, verified (3 of
    # 3; with the best starting as a deep copy, 3 of 3 more). The merge joins them again, and
    # the witness compares which tensors share memory
    "best_state_alias": ("best_state_alias.py", [], 51, "gpusnap: merging "),
    # A decay written through a NumPy view of a weight made at a phase change, past it (24 steps):
    # the merge's array viewed a copy, the decay reached no weight, and the restart said "verified"
    # with other bytes (1 of 3), until the array was built again over the live weight and the
    # witness digested the parameters at its last boundary too
    "late_hooks-numpy": ("late_hooks.py", ["numpy"], 25, "gpusnap: fast-forward "),
    # a view of a ring buffer of losses (`recent = ring[8:]`) made when the warm-up ends, past it:
    # the merge adopted the view's own bytes, which the restart's losses never reached, and the
    # restart said "verified" with other bytes (1 of 3; 2 refused), until the view came back over
    # the live ring
    "ring_stats": ("ring_stats.py", [], 21, "gpusnap: fast-forward "),
    # torch's intra-op threads doubled at a phase change, past it (the program reports them): the
    # replay kept the setup's, the witness could not compare the parameters (other threads), and
    # the restart said "verified" with other final state (2 of 3), until the settings the
    # program changed process-wide were kept (graph.settings)
    "global_modes-threads": ("global_modes.py", ["threads"], 19, "settings the run's steps had changed"),
    # torch.set_printoptions(precision=3) once warm-up is over (epoch 2), the log's lines printing
    # tensors, from a later epoch: the replay printed with the setup's options, and the restart
    # said "verified" with other lines in the log, 1 of 1, as with NumPy's print options and
    # logging.disable(INFO) (the full set), until the settings kept them too
    "late_knobs-torch_print": ("late_knobs.py", ["torch-print"], 31, "settings the run's steps had changed"),
    # an EMA that an optimizer step hook registered after warmup updates: "verified" with other
    # bytes, 3 of 3, until the optimizer's hooks were kept (frameworks.optimizers)
    "optimizer_hooks": ("optimizer_hooks.py", [], 21, "gpusnap: fast-forward "),
    # a forward hook registered at a phase change, after evaluations that registered and removed
    # hooks of their own: refused, 3 of 3 (the replay's hook had another id); with the hook found
    # by its code alone, "verified" with other bytes, 3 of 3 (the next evaluation's hook took the
    # run's id, and its remove() the phase's hook), until torch's counter of ids was kept
    "late_hooks-forward_hook-dead_units": ("late_hooks.py", ["forward_hook", "--dead-units"], 25, "gpusnap: fast-forward "),
    # a defaultdict(lambda: 0) made at a phase change inside a nested train() that binds it to
    # main()'s local through `nonlocal`, from a later epoch: refused, 2 of 2 ("cannot be rebuilt
    # here ... the replayed program has nothing at this place"), until it was built again over its
    # function made again (restore.functions); the full set has the hook, LambdaLR and partial
    "late_closures-counts": ("late_closures.py", ["counts"], 22, "gpusnap: fast-forward "),
    # an AveragedModel made at a phase change with torch's EMA function (a closure over the decay
    # inside torch.no_grad()'s wrapper, both made in that step), from a later epoch: refused, 2
    # of 2 (the program called the wrapper's placeholder), until functions were made again, the
    # wrapper from the module of its code, not the one functools.wraps names
    "ema_late": ("ema_late.py", [], 18, "gpusnap: fast-forward "),
    # A LambdaLR made anew at a phase change in the epoch loop, its lambda over a local of main()
    # (`start`), from a later epoch: the replay holds setup's LambdaLR and lambda there. The merge
    # once put the snapshot's cells into setup's lambda, or kept setup's code; then it refused by
    # the lambdas' lines (3 of 3), until the run's function was made again from its code
    "phase_schedules": ("phase_schedules.py", ["--epochs", "4"], 21, "gpusnap: fast-forward "),
    # an epoch report kept in an io.StringIO through a csv.writer, written out at the end: files
    # are live-only, and the restart said "verified" with setup's header and the later epochs'
    # rows only, 3 of 3, until in-memory files were kept
    "memory_buffers-report": ("memory_buffers.py", ["report"], 12, "gpusnap: fast-forward "),
    # the same for every optimizer (register_optimizer_step_post_hook), counting steps: "verified"
    # with another count, 3 of 3, until torch.optim.optimizer's hooks were kept with them
    "global_hooks-optimizer": ("global_hooks.py", ["--optimizer"], 21, "gpusnap: fast-forward "),
    # epochs' weights and a loss log kept in a tempfile.TemporaryDirectory, averaged and read back
    # at the end: tempfile's files were left alone, and the log appended after the snapshot got
    # those lines again, "verified", 5 of 6 (with --mkdtemp too), until they were kept
    "scratch_average": ("scratch_average.py", [], 13, "gpusnap: fast-forward "),
    # activation statistics a forward hook keeps per module in a weakref.WeakKeyDictionary made in
    # setup: its weak references were live-only and the replay's mapping kept setup's entries,
    # "verified", 3 of 3, until weak mappings were kept by their items
    "weak_stats": ("weak_stats.py", [], 0, "gpusnap: fast-forward "),
    # each epoch's weights handed to an evaluator started with subprocess.run, which appends its
    # line to the results file it was also handed: the child's writes were unseen, and the line
    # of an epoch after the snapshot was there twice, "verified", 1 of 3, until the paths a
    # started command names were kept (files.commands)
    "eval_subprocess": ("eval_subprocess.py", ["--epochs", "4"], 0, "gpusnap: fast-forward "),
    # a CSV file and its csv.writer made at the first step, kept in locals: the writer was
    # live-only, the replay's locals held None, and the program made both again, the log
    # truncated: "verified", the rows before the snapshot lost, 2 of 2, until such a name held a
    # placeholder (refused) and the writer was made again over its file opened again (exact)
    "csv_log-lazy": ("csv_log.py", ["--lazy"], 0, "gpusnap: fast-forward "),
    # each epoch's predictions a row of a NumPy memmap made at the first evaluation, flushed, the
    # file loaded at the end: pickled by value, the memmap was an array over no file after a
    # restart, and the rows after the snapshot never reached it, "verified", 1 of 3, until a
    # memmap was kept as its file and mapped again (graph.load.LiveMemmap)
    "memmap_preds": ("memmap_preds.py", [], 0, "gpusnap: fast-forward "),
    # a `latest` symbolic link moved to each new checkpoint, the oldest removed: the restart
    # moved the run's later link aside into DIR/after-ID/, and each restart after it was refused
    # ("... is a symbolic link"), 2 of 2, until what a restart moves aside was left out of the
    # run directory's trust check (tests/store/test_store_trust.py)
    "symlink_latest": ("symlink_latest.py", [], 5, "gpusnap: fast-forward "),
    # a tokenizers Tokenizer that adds the words it meets and truncates from epoch 2, past it:
    # refused, 4 of 4 (the replay's stood, its Rust state unmerged), until such an object took the
    # run's state through its own __setstate__
    "tokenizer_grow": ("tokenizer_grow.py", [], 17, "gpusnap: fast-forward "),
    # partials rebound at curriculum stages (an augmentation's strength, the trainer's loss),
    # past stage 2: refused, 2 of 3 (the replay's partial stood), until a partial took the run's
    # function, arguments and keywords in place
    "partial_stage": ("partial_stage.py", [], 17, "gpusnap: fast-forward "),
    # each epoch's weights appended to a zip archive, a checkpoint directory written aside and
    # renamed into place, copied per epoch with copytree, the oldest copies removed: the renamed
    # directory's files were in no snapshot's table, and a restart after the next save refused,
    # 2 of 3, until what a rename puts in place was searched as a made directory is
    "zip_archive": ("zip_archive.py", [], 7, "gpusnap: fast-forward "),
    # a baseline evaluated under torch.inference_mode() before training, kept to compare each
    # epoch's evaluation against: the merge's copy into the replay's inference tensor failed,
    # refused, 3 of 3, until it was made in that mode
    "inference_baseline": ("inference_baseline.py", [], 9, "gpusnap: fast-forward "),
    # position ids and a causal mask broadcast over the batch by expand() in setup: a copy into
    # memory the elements share refused, 2 of 2, until it went through one element of each
    # broadcast dimension
    "expanded_setup": ("expanded_setup.py", [], 0, "gpusnap: fast-forward "),
}
if os.environ.get("GPUSNAP_TEST_CORPUS") == "all":
    CORPUS.update(MORE)
# These models are small: with the cores shared by the writer (and other tests), intra-op threads
# spend more time waiting for each other than computing. Every run of a test gets the same setting.
ENV = {"OMP_NUM_THREADS": "1"}
SLOW = {**ENV, "TEST_STEP_SLEEP_S": "0.04"}


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("name", CORPUS)
def test_corpus_program_restarts_to_the_same_bytes(tmp_path, name, seed):
    if name.startswith("tqdm_loop"):
        pytest.importorskip("tqdm")
    if name.startswith("hf_datasets"):
        pytest.importorskip("datasets")
    started = time.monotonic()
    # A restart says how it brought each loop to its place; where no way is named, it must say one.
    program, args, floor, says, counted_before = (*CORPUS[name], 0, "gpusnap: fast-forward ", 0)[:5]
    rnd = random.Random(f"{name}/{seed}")
    print(f"program {name} seed {seed}")
    script = copy_programs(tmp_path) / "corpus" / program
    ref, out = tmp_path / "ref", tmp_path / "out"
    ref.mkdir()
    out.mkdir()
    plain(script, ref, *args, cwd=tmp_path, env=ENV)
    total = progress(ref)
    print(f"reference: {total} steps in {time.monotonic() - started:.1f} s")

    restarted = kill_and_restart(script, args, tmp_path, out, rnd, total, ENV, SLOW, floors=(floor,), counted_before=counted_before)
    assert says in restarted.stderr
    assert_same(load_final(ref), load_final(out))
    print(f"{name}: {time.monotonic() - started:.1f} s")


class _Earliest(random.Random):
    """Picks the first step ``interrupt`` may choose, and kills right after the witness."""

    def randint(self, a, b):
        return a


def test_a_profiler_recording_at_the_snapshot_hands_over_every_trace_after_the_restart(tmp_path):
    """scripted.py runs the torch profiler on a schedule (wait 2, warmup 1, active 2, repeat 3)
    and keeps the step of every trace its on_trace_ready is handed. Snapshotted in the last step of
    a recording (step 9), the restart said "verified" with one trace fewer (seed 6 of the test
    above; 2 of 2 here): the merge gave the replay's profiler the run's step and action, and no
    session of the replay's ran, so the cycle's end handed nothing over. The replay's session is brought to the
    run's action after the merge now (frameworks/profiler.py)."""
    script = copy_programs(tmp_path) / "corpus" / "scripted.py"
    ref, out = tmp_path / "ref", tmp_path / "out"
    ref.mkdir()
    out.mkdir()
    plain(script, ref, cwd=tmp_path, env=ENV)
    assert load_final(ref)["traces"] == [5, 10, 15]
    restarted = kill_and_restart(script, [], tmp_path, out, _Earliest(), progress(ref), ENV,
                                 {**ENV, "TEST_STEP_SLEEP_S": "0.15"}, floors=(6,))
    at = int(restarted.stderr.split("(iteration ")[1].split(")")[0])
    assert at % 5 == 4, f"the snapshot at iteration {at} came where the profiler does not end a recording (9 was asked)"
    assert_same(load_final(ref), load_final(out))


@pytest.mark.parametrize("style", ["lr", "frozen"])
def test_a_with_that_puts_state_back_at_its_exit_gets_the_run_s_state_from_the_snapshot(tmp_path, style):
    """context_phases.py re-warms each epoch inside a `with` that saved state at entry and puts it
    back at exit: the rates (a generator context manager's frame) or the first layer's
    requires_grad flags (a class's instance). Snapshotted early in the third epoch's re-warm, the
    witness's iterations all came before that exit; the replay had entered the `with` with setup's
    rate and flags, and the restart said "verified" and ended with other bytes (3 of 12 seeds)
    until the entered object was kept where the snapshot finds it (instrument.transform)."""
    script = copy_programs(tmp_path) / "corpus" / "context_phases.py"
    ref, out = tmp_path / "ref", tmp_path / "out"
    ref.mkdir()
    out.mkdir()
    plain(script, ref, style, cwd=tmp_path, env=ENV)
    # An epoch is 7 re-warming steps and 12 others: the third's re-warm is steps 39 to 45.
    restarted = kill_and_restart(script, [style], tmp_path, out, _Earliest(), progress(ref), ENV, SLOW, floors=(36,))
    snap = RunDir.open(tmp_path / "snaps").manifest()
    assert 39 <= snap["iteration"] <= 42, snap["iteration"]
    assert " verified: " in restarted.stderr, restarted.stderr
    assert_same(load_final(ref), load_final(out))


def test_a_phase_one_restart_passed_over_is_passed_over_by_the_next_one_too(tmp_path):
    """distill.py snapshotted in its student's phase, restarted (the teacher's loop passed over),
    snapshotted again further on and killed, then restarted once more: the second snapshot,
    taken by a process whose teacher's loop never ran, must name it as finished all the same."""
    rnd = random.Random("distill-twice")
    script = copy_programs(tmp_path) / "corpus" / "distill.py"
    ref, out = tmp_path / "ref", tmp_path / "out"
    ref.mkdir()
    out.mkdir()
    plain(script, ref, cwd=tmp_path, env=ENV)
    restarted = kill_and_restart(script, [], tmp_path, out, rnd, progress(ref), ENV, SLOW, floors=(31, 42))
    assert "gpusnap: passed over " in restarted.stderr
    assert_same(load_final(ref), load_final(out))


def test_a_program_that_follows_the_string_hash_restarts_to_the_same_bytes(tmp_path):
    """hashed_features.py puts each token in bucket ``hash(token) % 257`` and sums its losses in
    the order of a set of strings: Python seeds that hash at random in each process, so the
    restart, seeded otherwise than its run, was refused by its witness. Every process of a run
    directory's program now gets the same PYTHONHASHSEED (where the environment sets none), and
    the restart ends with the bytes of an uninterrupted run under that seed."""
    if "PYTHONHASHSEED" in os.environ:
        pytest.skip("PYTHONHASHSEED is set here: gpusnap leaves a seed the environment sets to it")
    rnd = random.Random("hashed_features")
    script = copy_programs(tmp_path) / "corpus" / "hashed_features.py"
    ref, out = tmp_path / "ref", tmp_path / "out"
    ref.mkdir()
    out.mkdir()
    restarted = kill_and_restart(script, ["--steps", "40"], tmp_path, out, rnd, 40, ENV, SLOW)
    assert "gpusnap: fast-forward " in restarted.stderr
    # A fresh interpreter for the reference: a forked one (``plain``) keeps its parent's seed.
    seed = string_hash_seed(RunDir.open(tmp_path / "snaps").nonce)
    reference = subprocess.run([sys.executable, script, ref, "--steps", "40"], cwd=tmp_path, capture_output=True, text=True,
                               env=_env({**ENV, "PYTHONHASHSEED": seed}, step_sleep_s="0"), timeout=240)
    assert reference.returncode == 0, reference.stderr
    assert_same(load_final(ref), load_final(out))
