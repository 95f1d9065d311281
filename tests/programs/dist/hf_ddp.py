"""A transformers Trainer under torchrun on CPU (DDP over gloo): a small BERT classifier on
synthetic sentences, gradient accumulation, a linear schedule with warmup, evaluation every 6
steps, checkpoints every 6 steps (2 kept), the log history.
usage: hf_ddp.py OUT EPOCHS"""
import os
import random
import sys

import torch
from common import finish, progress
from datasets import Dataset
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import (BertConfig, BertForSequenceClassification, DataCollatorWithPadding, PreTrainedTokenizerFast,
                          Trainer, TrainerCallback, TrainingArguments)

WORDS = "good bad fine awful great poor nice grim the a movie plot actor scene".split()


def tokenizer():
    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]"] + WORDS)}
    raw = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                                   sep_token="[SEP]")


def data(n, seed, tok):
    rnd = random.Random(seed)
    text = [" ".join(rnd.choice(WORDS) for _ in range(rnd.randint(3, 10))) for _ in range(n)]
    label = [int(sum(t.split().count(w) for w in ("good", "fine", "great", "nice")) > 1) for t in text]
    return Dataset.from_dict({"text": text, "label": label}).map(lambda b: tok(b["text"]), batched=True,
                                                                 remove_columns=["text"])


class Progress(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        progress(state.global_step)


def main():
    epochs = int(sys.argv[2])
    tok = tokenizer()
    train, evaluation = data(192, 1, tok), data(40, 2, tok)
    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2,
                                                     num_attention_heads=2, intermediate_size=64,
                                                     max_position_embeddings=32, num_labels=2))
    args = TrainingArguments(output_dir=os.path.join(sys.argv[1], "out"), per_device_train_batch_size=8,
                             gradient_accumulation_steps=2, num_train_epochs=epochs, learning_rate=2e-3,
                             warmup_steps=3, logging_steps=2, eval_strategy="steps", eval_steps=6, save_steps=6,
                             save_total_limit=2, report_to=[], use_cpu=True, seed=0, disable_tqdm=True,
                             ddp_backend="gloo")
    trainer = Trainer(model=model, args=args, train_dataset=train, eval_dataset=evaluation,
                      data_collator=DataCollatorWithPadding(tok), callbacks=[Progress()])
    trainer.train()
    log = [{k: v for k, v in e.items() if "runtime" not in k and "per_second" not in k} for e in trainer.state.log_history]
    finish(model=model.state_dict(), log=log, steps=trainer.state.global_step)


if __name__ == "__main__":
    main()
