"""transformers' ``Trainer``: its step loop (``_run_epoch``'s ``for update_step in range(...)``,
inside ``train`` → ``_inner_training_loop`` → the epoch loop) is in ``transformers.trainer``,
which is instrumented by default. Trainers built on it (``Seq2SeqTrainer``, TRL's trainers) reach
the same loop through ``train``. Its epoch iterator is an Accelerate ``DataLoaderShard``'s, which
the program advances by hand: ``gpusnap.frameworks.accelerate`` puts it back.

An evaluation during training (``eval_strategy``) leaves its prepared DataLoader in the callback
handler's ``eval_dataloader``, handed to callbacks as an argument of every later event; the
replay skips the iteration that evaluated, so restore keeps the replay's value there (None until
the next evaluation sets it; each evaluation sets it before its first event).

A data collator given a ``seed`` (``DataCollatorForLanguageModeling`` and its kind) draws from a
generator of its own, which it makes again whenever the process id it noted differs from its
own (a DataLoader worker's copy seeds its own). A restart is another process: after the merge,
the collators that had a generator note the restarted process's id, so that they go on drawing
from the restored one.
"""

from __future__ import annotations

import os

from gpusnap.capture.pickling import pickler
from gpusnap.frameworks import LOOP_MODULES
from gpusnap.restore import replay

# With auto_find_batch_size, Accelerate's retry loop (accelerate.utils.memory) calls the inner
# training loop: without it, no frame on the way would be instrumented, and no boundary safe.
LOOP_MODULES["transformers"] = ("transformers.trainer", "accelerate.utils.memory")
pickler.REPLAYED_ATTRS["transformers.trainer_callback.CallbackHandler"] = frozenset({"eval_dataloader"})


def _collators_in_this_process(live_objects) -> None:
    for obj in live_objects:
        if type(obj).__module__ == "transformers.data.data_collator" and getattr(obj, "_generator_pid", None) is not None:
            obj._generator_pid = os.getpid()


replay.AFTER_MERGE["giving data collators their restored generators"] = _collators_in_this_process
