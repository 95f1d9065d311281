"""Restore: read a snapshot back (``load``) and continue a program from it (``replay``)."""

from __future__ import annotations

import contextlib


def load(run_dir, snap_id: str | None = None, device_tensors: list | None = None, fetched=None) -> tuple[dict, dict]:
    """(manifest, roots payload) of a snapshot; tensors come back as CPU tensors, and those
    saved on a device are listed in ``device_tensors`` as (tensor, saved device). ``fetched``:
    the snapshot's ``store.fetch.Prefetch``, when the caller has one running already.

    Unpickling runs code named in the snapshot: load only run directories you trust. Classes
    the program defined in ``__main__`` must be importable under that name in this process."""
    from gpusnap.graph.load import load_graph
    from gpusnap.store import RunDir
    from gpusnap.store.fetch import Prefetch

    rundir = run_dir if hasattr(run_dir, "read_buffer") else RunDir.open(run_dir)
    manifest = rundir.manifest(snap_id)
    buffers = manifest["buffers"]
    with (Prefetch(rundir, buffers, ["graph"], snapshot=manifest["id"]) if fetched is None else contextlib.nullcontext(fetched)) as fetch:
        graph = fetch.get("graph")
        payload = load_graph(bytes(graph), fetch.get, device_tensors)
    return manifest, payload

