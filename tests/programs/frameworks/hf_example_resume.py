"""A masked LM trained as the transformers examples' run_mlm.py lays it out: at start it looks
for the last checkpoint in the output directory (get_last_checkpoint) and, finding one, passes
it to trainer.train(resume_from_checkpoint=...); checkpoints every 5 steps, the last 2 kept;
then save_model, the train and eval metrics saved as JSON (timings left out), perplexity.
usage: hf_example_resume.py OUT [--epochs N]"""
import argparse
import hashlib
import math
import os
import random
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import torch
from common import finish, progress
from datasets import Dataset
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import (BertConfig, BertForMaskedLM, DataCollatorForLanguageModeling, PreTrainedTokenizerFast, Trainer,
                          TrainerCallback, TrainingArguments)
from transformers.trainer_utils import get_last_checkpoint

WORDS = "the cat dog bird sat ran flew over under near a big small red blue green tree house river hill".split()
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def texts(n, seed):
    rnd = random.Random(seed)
    return [" ".join(rnd.choice(WORDS) for _ in range(rnd.randint(6, 14))) for _ in range(n)]


def tokenizer():
    vocab = {token: i for i, token in enumerate(SPECIAL + WORDS)}
    raw = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    raw.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])])
    return PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                                   sep_token="[SEP]", mask_token="[MASK]")


class Progress(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        progress(state.global_step)


def untimed(metrics):
    return {k: v for k, v in metrics.items() if "runtime" not in k and "per_second" not in k}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    output_dir = os.path.join(args.out, "mlm")
    # Detecting the last checkpoint, as the examples do.
    last_checkpoint = None
    if os.path.isdir(output_dir):
        last_checkpoint = get_last_checkpoint(output_dir)
        if last_checkpoint is None and len(os.listdir(output_dir)) > 0:
            raise ValueError(f"Output directory ({output_dir}) already exists and is not empty.")
        if last_checkpoint is not None:
            print(f"Checkpoint detected, resuming training at {last_checkpoint}.")
    tok = tokenizer()
    train = Dataset.from_dict({"text": texts(200, 5)}).map(lambda b: tok(b["text"], truncation=True, max_length=24),
                                                          batched=True, remove_columns=["text"])
    evaluation = Dataset.from_dict({"text": texts(40, 6)}).map(lambda b: tok(b["text"], truncation=True, max_length=24),
                                                              batched=True, remove_columns=["text"])
    collator = DataCollatorForLanguageModeling(tokenizer=tok, mlm_probability=0.15)
    torch.manual_seed(0)
    model = BertForMaskedLM(BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                       intermediate_size=64, max_position_embeddings=32))
    training = TrainingArguments(output_dir=output_dir, per_device_train_batch_size=16, per_device_eval_batch_size=20,
                                 num_train_epochs=args.epochs, learning_rate=1e-3, logging_steps=2, save_strategy="steps",
                                 save_steps=5, save_total_limit=2, report_to=[], use_cpu=True, seed=0, disable_tqdm=True)
    trainer = Trainer(model=model, args=training, train_dataset=train, eval_dataset=evaluation, data_collator=collator,
                      callbacks=[Progress()])
    train_result = trainer.train(resume_from_checkpoint=last_checkpoint)
    trainer.save_model()
    metrics = untimed(train_result.metrics)
    metrics["train_samples"] = len(train)
    trainer.log_metrics("train", metrics)
    trainer.save_metrics("train", metrics)
    metrics = untimed(trainer.evaluate())
    metrics["perplexity"] = math.exp(metrics["eval_loss"])
    trainer.save_metrics("eval", metrics)
    listing = {}
    for root, _, files in os.walk(output_dir):
        for name in files:
            path = os.path.join(root, name)
            if name.endswith(".safetensors"):
                with open(path, "rb") as f:
                    listing[os.path.relpath(path, output_dir)] = hashlib.sha256(f.read()).hexdigest()
            else:
                listing[os.path.relpath(path, output_dir)] = None
    log = [untimed(entry) for entry in trainer.state.log_history]
    finish(model=model.state_dict(), log=log, listing=sorted(listing.items()), steps=trainer.state.global_step)


if __name__ == "__main__":
    main()
