"""transformers' ``Trainer``: its step loop (``_run_epoch``'s ``for update_step in range(...)``,
inside ``train`` → ``_inner_training_loop`` → the epoch loop) is in ``transformers.trainer``,
which is instrumented by default. Trainers built on it (``Seq2SeqTrainer``, TRL's trainers) reach
the same loop through ``train``. Its epoch iterator is an Accelerate ``DataLoaderShard``'s, which
the program advances by hand: ``gpusnap.frameworks.accelerate`` puts it back."""

from __future__ import annotations

from gpusnap.frameworks import LOOP_MODULES

LOOP_MODULES["transformers"] = ("transformers.trainer",)
