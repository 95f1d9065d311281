"""`gpusnap run --nproc-per-node N ...`: the ranks are launched by torchrun
(``python -m torch.distributed.run``: its elastic agent and rendezvous), one `gpusnap run` per
node, and each rank runs ``python -m gpusnap.boot SCRIPT ARGS`` under it. The supervisor never
imports torch: it only starts the agent as its child.

The options are torchrun's own, under the same names; gpusnap passes them through and adds
``--max-restarts 0`` (a restart of the workers by the agent would start the program from its
beginning, not from a snapshot: `gpusnap restart` does that) unless given.
"""

from __future__ import annotations

import sys

import click

from gpusnap.errors import UsageError

# (click name, torchrun flag, metavar, help)
OPTIONS = [
    ("nproc_per_node", "--nproc-per-node", "N", "Run the program as a torchrun job of N ranks on this node (torch.distributed.run); "
                                                 "each rank writes its own shard and snapshots are global."),
    ("nnodes", "--nnodes", "N|MIN:MAX", "torchrun: the number of nodes (one `gpusnap run` per node, all on one --dir)."),
    ("node_rank", "--node-rank", "R", "torchrun: this node's rank (static rendezvous)."),
    ("rdzv_backend", "--rdzv-backend", "NAME", "torchrun: rendezvous backend (c10d, static, etcd-v2)."),
    ("rdzv_endpoint", "--rdzv-endpoint", "HOST[:PORT]", "torchrun: rendezvous endpoint."),
    ("rdzv_id", "--rdzv-id", "ID", "torchrun: the job's rendezvous id."),
    ("rdzv_conf", "--rdzv-conf", "K=V,...", "torchrun: extra rendezvous configuration."),
    ("master_addr", "--master-addr", "HOST", "torchrun: the master's address (static rendezvous)."),
    ("master_port", "--master-port", "PORT", "torchrun: the master's port (static rendezvous)."),
    ("max_restarts", "--max-restarts", "N", "torchrun: worker group restarts (default 0: gpusnap restarts from snapshots)."),
]


def options(f):
    """The torchrun options, for `gpusnap run` and `gpusnap restart`."""
    f = click.option("--standalone", is_flag=True, default=None,
                     help="torchrun: a single-node job with its own local rendezvous (the default with --nproc-per-node alone).")(f)
    for name, flag, metavar, text in reversed(OPTIONS):
        f = click.option(flag, name, metavar=metavar, default=None, help=text)(f)
    return f


def arguments(values: dict) -> list[str] | None:
    """torchrun's arguments from the options given (None: not a distributed run)."""
    given = {name: values.get(name) for name, *_ in OPTIONS}
    standalone = values.get("standalone")
    if all(v is None for v in given.values()) and not standalone:
        return None
    if given["nproc_per_node"] is None:
        raise UsageError("torchrun options need --nproc-per-node", hint="gpusnap run --nproc-per-node N [--nnodes ...] SCRIPT")
    args: list[str] = []
    multi = any(given[k] is not None for k in ("nnodes", "rdzv_backend", "rdzv_endpoint", "master_addr", "node_rank"))
    if standalone or not multi:
        args.append("--standalone")
    for name, flag, *_ in OPTIONS:
        if given[name] is not None:
            args += [flag, str(given[name])]
    if given["max_restarts"] is None:
        args += ["--max-restarts", "0"]
    world_size(args)  # refuses what it cannot read
    return args


def world_size(args: list[str]) -> int | None:
    """The job's number of ranks, when torchrun's arguments fix it (--nnodes a number or N:N,
    --nproc-per-node a number); None for an elastic range or "gpu"/"auto"."""
    values = _values(args)
    nproc = values.get("--nproc-per-node", "1")
    nnodes = values.get("--nnodes", "1")
    if ":" in nnodes:
        low, _, high = nnodes.partition(":")
        nnodes = low if low == high else None
    try:
        n = int(nproc) if nproc.isdigit() else None
        m = int(nnodes) if nnodes is not None else None
    except ValueError:
        raise UsageError(f"--nnodes {values.get('--nnodes')!r} is not a number or MIN:MAX") from None
    if n is not None and n < 1:
        raise UsageError("--nproc-per-node must be at least 1")
    return n * m if n is not None and m is not None else None


def node_ranks(args: list[str], world: int) -> list[int] | None:
    """The global ranks of a job of ``world`` ranks that this node runs, where torchrun's
    arguments fix them before the rendezvous: all of them on a single node; the block of
    ``--node-rank`` under a static rendezvous (torchrun numbers a node's ranks on from the nodes
    before it). None where the rendezvous assigns them (c10d, etcd over several nodes)."""
    values = _values(args)
    if "--standalone" in args or values.get("--nnodes", "1") in ("1", "1:1"):
        return list(range(world))
    nproc, node = values.get("--nproc-per-node", ""), values.get("--node-rank")
    if values.get("--rdzv-backend", "static") != "static" or node is None or not nproc.isdigit() or not node.isdigit():
        return None
    return [r for r in range(int(node) * int(nproc), (int(node) + 1) * int(nproc)) if r < world]


def _values(args: list[str]) -> dict[str, str]:
    """Each of torchrun's arguments with the one after it (a flag's value, as ``arguments`` writes them)."""
    return dict(zip(args, args[1:]))


def command(torchrun: list[str], kind: str, target: str, args: list[str]) -> list[str]:
    """The agent's argv: each rank runs ``python -u -m gpusnap.boot SCRIPT|-m MODULE ARGS``."""
    program = ["-m", target] if kind == "module" else [target]
    return [sys.executable, "-m", "torch.distributed.run", *torchrun, "-m", "gpusnap.boot", *program, *args]
