"""A causal language model trained by a hand-written loop, as the transformers examples'
`run_clm_no_trainer` style does without Accelerate: a tiny GPT-2 built from a config (nothing
downloaded), AdamW over two parameter groups (no weight decay on biases and LayerNorm weights),
get_linear_schedule_with_warmup, gradient accumulation over two micro-batches with clipping, and
every few optimizer steps a sampled generation (model.generate with do_sample, top_k, its own
GenerationConfig) whose tokens are kept, drawing from the global torch generator mid-training.
usage: gpt_loop.py OUT [--epochs N]"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import torch
from common import finish, progress
from transformers import GenerationConfig, GPT2Config, GPT2LMHeadModel, get_linear_schedule_with_warmup


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--accumulate", type=int, default=2)
    args = parser.parse_args()

    torch.manual_seed(81)
    config = GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=2, bos_token_id=1, eos_token_id=2)
    model = GPT2LMHeadModel(config)
    data = torch.randint(3, 64, (96, 16), generator=torch.Generator().manual_seed(82))
    loader = torch.utils.data.DataLoader(data, batch_size=8, shuffle=True)
    no_decay = ("bias", "ln_", "LayerNorm")
    groups = [
        {"params": [p for n, p in model.named_parameters() if not any(k in n for k in no_decay)], "weight_decay": 0.01},
        {"params": [p for n, p in model.named_parameters() if any(k in n for k in no_decay)], "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(groups, lr=2e-3)
    updates = args.epochs * len(loader) // args.accumulate
    scheduler = get_linear_schedule_with_warmup(optimizer, num_warmup_steps=3, num_training_steps=updates)
    sampling = GenerationConfig(do_sample=True, top_k=8, max_new_tokens=6, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    samples, losses, step = [], [], 0

    model.train()
    for epoch in range(args.epochs):
        for i, batch in enumerate(loader):
            loss = model(input_ids=batch, labels=batch).loss / args.accumulate
            loss.backward()
            losses.append(loss.item())
            if (i + 1) % args.accumulate == 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
                if scheduler.last_epoch % 4 == 0:
                    model.eval()
                    with torch.no_grad():
                        samples.append(model.generate(batch[:2, :4], generation_config=sampling).tolist())
                    model.train()
            step += 1
            progress(step)

    finish(model=model.state_dict(), optimizer=optimizer.state_dict(), scheduler=scheduler.state_dict(),
           samples=samples, losses=losses)


if __name__ == "__main__":
    main()
