"""A transformers Trainer fed a streaming torch IterableDataset, as pretraining scripts over
unbounded data are set up: `max_steps` instead of epochs, the dataset drawing each example from
its own generator (re-seeded by the epoch the Trainer sets through set_epoch, and split between
DataLoader workers by get_worker_info), a tiny BERT for sequence classification built from its
config, a linear schedule with warmup, gradient accumulation. With --drop-tokens, a data collator
blanks a tenth of the tokens of each batch at random (the global torch generator, or the workers').
usage: hf_stream.py OUT [--steps N] [--workers N] [--drop-tokens]"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import torch
from common import finish, progress
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainerCallback, TrainingArguments


class Stream(torch.utils.data.IterableDataset):
    def __init__(self, length=12, vocab=50, per_epoch=96):
        self.length, self.vocab, self.per_epoch = length, vocab, per_epoch
        self.epoch = 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __iter__(self):
        worker = torch.utils.data.get_worker_info()
        shard, shards = (worker.id, worker.num_workers) if worker is not None else (0, 1)
        generator = torch.Generator().manual_seed(1000 + 10 * self.epoch + shard)
        for _ in range(self.per_epoch // shards):
            ids = torch.randint(1, self.vocab, (self.length,), generator=generator)
            yield {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": int(ids[:3].sum() % 2)}


def drop_tokens(examples):
    batch = torch.utils.data.default_collate(examples)
    keep = torch.rand(batch["input_ids"].shape) > 0.1
    batch["input_ids"] = batch["input_ids"] * keep
    return batch


class Progress(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        progress(state.global_step)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--drop-tokens", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                                     intermediate_size=64, max_position_embeddings=32, num_labels=2))
    training = TrainingArguments(output_dir=os.path.join(args.out, "trainer"), per_device_train_batch_size=8, max_steps=args.steps,
                                 gradient_accumulation_steps=2, warmup_steps=4, lr_scheduler_type="linear", learning_rate=5e-4,
                                 logging_steps=2, save_strategy="no", dataloader_num_workers=args.workers, report_to=[], use_cpu=True, seed=0, disable_tqdm=True)
    trainer = Trainer(model=model, args=training, train_dataset=Stream(),
                      data_collator=drop_tokens if args.drop_tokens else None, callbacks=[Progress()])
    trainer.train()
    log = [{k: v for k, v in e.items() if "runtime" not in k and "per_second" not in k} for e in trainer.state.log_history]
    finish(model=model.state_dict(), optimizer=trainer.optimizer.state_dict(), scheduler=trainer.lr_scheduler.state_dict(),
           log=log, steps=trainer.state.global_step)


if __name__ == "__main__":
    main()
