"""Snapshots written by an earlier gpusnap still restore: tests/golden/format1 was written by the
single-threaded writer that compressed every chunk with ZSTD-1 (or stored it raw), before chunks
were encoded in parallel and chosen per chunk; tests/golden/format2 by the code before capture/
was cut into folders. Each formatN-program.py made its directory, and formatN-expected.pt is the
same state saved by torch at the same point."""

from __future__ import annotations

import json
import pathlib
import pickletools
import shutil

import torch

from gpusnap.restore import load
from gpusnap.store import RunDir

GOLDEN = pathlib.Path(__file__).parents[1] / "golden"


def golden_run(tmp_path, name: str) -> RunDir:
    run = tmp_path / name
    shutil.copytree(GOLDEN / name, run)
    for path in [run, *run.rglob("*")]:
        path.chmod(0o700 if path.is_dir() else 0o600)  # as gpusnap made them (a checkout may not keep modes)
    return RunDir.open(run)


def test_a_snapshot_of_the_first_writer_verifies_and_restores_to_its_bytes(tmp_path):
    rd = golden_run(tmp_path, "format1")
    run = rd.path
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


def test_a_snapshot_from_before_capture_was_cut_into_folders_restores_its_values(tmp_path):
    """The pickle stream names gpusnap.graph.load's functions and classes only: moving the
    modules that write snapshots moves nothing that a snapshot refers to."""
    rd = golden_run(tmp_path, "format2")
    assert rd.verify() == []
    manifest = rd.manifest()
    graph = rd.read_buffer(manifest["buffers"]["graph"], snapshot=manifest["id"])
    named = {arg for _, arg, _ in pickletools.genops(bytes(graph)) if isinstance(arg, str) and arg.startswith("gpusnap")}
    assert named == {"gpusnap.graph.load"}, named
    _, payload = load(rd)
    saved = payload["globals"]["__main__"]
    expected = torch.load(GOLDEN / "format2-expected.pt", weights_only=False)
    for key, tensor in expected["model"].items():
        assert torch.equal(saved["model"].state_dict()[key], tensor), key
    for index, state in expected["optimizer"]["state"].items():
        assert torch.equal(saved["optimizer"].state_dict()["state"][index]["momentum_buffer"], state["momentum_buffer"])
    assert torch.equal(saved["base"], expected["base"])
    assert saved["view"].untyped_storage().data_ptr() == saved["base"].untyped_storage().data_ptr()  # still one storage
    assert torch.equal(saved["view"], expected["base"][8:40].view(4, 8))
    assert (saved["table"] == expected["table"]).all()
    assert saved["py_rng"].getstate() == expected["py_rng"]
    assert saved["np_rng"].bit_generator.state == expected["np_rng"]
    assert saved["local"].qualname == "make_local.<locals>.Local" and saved["local"].attrs == {"total": expected["total"]}
    assert saved["gen"].qualname == "numbers" and saved["gen"].locals == {"n": 4}
    assert manifest["id"] == "000001"
