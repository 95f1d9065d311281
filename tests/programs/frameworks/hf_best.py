"""A transformers Trainer set up as fine-tuning guides set it up: batches grouped by length
(LengthGroupedSampler, drawn from the global generator), NEFTune noise on the embeddings (a
forward hook the Trainer adds, drawing at each step), evaluation and a checkpoint every few
steps with the best kept by eval loss (save_total_limit, load_best_model_at_end, which reads the
best checkpoint back from disk at the end), early stopping, a polynomial schedule. The final
state holds the model the Trainer loaded, its log history and best checkpoint's name.
usage: hf_best.py OUT [--epochs N]"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import torch
from common import finish, progress
from hf_custom import Sequences, collate, compute_metrics
from transformers import BertConfig, BertForSequenceClassification, EarlyStoppingCallback, Trainer, TrainerCallback, \
    TrainingArguments


class Progress(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        progress(state.global_step)


def main():
    parser = argparse.ArgumentParser(description="a Trainer that keeps its best checkpoint")
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    torch.manual_seed(0)
    config = BertConfig(vocab_size=32, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                        max_position_embeddings=32, num_labels=2, pad_token_id=0)
    training = TrainingArguments(
        output_dir=os.path.join(args.out, "trainer"),
        per_device_train_batch_size=8,
        per_device_eval_batch_size=16,
        num_train_epochs=args.epochs,
        learning_rate=2e-3,
        lr_scheduler_type="polynomial",
        warmup_steps=4,
        train_sampling_strategy="group_by_length",
        neftune_noise_alpha=5.0,
        eval_strategy="steps",
        eval_steps=8,
        save_strategy="steps",
        save_steps=8,
        save_total_limit=2,
        load_best_model_at_end=True,
        metric_for_best_model="eval_loss",
        logging_steps=4,
        report_to=[],
        use_cpu=True,
        seed=0,
        disable_tqdm=True,
    )
    trainer = Trainer(
        model=BertForSequenceClassification(config),
        args=training,
        train_dataset=Sequences(160, seed=1),
        eval_dataset=Sequences(48, seed=2),
        data_collator=collate,
        compute_metrics=compute_metrics,
        callbacks=[Progress(), EarlyStoppingCallback(early_stopping_patience=3)],
    )
    trainer.train()
    history = [{k: v for k, v in entry.items() if "runtime" not in k and "per_second" not in k}
               for entry in trainer.state.log_history]
    finish(model=trainer.model.state_dict(), history=history, best=os.path.basename(trainer.state.best_model_checkpoint),
           step=trainer.state.global_step)


if __name__ == "__main__":
    main()
