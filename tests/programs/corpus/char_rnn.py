"""A character-level GRU in the style of the char-rnn scripts people write: a text made from a
small grammar, random chunks drawn with the `random` module, `while True:` with a step counter
and `break` at --steps, a sample generated with torch.multinomial every --sample-every steps
(from a temperature taken in a helper), ReduceLROnPlateau stepped on a smoothed loss, and
everything inside main().
usage: char_rnn.py OUT [--steps N] [--chunk-len L]"""
import argparse
import random
import string
import time

import torch
import torch.nn as nn

from common import finish, progress

all_characters = string.ascii_lowercase + " .,\n"
n_characters = len(all_characters)


def make_text(seed, sentences=300):
    rng = random.Random(seed)
    subjects = ["the cat", "a dog", "my friend", "the model", "our loss", "a gradient"]
    verbs = ["runs", "falls", "jumps over", "descends", "explodes near", "waits for"]
    objects = ["the hill", "a minimum", "the fence", "its target", "the batch", "a plateau"]
    lines = []
    for _ in range(sentences):
        lines.append(f"{rng.choice(subjects)} {rng.choice(verbs)} {rng.choice(objects)}{rng.choice(['.', ',', '.'])}")
    return "\n".join(lines)


def char_tensor(text):
    tensor = torch.zeros(len(text)).long()
    for c in range(len(text)):
        tensor[c] = all_characters.index(text[c])
    return tensor


class CharRNN(nn.Module):
    def __init__(self, input_size, hidden_size, output_size, n_layers=1):
        super(CharRNN, self).__init__()
        self.hidden_size = hidden_size
        self.n_layers = n_layers
        self.encoder = nn.Embedding(input_size, hidden_size)
        self.gru = nn.GRU(hidden_size, hidden_size, n_layers)
        self.decoder = nn.Linear(hidden_size, output_size)

    def forward(self, inp, hidden):
        output, hidden = self.gru(self.encoder(inp.view(1, -1)), hidden)
        return self.decoder(output.view(inp.size(0), -1)), hidden

    def init_hidden(self, batch_size):
        return torch.zeros(self.n_layers, batch_size, self.hidden_size)


def random_training_set(text, chunk_len, batch_size):
    inp = torch.LongTensor(batch_size, chunk_len)
    target = torch.LongTensor(batch_size, chunk_len)
    for bi in range(batch_size):
        start_index = random.randint(0, len(text) - chunk_len - 1)
        end_index = start_index + chunk_len + 1
        chunk = char_tensor(text[start_index:end_index])
        inp[bi] = chunk[:-1]
        target[bi] = chunk[1:]
    return inp, target


def temperature_at(step, start=1.0, end=0.5, steps=60):
    return start + (end - start) * min(step, steps) / steps


def generate(decoder, prime_str='the', predict_len=40, temperature=0.8):
    hidden = decoder.init_hidden(1)
    prime_input = char_tensor(prime_str).unsqueeze(0)
    predicted = prime_str
    for p in range(len(prime_str) - 1):
        _, hidden = decoder(prime_input[:, p], hidden)
    inp = prime_input[:, -1]
    for p in range(predict_len):
        output, hidden = decoder(inp, hidden)
        output_dist = output.data.view(-1).div(temperature).exp()
        top_i = torch.multinomial(output_dist, 1)[0]
        predicted_char = all_characters[top_i]
        predicted += predicted_char
        inp = char_tensor(predicted_char).unsqueeze(0)
    return predicted


def main():
    argparser = argparse.ArgumentParser()
    argparser.add_argument('out')
    argparser.add_argument('--steps', type=int, default=70)
    argparser.add_argument('--sample-every', type=int, default=10)
    argparser.add_argument('--hidden-size', type=int, default=48)
    argparser.add_argument('--n-layers', type=int, default=2)
    argparser.add_argument('--learning-rate', type=float, default=0.01)
    argparser.add_argument('--chunk-len', type=int, default=24)
    argparser.add_argument('--batch-size', type=int, default=16)
    argparser.add_argument('--seed', type=int, default=1234)
    args = argparser.parse_args()

    random.seed(args.seed)
    torch.manual_seed(args.seed)
    text = make_text(args.seed)

    decoder = CharRNN(n_characters, args.hidden_size, n_characters, args.n_layers)
    decoder_optimizer = torch.optim.Adam(decoder.parameters(), lr=args.learning_rate)
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(decoder_optimizer, factor=0.5, patience=3)
    criterion = nn.CrossEntropyLoss()

    start = time.time()
    all_losses = []
    smoothed = None
    loss_avg = 0
    samples = []
    step = 0
    while True:
        inp, target = random_training_set(text, args.chunk_len, args.batch_size)
        hidden = decoder.init_hidden(args.batch_size)
        decoder.zero_grad()
        loss = 0
        for c in range(args.chunk_len):
            output, hidden = decoder(inp[:, c], hidden)
            loss += criterion(output.view(args.batch_size, -1), target[:, c])
        loss.backward()
        decoder_optimizer.step()
        loss = loss.item() / args.chunk_len
        loss_avg += loss
        all_losses.append(loss)
        smoothed = loss if smoothed is None else 0.9 * smoothed + 0.1 * loss
        step += 1
        progress(step)

        if step % args.sample_every == 0:
            scheduler.step(smoothed)
            print('[%.1fs (%d %d%%) %.4f]' % (time.time() - start, step, step / args.steps * 100, loss_avg / args.sample_every))
            with torch.no_grad():
                samples.append(generate(decoder, 'the', 30, temperature=temperature_at(step)))
            print(samples[-1], '\n')
            loss_avg = 0
        if step >= args.steps:
            break

    finish(model=decoder.state_dict(), optimizer=decoder_optimizer.state_dict(), scheduler=scheduler.state_dict(),
           losses=all_losses, samples=samples, smoothed=smoothed)


if __name__ == '__main__':
    main()
