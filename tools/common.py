"""Helpers shared by the scripts in tools/ (each run as ``python tools/NAME.py``, so this module
is importable beside them)."""

from __future__ import annotations

import json
import subprocess
import textwrap
import time


def wait_for(predicate, what: str, proc=None, timeout: float = 300):
    """Poll ``predicate`` until it returns something true and return that. Raises RuntimeError
    when ``proc`` (a Popen) exits first, with its stderr if it was piped, or on timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            err = proc.stderr.read() if proc.stderr is not None else ""
            raise RuntimeError(f"the program exited (status {proc.returncode}) while waiting for {what}"
                               + (f": {err}" if err else ""))
        time.sleep(0.05)
    raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}")


def read_json(path):
    """The JSON document at ``path``, or None while it is missing or half-written."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


class Tee:
    """``say(line)``: print a line and append it to the raw output file at once (a long run that
    fails midway keeps what it measured)."""

    def __init__(self, path: str):
        self.file = open(path, "w")

    def __call__(self, line: str = "") -> None:
        print(line, flush=True)
        self.file.write(line + "\n")
        self.file.flush()


def git_commit(repo) -> str:
    """The checkout's short commit, ``(dirty)`` after it when tracked files are changed."""
    def git(*args):
        return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True).stdout.strip()

    return git("rev-parse", "--short", "HEAD") + (" (dirty)" if git("status", "--porcelain", "--untracked-files=no") else "")


def against_base(parser, name: str):
    """The setup of a benchmark that runs this checkout, and ``--base`` (another one) alternating
    with it: adds ``--base``, ``--dir`` and ``--out`` to ``parser``, parses the command line, and
    returns (args, say: a ``Tee`` to the raw output, the trees {"this"|"base": path}), each tree
    said with its commit."""
    import os

    parser.add_argument("--base", help="another checkout of gpusnap to alternate with (default: this one alone)")
    parser.add_argument("--dir", default="/work/bench-tmp", help="scratch directory")
    parser.add_argument("--out", default=None, help=f"raw output (default tools/results/{name}-cpu-DATE.txt)")
    args = parser.parse_args()
    tools = os.path.dirname(os.path.abspath(__file__))
    say = Tee(args.out or os.path.join(tools, "results", f"{name}-cpu-{time.strftime('%Y-%m-%d-%H%M')}.txt"))
    this = os.path.dirname(tools)
    trees = {"this": this} if not args.base else {"this": this, "base": os.path.abspath(args.base)}
    for tree_name, tree in trees.items():
        say(f"# {tree_name}: {tree} at {git_commit(tree)}")
    return args, say, trees


def alternating(trees: dict, rounds: int):
    """(round, tree name) in ABBA order, so that a slow spell of the machine falls on both."""
    for k in range(rounds):
        for name in list(trees) if k % 2 == 0 else list(trees)[::-1]:
            yield k, name


# The benchmarks' training state, as program text (their programs are written into a temp dir):
# an MLP of square fp32 Linear layers with Adam, sized so that parameters + Adam's two moments
# are ``state_bytes``, and one training step of it.
MLP = textwrap.dedent(
    """
    def build(state_bytes):
        n_params = int(state_bytes / 3 / 4)
        width = 4096 if n_params >= 64 * 4096 * 4096 // 16 else 2048 if n_params >= 4 * 2048 * 2048 else 1024
        depth = max(1, round(n_params / (width * width + width)))
        torch.manual_seed(0)
        layers = []
        for _ in range(depth):
            layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
        model = torch.nn.Sequential(*layers[:-1])
        opt = torch.optim.Adam(model.parameters(), lr=1e-5)
        x = torch.randn(8, width)
        return model, opt, x, width, depth

    def step(model, opt, x):
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    """
)
