"""A transformers Trainer on a tiny GPT-2 built from its config (nothing downloaded), trained on
generated token ids, a loss logged at every step; a callback reports progress. The final state
holds what the Trainer keeps: weights, optimizer and scheduler states, the log history (losses,
learning rates, gradient norms, epochs, the mean training loss; not the timings), the global step and epoch.
With --save-steps N the Trainer checkpoints every N steps into OUT/trainer, keeping the last
--save-total-limit (2) checkpoint directories.
usage: hf_trainer.py OUT [--epochs N] [--accumulate N] [--auto-batch] [--save-steps N [--save-total-limit N]]"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import torch
from common import finish, progress
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments


class TokenIds(torch.utils.data.Dataset):
    def __init__(self, n=192, length=16, vocab=64):
        generator = torch.Generator().manual_seed(1)
        self.ids = torch.randint(0, vocab, (n, length), generator=generator)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class Progress(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        progress(state.global_step)


def main():
    parser = argparse.ArgumentParser(description="tiny GPT-2 with the transformers Trainer")
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--accumulate", type=int, default=1, help="gradient accumulation steps")
    parser.add_argument("--auto-batch", action="store_true", help="auto_find_batch_size (Accelerate's retry loop)")
    parser.add_argument("--save-steps", type=int, default=0, help="checkpoint every N steps (0: never)")
    parser.add_argument("--save-total-limit", type=int, default=2, help="checkpoints kept")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=2))
    training = TrainingArguments(
        output_dir=os.path.join(args.out, "trainer"),
        per_device_train_batch_size=8,
        num_train_epochs=args.epochs,
        gradient_accumulation_steps=args.accumulate,
        auto_find_batch_size=args.auto_batch,
        logging_steps=1,
        save_strategy="steps" if args.save_steps else "no",
        save_steps=args.save_steps or 500,
        save_total_limit=args.save_total_limit,
        report_to=[],
        use_cpu=True,
        seed=0,
        disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=training, train_dataset=TokenIds(), callbacks=[Progress()])
    trainer.train()
    state = trainer.state
    log = [{k: v for k, v in entry.items() if "runtime" not in k and "per_second" not in k} for entry in state.log_history]
    finish(
        model=model.state_dict(),
        optimizer=trainer.optimizer.state_dict(),
        scheduler=trainer.lr_scheduler.state_dict(),
        log=log,
        steps=state.global_step,
        epoch=state.epoch,
    )


if __name__ == "__main__":
    main()
