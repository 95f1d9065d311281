"""What instrumentation costs: per loop iteration, per training step, and at start-up.

    python tools/bench_instrument.py [--n 2000000] [--steps 300] [--startup-runs 20]

1. Tight loops (empty body, a tiny realistic body, a `while`), the same source compiled plain
   and instrumented, no snapshot pending: ns per iteration each way and the difference.
2. A CPU training step of a small MLP (two 512x512 Linear, batch 64, SGD): its time, and the
   per-iteration overhead from (1) as a fraction of it (budget: < 0.1%). Also the same training
   loop run plain and instrumented end to end (noisier: the difference is near the noise floor).
3. Loop starts: what starting one loop costs, plain and instrumented, with the capture agent's
   fast-forward note (``describe_source``): a pure source (a list: a type check), a generator
   (not pure: the global RNG states are taken), and a generator started inside a running step
   loop (skipped: such a loop can never be on a snapshot's path). And the per-iteration cost of
   a loop that encloses a step loop (it takes the RNG states at every iteration start).
4. Start-up: `python empty.py` vs `python -m gpusnap.boot empty.py` (cold and warm code cache).
5. The witness (graph/witness.py): what recording the iterations after one snapshot costs (a
   batch digest, the RNG states and the parameters of (2)'s model, for knobs.WITNESS_ITERATIONS
   steps), as a fraction of training time at one snapshot every 60 s and 10 min (budget:
   < 0.1%), the witness file's size, and what every DataLoader batch pays between windows.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

from gpusnap.instrument import importer, loops, transform

TIGHT = {
    "for, empty body": """
        def run(n):
            for i in range(n):
                pass
    """,
    "for, tiny body": """
        def run(n):
            total = 0.0
            log = []
            for i in range(n):
                total += i * 0.5
                if i % 100000 == 0:
                    log.append(total)
            return total
    """,
    "for over enumerate(list)": """
        def run(n, data=list(range(1000))):
            k = 0
            for _ in range(n // 1000):
                for j, x in enumerate(data):
                    k += x
            return k
    """,
    "while, tiny body": """
        def run(n):
            i = 0
            total = 0
            while i < n:
                total += i
                i += 1
            return total
    """,
}


def _compile(source: str, instrumented: bool):
    source = textwrap.dedent(source)
    namespace: dict = {}
    if instrumented:
        code = transform.compile_instrumented(source, "<bench>")
        importer.bind_runtime(namespace)
    else:
        code = compile(source, "<bench>", "exec")
    exec(code, namespace)
    return namespace["run"]


def _best_ns_per_iter(fn, n: int, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        fn(n)
        best = min(best, time.perf_counter_ns() - t0)
    return best / n


def bench_tight(n: int, repeats: int) -> float:
    print(f"tight loops, {n} iterations, best of {repeats}, nothing pending")
    print(f"  {'loop':28s} {'plain ns/it':>12s} {'instr ns/it':>12s} {'overhead ns/it':>15s}")
    worst = 0.0
    for name, source in TIGHT.items():
        plain, instr = _compile(source, False), _compile(source, True)
        # interleave so that frequency drift hits both alike
        p = min(_best_ns_per_iter(plain, n, 1) for _ in range(repeats))
        i = min(_best_ns_per_iter(instr, n, 1) for _ in range(repeats))
        p = min(p, _best_ns_per_iter(plain, n, repeats))
        worst = max(worst, i - p)
        print(f"  {name:28s} {p:12.1f} {i:12.1f} {i - p:15.1f}")
    return worst


MLP_LOOP = """
def train(model, opt, loss_fn, batches):
    for x, y in batches:
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
    return loss
"""


def bench_torch(steps: int, overhead_ns: float) -> None:
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    loss_fn = torch.nn.MSELoss()
    batches = [(torch.randn(64, 512), torch.randn(64, 512)) for _ in range(steps)]
    runs = {}
    for instrumented in (False, True):
        ns: dict = {}
        if instrumented:
            importer.bind_runtime(ns)
            code = transform.compile_instrumented(MLP_LOOP, "<mlp>")
        else:
            code = compile(MLP_LOOP, "<mlp>", "exec")
        exec(code, ns)
        runs[instrumented] = ns["train"]
    runs[False](model, opt, loss_fn, batches[:20])  # warm-up
    # Interleaved chunks, best chunk each way: this box is shared, and the median drifts.
    chunk = max(steps // 10, 1)
    per_step = {False: [], True: []}
    for _ in range(10):
        for instrumented in (False, True):
            t0 = time.perf_counter_ns()
            runs[instrumented](model, opt, loss_fn, batches[:chunk])
            per_step[instrumented].append((time.perf_counter_ns() - t0) / chunk)
    step_ns, instr_ns = min(per_step[False]), min(per_step[True])
    spread = (statistics.median(per_step[False]) - step_ns) / step_ns * 100
    print(f"CPU training step (2x Linear(512,512) + ReLU, batch 64, MSE, SGD; "
          f"{torch.get_num_threads()} torch threads), best of 10 interleaved chunks of {chunk} steps")
    print(f"  step time plain               {step_ns / 1e3:10.1f} us")
    print(f"  step time instrumented        {instr_ns / 1e3:10.1f} us   (end-to-end difference "
          f"{(instr_ns - step_ns) / step_ns * 100:+.3f}%; median-vs-best spread of plain alone {spread:.1f}%)")
    print(f"  loop overhead per step        {overhead_ns:10.1f} ns   = {overhead_ns / step_ns * 100:.4f}% "
          f"of a step (budget 0.1%; worst tight-loop overhead above, one boundary per step)")


LOOP_STARTS = """
def run(n, source, step=None):
    for i in range(n):
        if step is not None and i == 0:
            step()  # an optimizer step: this loop becomes the step loop
        for x in source():
            pass
"""


def bench_loop_starts(n: int, repeats: int) -> None:
    import numpy.random  # noqa: F401  (its global generator is then part of every RNG capture)

    from gpusnap.capture.safepoints import steploop
    from gpusnap.graph import rng
    from gpusnap.restore import fastforward

    steploop._note_source = fastforward.part  # as boot hands it over

    def gen():
        yield 1

    one = [1]
    optimizer = type("Optimizer", (), {})()
    cases = [
        ("over a list, no note taken", lambda: one, None, None),
        ("over a list (pure)", lambda: one, steploop.describe_source, None),
        ("over a generator (RNG states)", gen, steploop.describe_source, None),
        ("over a generator, in a step loop", gen, steploop.describe_source, lambda: steploop._after_optimizer_step(optimizer)),
    ]
    plain_run = _compile(LOOP_STARTS, False)
    instr_run = _compile(LOOP_STARTS, True)
    print(f"loop starts, {n} each, best of {repeats} (one 1-item inner loop per outer iteration)")
    print(f"  {'inner loop':34s} {'plain ns':>10s} {'instr ns':>10s} {'overhead ns':>12s}")
    for name, source, describe, step in cases:
        loops.describe_source = describe
        loops.capture_rng = rng.compact
        try:
            p = min(_best_ns_per_iter(lambda k: plain_run(k, source), n, 1) for _ in range(repeats))
            i = min(_best_ns_per_iter(lambda k: instr_run(k, source, step), n, 1) for _ in range(repeats))
        finally:
            loops.describe_source = None
            steploop._step_loops.clear()
        print(f"  {name:34s} {p:10.1f} {i:10.1f} {i - p:12.1f}")
    loop = loops.EnclosingLoop("1:0", None, "for")
    t0 = time.perf_counter_ns()
    for _ in range(n // 10):
        loop.index += 1
    per = (time.perf_counter_ns() - t0) / (n // 10)
    loops.capture_rng = None
    print(f"  an enclosing loop's iteration start (RNG states taken): {per:.0f} ns")


def _time_run(cmd, env, runs: int) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(cmd, env=env, check=True)
        times.append(time.perf_counter() - t0)
    return min(times) * 1e3


def bench_startup(runs: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        empty = os.path.join(tmp, "empty.py")
        open(empty, "w").close()
        env = dict(os.environ, GPUSNAP_CACHE_DIR=os.path.join(tmp, "cache"))
        env.pop("GPUSNAP_BOOT", None)
        plain = _time_run([sys.executable, empty], env, runs)
        nocache = _time_run([sys.executable, "-m", "gpusnap.boot", empty], dict(env, GPUSNAP_CACHE_DIR="off"), runs)
        warm = _time_run([sys.executable, "-m", "gpusnap.boot", empty], env, runs)
        agent = _time_run([sys.executable, "-c", "import gpusnap.capture.trainee.agent"], env, runs)
        bare = _time_run([sys.executable, "-c", "pass"], env, runs)
        print(f"start-up, best of {runs} runs of an empty script")
        print(f"  python empty.py                          {plain:7.1f} ms")
        print(f"  python -m gpusnap.boot empty.py (no cache) {nocache:5.1f} ms  (+{nocache - plain:.1f} ms)")
        print(f"  python -m gpusnap.boot empty.py (cached)   {warm:5.1f} ms  (+{warm - plain:.1f} ms)")
        print(f"    of which importing gpusnap.capture.trainee.agent alone: +{agent - bare:.1f} ms")
        out = subprocess.run([sys.executable, "-X", "importtime", "-m", "gpusnap.boot", empty], env=env,
                             capture_output=True, text=True).stderr
        plain_mods = subprocess.run([sys.executable, "-X", "importtime", empty], env=env,
                                    capture_output=True, text=True).stderr
        seen = {line.rsplit("|", 1)[-1].strip() for line in plain_mods.splitlines()}
        extra = []
        for line in out.splitlines():
            parts = line.split("|")
            if len(parts) == 3 and parts[2].strip() not in seen and parts[0].split(":")[-1].strip().isdigit():
                extra.append((int(parts[0].split(":")[-1]), parts[2].rstrip()))
        extra.sort(reverse=True)
        print(f"  modules boot imports that plain python does not: {len(extra)}; "
              f"self time {sum(e[0] for e in extra) / 1e3:.1f} ms; largest:")
        for us, name in extra[:8]:
            print(f"    {us / 1e3:6.2f} ms {name}")


def bench_witness(repeats: int) -> None:
    import json

    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from gpusnap import knobs
    from gpusnap.capture.trainee import witness as capture_witness
    from gpusnap.graph import witness

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    loss_fn = torch.nn.MSELoss()
    window = knobs.WITNESS_ITERATIONS or 3
    batches = [(torch.randn(64, 512), torch.randn(64, 512)) for _ in range(window)]

    def steps(recorder) -> tuple[int, int]:
        """(ns of the whole window, ns inside the recorder's calls: what the witness adds)."""
        inside = 0
        start = time.perf_counter_ns()
        for i, batch in enumerate(batches):
            t0 = time.perf_counter_ns()
            recorder.fetched(batch)
            inside += time.perf_counter_ns() - t0
            x, y = batch
            opt.zero_grad(set_to_none=True)
            loss_fn(model(x), y).backward()
            opt.step()
            t0 = time.perf_counter_ns()
            recorder.stepped(opt, i + 1)
            recorder.at_boundary(batch, i + 1)
            inside += time.perf_counter_ns() - t0
        return time.perf_counter_ns() - start, inside

    docs = []
    runs = [steps(witness.Recorder("000001", docs.append, [["<bench>", "train", "1:0"]], window))
            for _ in range(repeats * 4)]
    window_ns, inside_ns = min(runs, key=lambda run: run[1])
    cost_ms = inside_ns / 1e6
    size = len(json.dumps(docs[-1], sort_keys=True))
    print(f"witness: {window} iterations of (2)'s training step (its model's parameters digested after the "
          f"first step and at each boundary), best of {repeats * 4}")
    print(f"  the window {window_ns / 1e6:8.2f} ms, of which in the witness {cost_ms:.3f} ms "
          f"({inside_ns / window_ns * 100:.1f}% of those {window} steps): what a snapshot adds")
    for every_s in (60, 600):
        print(f"  at one snapshot every {every_s:4d} s: {cost_ms / 1e3 / every_s * 100:.5f}% of training time (budget 0.1%)")
    print(f"  witness file: {size} bytes")
    # Between windows every DataLoader batch passes capture's wrapper (one global lookup).
    loader = DataLoader(TensorDataset(torch.zeros(4096, 1)), batch_size=1)
    from gpusnap.capture.safepoints import steploop

    steploop._note_loader_iters(sys.modules["torch.utils.data.dataloader"])
    wrapped = [float("inf")] * 2
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        for _ in loader:
            pass
        wrapped[0] = min(wrapped[0], (time.perf_counter_ns() - t0) / len(loader))
        t0 = time.perf_counter_ns()
        for _ in range(len(loader)):
            capture_witness.fetched(None)
        wrapped[1] = min(wrapped[1], (time.perf_counter_ns() - t0) / len(loader))
    print(f"  a DataLoader batch between windows: {wrapped[1]:.0f} ns in the witness's hook "
          f"({wrapped[0] / 1e3:.1f} us per batch of a trivial loader, hook included)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2_000_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--startup-runs", type=int, default=20)
    parser.add_argument("--loop-starts", type=int, default=200_000)
    parser.add_argument("--no-torch", action="store_true")
    args = parser.parse_args()
    assert not loops.pending
    print(f"python {sys.version.split()[0]}, transform v{transform.VERSION}")
    worst = bench_tight(args.n, args.repeats)
    if not args.no_torch:
        bench_torch(args.steps, worst)
        bench_loop_starts(args.loop_starts, args.repeats)
        bench_witness(args.repeats)
    bench_startup(args.startup_runs)


if __name__ == "__main__":
    main()
