"""Where the program's files are on this machine. A run restarted from its store on a machine
whose copy of the program is elsewhere (``knobs.MOVED_FROM``, set by ``gpusnap restart``) reads
every path the run recorded under its old working directory as under the current one: loop
positions, sources, the program's files, the files it held open. One rule, for the store's
manifests, the file journal, the replay's frames and the graph's files alike."""

from __future__ import annotations

import os

from gpusnap import knobs


def rebase(doc, old: str, new: str):
    """``doc`` with every path under ``old`` (a string value or key) under ``new`` instead."""
    old = old.rstrip("/")

    def one(x):
        if isinstance(x, str):
            return new + x[len(old):] if x == old or x.startswith(old + "/") else x
        if isinstance(x, dict):
            return {one(k): one(v) for k, v in x.items()}
        if isinstance(x, list):
            return [one(v) for v in x]
        return x

    return one(doc)


def here(doc):
    """``doc``'s paths as they are on this machine: under the current working directory where
    the program's files moved, else ``doc`` itself."""
    return rebase(doc, knobs.MOVED_FROM, os.getcwd()) if knobs.MOVED_FROM and doc is not None else doc
