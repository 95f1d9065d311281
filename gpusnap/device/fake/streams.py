"""Stream order on the fake GPU: work runs only when something waits for it, and then in an
order that CUDA allows and a GPU may pick, chosen at random from a logged seed.

CUDA orders work only where the program asks it to: operations of one stream run in the order
they were enqueued; an operation on the legacy default stream waits for all earlier work of the
context's blocking streams, and an operation on a blocking stream waits for earlier legacy-stream
work; ``cuStreamWaitEvent`` makes a stream wait for the work an event marks; a synchronize waits
for what it names. Nothing else is ordered: a non-blocking stream's work may run before earlier
legacy-stream work, and two streams' work interleaves anyhow. A fake that ran everything in one
global order at synchronize would hide every missing event or synchronize between streams, so
``Work`` records each operation with the operations it must follow (``Op.after``) and, when a
synchronize makes it run some of them, runs those and everything they follow in a random
topological order. The seed is ``GPUSNAP_FAKE_SEED`` (a random one when unset; ``seed`` says
which), so an order that exposed a bug can be replayed.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field

from gpusnap import knobs


class CudaFault(Exception):
    """A call's failure, by its CUresult name; the modules turn it into the error tuple."""

    def __init__(self, status: str):
        super().__init__(status)
        self.status = status


@dataclass(eq=False)
class Op:
    """One operation on a stream: ``run`` when it executes, after every op in ``after``."""

    seq: int
    stream: object  # machine.Stream
    run: object
    after: set = field(default_factory=set)  # seqs of pending ops it must follow


def chosen_seed() -> int:
    """The stream-order seed of a new fake machine: GPUSNAP_FAKE_SEED, else a fresh random one."""
    if knobs.FAKE_SEED is not None:
        return knobs.FAKE_SEED
    return int.from_bytes(os.urandom(4), "little")


class Work:
    """Every pending operation of one fake machine, and the order in which they run."""

    def __init__(self, seed: int):
        self.seed = seed
        self._order = random.Random(seed)
        self._seq = 0
        self.pending: dict[int, Op] = {}

    def enqueue(self, stream, run, after=()) -> Op:
        """Queue ``run`` on ``stream`` behind what CUDA orders it after (see the module)."""
        self._seq += 1
        waits = {seq for seq in after if seq in self.pending}
        if stream.pending:
            waits.add(stream.pending[-1].seq)
        ctx = stream.ctx
        if stream is ctx.legacy:
            waits |= {s.pending[-1].seq for s in ctx.streams.values() if s.blocking and s.pending}
        elif stream.blocking and ctx.legacy.pending:
            waits.add(ctx.legacy.pending[-1].seq)
        op = Op(self._seq, stream, run, waits)
        stream.pending.append(op)
        self.pending[op.seq] = op
        return op

    def complete(self, targets) -> None:
        """Run the ops ``targets`` and every pending op they follow, in a random order that
        respects ``after``. A fault (``CudaFault``) is sticky for the op's context: the ops not
        run yet are dropped, as a faulted context's are, and the fault is raised."""
        closure: dict[int, Op] = {}
        todo = [op for op in targets if op is not None]
        while todo:
            op = todo.pop()
            if op.seq in closure or op.seq not in self.pending:
                continue
            closure[op.seq] = op
            todo.extend(self.pending[seq] for seq in op.after if seq in self.pending)
        fault = None
        for op in self._topological(closure):
            self._forget(op)
            ctx = op.stream.ctx
            if fault is not None or ctx.error:
                fault = fault or CudaFault(ctx.error)
                continue
            try:
                op.run()
            except CudaFault as exc:
                ctx.error, fault = exc.status, exc
        if fault is not None:
            raise fault

    def _topological(self, closure: dict[int, Op]):
        waiting = {seq: sum(dep in closure for dep in op.after) for seq, op in closure.items()}
        followers: dict[int, list[int]] = {}
        for seq, op in closure.items():
            for dep in op.after:
                if dep in closure:
                    followers.setdefault(dep, []).append(seq)
        ready = sorted(seq for seq, count in waiting.items() if count == 0)
        while ready:
            at = self._order.randrange(len(ready))
            ready[at], ready[-1] = ready[-1], ready[at]
            seq = ready.pop()
            yield closure[seq]
            for follower in followers.get(seq, ()):
                waiting[follower] -= 1
                if waiting[follower] == 0:
                    ready.append(follower)

    def _forget(self, op: Op) -> None:
        del self.pending[op.seq]
        op.stream.pending.remove(op)

    # ---- what the driver's synchronizing calls wait for

    def stream(self, stream) -> None:
        if stream is stream.ctx.legacy:  # the legacy stream waits for the blocking streams too
            return self.legacy(stream.ctx)
        self.complete(stream.pending[-1:])

    def legacy(self, ctx) -> None:
        self.complete([s.pending[-1] for s in (ctx.legacy, *ctx.streams.values()) if s.blocking and s.pending])

    def context(self, ctx) -> None:
        self.complete([s.pending[-1] for s in (ctx.legacy, *ctx.streams.values()) if s.pending])

