"""Snapshots written by an earlier gpusnap still restore: tests/golden/format1 was written by the
single-threaded writer that compressed every chunk with ZSTD-1 (or stored it raw), before chunks
were encoded in parallel and chosen per chunk; tests/golden/format1-program.py made it, and
format1-expected.pt is the same state saved by torch at the same point."""

from __future__ import annotations

import json
import pathlib
import shutil

import torch

from gpusnap.restore import load
from gpusnap.store import RunDir

GOLDEN = pathlib.Path(__file__).parent / "golden"


def test_a_snapshot_of_the_first_writer_verifies_and_restores_to_its_bytes(tmp_path):
    run = tmp_path / "format1"
    shutil.copytree(GOLDEN / "format1", run)
    for path in [run, *run.rglob("*")]:
        path.chmod(0o700 if path.is_dir() else 0o600)  # as gpusnap made them (a checkout may not keep modes)
    rd = RunDir.open(run)
    assert rd.verify() == []
    codecs = {entry[4] for f in (run / "index").glob("*.json") for p in json.loads(f.read_text())["packs"].values()
              for entry in p["chunks"]}
    assert codecs == {0, 1}  # raw and blosc2 chunks both
    _, payload = load(rd)
    saved = payload["globals"]["__main__"]
    expected = torch.load(GOLDEN / "format1-expected.pt", weights_only=False)
    model, optimizer = saved["model"].state_dict(), saved["optimizer"].state_dict()
    assert model.keys() == expected["model"].keys()
    for key, tensor in expected["model"].items():
        assert torch.equal(model[key], tensor), key
    for index, state in expected["optimizer"]["state"].items():
        for key, value in state.items():
            assert torch.equal(optimizer["state"][index][key], value), (index, key)
