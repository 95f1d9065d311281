"""A word-level tokenizer (the tokenizers library) trained in setup on a tiny corpus; as the run
meets new words it adds them (add_tokens), and from epoch 2 it truncates longer inputs
(enable_truncation), growing the limit each epoch. A bag-of-words model over the ids, resized
as the vocabulary grows. The log prints each batch's encoded lengths; its lines are part of
the final state.
usage: tokenizer_grow.py OUT [--epochs N]"""
import argparse
import os
import random

import torch
import torch.nn as nn
import torch.nn.functional as F
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace
from tokenizers.trainers import WordLevelTrainer

from common import finish, progress

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau".split()


def sentence(rng, n_words):
    return " ".join(rng.choice(WORDS[:n_words]) for _ in range(rng.randint(3, 12)))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=6)
    args = parser.parse_args()
    rng = random.Random(5)
    tok = Tokenizer(WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = Whitespace()
    tok.train_from_iterator([sentence(rng, 8) for _ in range(50)], WordLevelTrainer(special_tokens=["[UNK]"]))
    torch.manual_seed(0)
    emb = nn.EmbeddingBag(64, 8, mode="mean")
    head = nn.Linear(8, 2)
    opt = torch.optim.SGD(list(emb.parameters()) + list(head.parameters()), lr=0.1)
    log = open(os.path.join(args.out, "train.log"), "w")
    step = 0
    for epoch in range(args.epochs):
        if epoch >= 2:
            tok.enable_truncation(max_length=4 + epoch)
        for _ in range(8):
            texts = [sentence(rng, 8 + 2 * epoch) for _ in range(4)]
            for t in texts:
                new = [w for w in t.split() if tok.token_to_id(w) is None]
                if new:
                    tok.add_tokens(sorted(set(new)))
            enc = tok.encode_batch(texts)
            ids = [torch.tensor(e.ids) for e in enc]
            lengths = [len(e.ids) for e in enc]
            flat = torch.cat(ids)
            offsets = torch.tensor([0] + lengths[:-1]).cumsum(0)
            target = torch.tensor([len(t.split()) % 2 for t in texts])
            loss = F.cross_entropy(head(emb(flat, offsets)), target)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            log.write(f"step {step} vocab {tok.get_vocab_size()} lengths {lengths} loss {loss.item():.6f}\n")
            log.flush()
            progress(step)
    log.close()
    with open(os.path.join(args.out, "train.log")) as f:
        lines = f.read().splitlines()
    finish(emb=emb.state_dict(), head=head.state_dict(), vocab=tok.get_vocab_size(), lines=lines)


if __name__ == "__main__":
    main()
