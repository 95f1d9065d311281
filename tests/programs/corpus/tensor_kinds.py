"""A recommender-style model with the tensor kinds a training script can hold beside plain dense
fp32 weights: a sparse embedding stepped by SparseAdam (its last gradient, a sparse COO tensor,
kept for logging), parameters that are views into one flat buffer (as fused optimizers and
bucketed all-reduce lay them out), a Parameter subclass and an attribute set on a Parameter (a
"no weight decay" flag the param groups are built from), a complex weight, a bfloat16 bias,
L1 pruning (weight_orig, weight_mask and a forward pre-hook), a bfloat16 autocast forward with
a GradScaler, gradient accumulation over micro-batches, and ReduceLROnPlateau with early
stopping in a `while` loop, batches drawn by hand from a torch.Generator.
usage: tensor_kinds.py OUT [--max-steps N]"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.nn.utils.prune as prune

from common import finish, progress


class TaggedParameter(nn.Parameter):
    """A parameter that says which group it goes in."""

    group = "dense"


class FlatLinear(nn.Module):
    """A linear layer whose weight and bias live in one contiguous buffer."""

    def __init__(self, dim_in, dim_out):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(dim_out, dim_in))
        self.bias = nn.Parameter(torch.empty(dim_out))
        nn.init.kaiming_uniform_(self.weight, a=5 ** 0.5)
        nn.init.zeros_(self.bias)
        flat = torch.cat([self.weight.detach().reshape(-1), self.bias.detach()])
        self.weight.data = flat[: self.weight.numel()].view(dim_out, dim_in)
        self.bias.data = flat[self.weight.numel():]

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)


class Recommender(nn.Module):
    def __init__(self, users, items, dim):
        super().__init__()
        self.users = nn.Embedding(users, dim, sparse=True)
        self.items = nn.Embedding(items, dim, sparse=True)
        self.mix = FlatLinear(2 * dim, dim)
        self.rotate = nn.Parameter(torch.randn(dim, dim, dtype=torch.cfloat) / dim)
        self.scale = TaggedParameter(torch.ones(dim))
        self.scale.group = "norm"
        self.head = nn.Linear(dim, 1)
        self.offset = nn.Parameter(torch.zeros(1, dtype=torch.bfloat16))
        self.offset._no_weight_decay = True
        prune.l1_unstructured(self.head, "weight", amount=0.25)

    def forward(self, user, item):
        h = F.gelu(self.mix(torch.cat([self.users(user), self.items(item)], dim=1)))
        h = (h.to(torch.cfloat) @ self.rotate).abs() * self.scale
        return (self.head(h) + self.offset.float()).squeeze(1)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--max-steps", type=int, default=60)
    parser.add_argument("--micro-batches", type=int, default=3)
    args = parser.parse_args()

    torch.manual_seed(11)
    users, items = 300, 500
    truth_u, truth_i = torch.randn(users, 4), torch.randn(items, 4)
    model = Recommender(users, items, 16)
    sparse = [model.users.weight, model.items.weight]
    dense = [p for p in model.parameters() if all(p is not s for s in sparse) and not p.is_complex()]
    decay = [p for p in dense if not getattr(p, "_no_weight_decay", False) and getattr(p, "group", "dense") == "dense"]
    no_decay = [p for p in dense if all(p is not d for d in decay)]
    sparse_opt = torch.optim.SparseAdam(sparse, lr=0.01)
    dense_opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}], lr=3e-3)
    phase_opt = torch.optim.Adam([model.rotate], lr=1e-3)  # GradScaler has no complex kernels; Adam hardly minds the scale
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(dense_opt, factor=0.5, patience=2)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 8, growth_interval=5)
    sampler = torch.Generator().manual_seed(12)

    step, best, bad, last_sparse_grad, window = 0, float("inf"), 0, None, []
    while step < args.max_steps and bad < 8:
        for _ in range(args.micro_batches):
            user = torch.randint(users, (32,), generator=sampler)
            item = torch.randint(items, (32,), generator=sampler)
            target = (truth_u[user] * truth_i[item]).sum(1)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = F.mse_loss(model(user, item).float(), target) / args.micro_batches
            scaler.scale(loss).backward()
            window.append(loss.item())
        last_sparse_grad = model.users.weight.grad.coalesce()
        scaler.step(dense_opt)
        scaler.step(sparse_opt)
        phase_opt.step()
        scaler.update()
        phase_opt.zero_grad(set_to_none=True)
        dense_opt.zero_grad(set_to_none=True)
        sparse_opt.zero_grad(set_to_none=True)
        step += 1
        if step % 5 == 0:
            mean = sum(window) / len(window)
            plateau.step(mean)
            best, bad = (mean, 0) if mean < best else (best, bad + 1)
            window = []
        progress(step)

    finish(model=model.state_dict(), dense=dense_opt.state_dict(), sparse=sparse_opt.state_dict(), phase=phase_opt.state_dict(),
           plateau=plateau.state_dict(), scaler=scaler.state_dict(), sampler=sampler.get_state(),
           last_sparse_grad=last_sparse_grad, flat_shared=model.mix.weight.untyped_storage().data_ptr()
           == model.mix.bias.untyped_storage().data_ptr(), group=model.scale.group, steps=step)


if __name__ == "__main__":
    main()
