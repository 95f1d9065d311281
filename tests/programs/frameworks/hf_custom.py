"""A transformers Trainer customised the usual ways: a subclass that overrides compute_loss
(class-weighted cross-entropy), a TrainerCallback with state of its own (the logs it saw, the
best eval loss), a data collator function that pads each batch to its longest sequence, an
evaluation every few steps during training with compute_metrics, a cosine schedule with warmup.
The model is a tiny BERT classifier built from a config (nothing downloaded), on generated
variable-length token sequences.
usage: hf_custom.py OUT [--epochs N]"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import numpy as np
import torch
from common import finish, progress
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainerCallback, TrainingArguments

PAD = 0


class Sequences(torch.utils.data.Dataset):
    """Token sequences of 6-20 tokens; the label says whether token 7 occurs more than token 9."""

    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.items = []
        for _ in range(n):
            length = int(torch.randint(6, 21, (1,), generator=g))
            ids = torch.randint(1, 32, (length,), generator=g)
            label = int((ids == 7).sum() > (ids == 9).sum())
            self.items.append((ids, label))

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        ids, label = self.items[i]
        return {"input_ids": ids, "labels": label}


def collate(features):
    longest = max(len(f["input_ids"]) for f in features)
    input_ids = torch.full((len(features), longest), PAD, dtype=torch.long)
    attention_mask = torch.zeros((len(features), longest), dtype=torch.long)
    for row, f in enumerate(features):
        input_ids[row, : len(f["input_ids"])] = f["input_ids"]
        attention_mask[row, : len(f["input_ids"])] = 1
    labels = torch.tensor([f["labels"] for f in features])
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def compute_metrics(eval_pred):
    logits, labels = eval_pred
    return {"accuracy": float((np.argmax(logits, axis=-1) == labels).mean())}


class WeightedLossTrainer(Trainer):
    def __init__(self, *args, class_weights=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.class_weights = class_weights

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        labels = inputs.pop("labels")
        outputs = model(**inputs)
        loss = torch.nn.functional.cross_entropy(outputs.logits, labels, weight=self.class_weights)
        return (loss, outputs) if return_outputs else loss


class Recorder(TrainerCallback):
    def __init__(self):
        self.logs = []
        self.best_eval = None

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.logs.append({k: v for k, v in (logs or {}).items() if "runtime" not in k and "per_second" not in k})

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        loss = metrics["eval_loss"]
        self.best_eval = loss if self.best_eval is None else min(self.best_eval, loss)

    def on_step_end(self, args, state, control, **kwargs):
        progress(state.global_step)


def main():
    parser = argparse.ArgumentParser(description="a customised transformers Trainer")
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    torch.manual_seed(0)
    config = BertConfig(vocab_size=32, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                        max_position_embeddings=32, num_labels=2, pad_token_id=PAD)
    model = BertForSequenceClassification(config)
    training = TrainingArguments(
        output_dir=os.path.join(args.out, "trainer"),
        per_device_train_batch_size=8,
        per_device_eval_batch_size=16,
        num_train_epochs=args.epochs,
        learning_rate=3e-3,
        weight_decay=0.01,
        lr_scheduler_type="cosine",
        warmup_steps=5,
        eval_strategy="steps",
        eval_steps=10,
        logging_steps=2,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        seed=0,
        disable_tqdm=True,
    )
    recorder = Recorder()
    trainer = WeightedLossTrainer(
        model=model,
        args=training,
        train_dataset=Sequences(160, seed=1),
        eval_dataset=Sequences(48, seed=2),
        data_collator=collate,
        compute_metrics=compute_metrics,
        callbacks=[recorder],
        class_weights=torch.tensor([1.0, 1.5]),
    )
    trainer.train()
    state = trainer.state
    log = [{k: v for k, v in entry.items() if "runtime" not in k and "per_second" not in k} for entry in state.log_history]
    finish(
        model=model.state_dict(),
        optimizer=trainer.optimizer.state_dict(),
        scheduler=trainer.lr_scheduler.state_dict(),
        log=log,
        recorded=recorder.logs,
        best_eval=recorder.best_eval,
        steps=state.global_step,
    )


if __name__ == "__main__":
    main()
