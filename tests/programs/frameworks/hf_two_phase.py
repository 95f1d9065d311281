"""Two-stage fine-tuning with the transformers Trainer, as guides for small data do: first the
classifier head alone (the encoder frozen), then the whole model at a lower rate with a new
Trainer. A tiny BERT classifier built from its config, on generated sequences.
usage: hf_two_phase.py OUT [--epochs N]"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import torch
from common import finish, progress
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainerCallback, TrainingArguments


class Sequences(torch.utils.data.Dataset):
    def __init__(self, n=160, length=12, vocab=50):
        g = torch.Generator().manual_seed(4)
        self.ids = torch.randint(1, vocab, (n, length), generator=g)
        self.labels = (self.ids[:, 0] > vocab // 2).long()

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.labels[i]}


class Progress(TrainerCallback):
    def __init__(self, offset):
        self.offset = offset

    def on_step_end(self, args, state, control, **kwargs):
        progress(self.offset + state.global_step)


def arguments(out, stage, epochs, lr):
    return TrainingArguments(output_dir=os.path.join(out, stage), per_device_train_batch_size=8, num_train_epochs=epochs,
                             learning_rate=lr, logging_steps=2, save_strategy="no", report_to=[], use_cpu=True, seed=0,
                             disable_tqdm=True, warmup_steps=4)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                                     intermediate_size=64, max_position_embeddings=16, num_labels=2))
    data = Sequences()
    for p in model.bert.parameters():
        p.requires_grad = False
    head = Trainer(model=model, args=arguments(args.out, "head", args.epochs, 5e-3), train_dataset=data, callbacks=[Progress(0)])
    head.train()
    done = head.state.global_step
    for p in model.bert.parameters():
        p.requires_grad = True
    full = Trainer(model=model, args=arguments(args.out, "full", args.epochs, 1e-3), train_dataset=data, callbacks=[Progress(done)])
    full.train()
    finish(model=model.state_dict(), optimizer=full.optimizer.state_dict(), head_log=untimed(head.state.log_history),
           full_log=untimed(full.state.log_history), steps=(done, full.state.global_step))


def untimed(history):
    return [{k: v for k, v in entry.items() if "runtime" not in k and "per_second" not in k} for entry in history]


if __name__ == "__main__":
    main()
