"""Restore: read a snapshot back (``load``) and continue a program from it (``replay``)."""

from __future__ import annotations


def load(run_dir, snap_id: str | None = None, device_tensors: list | None = None) -> tuple[dict, dict]:
    """(manifest, roots payload) of a snapshot; tensors come back as CPU tensors, and those
    saved on a device are listed in ``device_tensors`` as (tensor, saved device).

    Unpickling runs code named in the snapshot: load only run directories you trust. Classes
    the program defined in ``__main__`` must be importable under that name in this process."""
    from gpusnap.graph.load import load_graph
    from gpusnap.store import RunDir

    rundir = run_dir if hasattr(run_dir, "read_buffer") else RunDir.open(run_dir)
    manifest = rundir.manifest(snap_id)
    buffers = manifest["buffers"]
    graph = rundir.read_buffer(buffers["graph"])
    payload = load_graph(bytes(graph), lambda name: rundir.read_buffer(buffers[name]), device_tensors)
    return manifest, payload
