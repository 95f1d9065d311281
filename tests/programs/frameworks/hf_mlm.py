"""Masked-language-model pretraining as the transformers docs lay it out: a corpus in a
`datasets.Dataset`, tokenized with `map(batched=True)`, a small BERT built from its config, and a
`Trainer` whose `DataCollatorForLanguageModeling` masks 15% of the tokens of each batch while the
DataLoader fetches it, from the global torch RNG (no seed of its own). The tokenizer is made here
from a word list, so nothing is downloaded.
usage: hf_mlm.py OUT [--epochs N] [--whole-word] [--collator-seed S]"""
import argparse
import os
import random
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import torch
from common import finish, progress
from datasets import Dataset
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import (
    BertConfig,
    BertForMaskedLM,
    DataCollatorForLanguageModeling,
    PreTrainedTokenizerFast,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

WORDS = ("the cat dog bird sat ran flew over under near a big small red blue green tree house river hill "
         "quick slow happy sad sun moon star cloud rain snow wind").split()
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def corpus(n=240, seed=5):
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


def main():
    parser = argparse.ArgumentParser(description="a small masked LM with the transformers Trainer")
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--whole-word", action="store_true", help="mask whole words")
    parser.add_argument("--collator-seed", type=int, default=None, help="the collator's own generator")
    args = parser.parse_args()
    tok = tokenizer()
    raw = Dataset.from_dict({"text": corpus()})
    # Whole words are found by the tokens' offsets, which the collator cannot pad: pad them here.
    tokenized = raw.map(lambda batch: tok(batch["text"], truncation=True, max_length=24,
                                          return_offsets_mapping=args.whole_word,
                                          padding="max_length" if args.whole_word else False),
                        batched=True, remove_columns=["text"])
    collator = DataCollatorForLanguageModeling(tokenizer=tok, mlm_probability=0.15, whole_word_mask=args.whole_word,
                                               seed=args.collator_seed)
    torch.manual_seed(0)
    model = BertForMaskedLM(BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                       intermediate_size=64, max_position_embeddings=32))
    training = TrainingArguments(
        output_dir=os.path.join(args.out, "trainer"),
        per_device_train_batch_size=16,
        num_train_epochs=args.epochs,
        learning_rate=1e-3,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        seed=0,
        disable_tqdm=True,
        remove_unused_columns=not args.whole_word,  # the whole-word collator reads the offsets
    )
    trainer = Trainer(model=model, args=training, train_dataset=tokenized, data_collator=collator,
                      callbacks=[Progress()])
    trainer.train()
    state = trainer.state
    log = [{k: v for k, v in entry.items() if "runtime" not in k and "per_second" not in k} for entry in state.log_history]
    finish(model=model.state_dict(), optimizer=trainer.optimizer.state_dict(), log=log, steps=state.global_step)


if __name__ == "__main__":
    main()
