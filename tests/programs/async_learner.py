"""A learner in asyncio, as actor/learner and streaming codebases write one: a producer coroutine
puts batches into an asyncio.Queue, the learner coroutine awaits them and steps the optimizer;
asyncio.run(main()). usage: async_learner.py OUT STEPS"""
import asyncio
import sys

import torch
from common import finish, progress


async def produce(batches, q):
    for batch in batches:
        await q.put(batch)
    await q.put(None)


async def learn(model, optimizer, q):
    step = 0
    while (batch := await q.get()) is not None:
        x, y = batch
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        progress(step)


async def main(steps):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    batches = [(torch.randn(8, 4), torch.randn(8, 1)) for _ in range(steps)]
    q = asyncio.Queue(maxsize=4)
    await asyncio.gather(produce(batches, q), learn(model, optimizer, q))
    finish(model=model.state_dict())


asyncio.run(main(int(sys.argv[2])))
