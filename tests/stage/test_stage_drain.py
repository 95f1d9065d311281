"""The drain, in a real forked child: what lands in its region of the staging arena, what the
child lets go of, and what it must leave alone."""

from __future__ import annotations

import hashlib
import os

import numpy as np
import pytest
import torch
from device_helpers import in_child as run_in_child

from gpusnap.stage.drain import Drained, drain
from gpusnap.stage.arena import Arena
from gpusnap.rawmem import view_at

MIN = 256 << 10


def in_child(work):
    """Run ``work()`` in a forked child (as the writer runs); returns its JSON-able result."""
    result = run_in_child(work)
    assert "ok" in result, result
    return result["ok"]


def drain_region(nbytes: int):
    """(arena, its drain region of ``nbytes``, sealed as the writer's generation)."""
    arena = Arena(capacity=nbytes + (1 << 20))
    region = arena.reserve(nbytes, "drain")
    arena.seal()
    return arena, region


def digest(view) -> str:
    return hashlib.sha256(bytes(view)).hexdigest()


def span(t: torch.Tensor) -> tuple[int, int]:
    storage = t.untyped_storage()
    return storage.data_ptr(), storage.nbytes()


def drain_reaching(arena, region, *tensors, optimizers=()) -> Drained:
    """The writer's drain, then the pickler reaching ``tensors`` in that order, and done."""
    drained = drain(arena.fd, region, MIN, optimizers)
    for t in tensors:
        drained.reach(*span(t))
    drained.done()
    return drained


def test_the_region_holds_fork_time_bytes_and_the_child_lets_go_of_the_pages():
    big = torch.arange(1 << 20, dtype=torch.float32)  # 4 MiB
    small = torch.arange(100, dtype=torch.float32)
    before = digest(view_at(*span(big)))
    arena, region = drain_region(64 << 20)

    def work():
        drained = drain_reaching(arena, region, big, small)
        return {
            "region": digest(drained.view(*span(big))),
            "small drained": drained.view(*span(small)) is not None,
            # the child's own mapping of big now reads as fresh zero pages
            "child middle": float(np.frombuffer(view_at(*span(big)), np.float32)[1 << 19]),
            "bytes": drained.nbytes,
        }

    got = in_child(work)
    assert got["region"] == before
    assert not got["small drained"]
    assert got["child middle"] == 0.0
    assert got["bytes"] >= big.untyped_storage().nbytes()
    assert float(big[1 << 19]) == float(1 << 19)  # the parent's pages are untouched


def test_a_page_the_parent_writes_first_is_still_drained_with_its_fork_time_bytes():
    big = torch.zeros(1 << 21)  # 8 MiB
    before = digest(view_at(*span(big)))
    arena, region = drain_region(64 << 20)
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.read(read_fd, 1)  # wait until the parent has rewritten big
        drained = drain_reaching(arena, region, big)
        os._exit(0 if digest(drained.view(*span(big))) == before else 3)
    big.fill_(7.0)
    os.write(write_fd, b"x")
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert float(big.sum()) == 7.0 * (1 << 21)


def test_storages_that_alias_one_memory_become_one_extent():
    arr = np.arange(1 << 18, dtype=np.float64)  # 2 MiB of numpy memory under two tensors
    whole, tail = torch.from_numpy(arr), torch.from_numpy(arr[1000:])
    expected = digest(memoryview(arr[1000:]).cast("B"))
    arena, region = drain_region(64 << 20)

    def work(first, then):
        drained = drain_reaching(arena, region, first, then)
        return {"tail": digest(drained.view(*span(tail))), "whole": digest(drained.view(*span(whole))),
                "extents": len(drained._extents)}

    # The whole first: the tail lies inside its extent. The tail first: the whole is put
    # together from the tail's extent and the pages in front of it, still in place.
    for first, then in ((whole, tail), (tail, whole)):
        got = in_child(lambda: work(first, then))
        assert got == {"tail": expected, "whole": digest(memoryview(arr).cast("B")), "extents": 1}


def test_a_private_file_mapping_is_not_drained(tmp_path):
    path = tmp_path / "weights.bin"
    path.write_bytes(np.arange(1 << 18, dtype=np.float64).tobytes())
    mapped = np.memmap(path, dtype=np.float64, mode="c")  # MAP_PRIVATE over a file
    mapped[:10] = -1.0
    tensor = torch.from_numpy(mapped)
    arena, region = drain_region(64 << 20)
    got = in_child(lambda: drain_reaching(arena, region, tensor).view(*span(tensor)) is None)
    assert got, "dropping a private file mapping's pages would bring back the file's bytes"
    assert float(tensor[0]) == -1.0


def test_a_drain_region_too_small_for_everything_drains_what_fits_and_says_what_it_wanted():
    first = torch.arange(1 << 20, dtype=torch.float32)  # 4 MiB each
    second = torch.arange(1 << 20, dtype=torch.float32) * 2
    before = digest(view_at(*span(first)))
    arena, region = drain_region(5 << 20)  # room for one of them only

    def work():
        drained = drain_reaching(arena, region, first, second)
        views = [drained.view(*span(t)) for t in (first, second)]
        return {"drained": [v is not None for v in views], "wanted": drained.wanted, "bytes": drained.nbytes,
                "digests": [digest(v) for v in views if v is not None]}

    got = in_child(work)
    assert got["drained"].count(True) == 1 and got["bytes"] <= region.nbytes
    assert got["wanted"] >= 8 << 20  # the next region is sized for both
    if got["drained"][0]:
        assert got["digests"] == [before]
    assert float(first[100]) == 100.0 and float(second[100]) == 200.0  # the rest stayed copy-on-write


def test_a_drain_gives_back_the_region_pages_it_did_not_use():
    arena, region = drain_region(64 << 20)
    list(arena.populate(region))
    assert arena.populated(region.offset, region.nbytes) == region.nbytes
    big = torch.arange(1 << 20, dtype=torch.float32)  # 4 MiB

    def work():
        return drain_reaching(arena, region, big).used

    used = in_child(work)
    assert used >= big.untyped_storage().nbytes()
    assert arena.populated(region.offset, region.nbytes) <= used + (4 << 20)  # a page or so of rounding


def test_a_storage_read_in_place_before_the_pickler_reached_it_is_not_drained_after():
    """A reader of memory in place (a numpy array over a tensor's bytes, pickled first) may
    still hold its view when the pickler reaches the tensor: dropping the pages would turn the
    bytes it has yet to write into zeros."""
    from gpusnap.capture.pickling.reducers import HostMemory

    big = torch.arange(1 << 20, dtype=torch.float32)
    before = digest(view_at(*span(big)))
    arena, region = drain_region(64 << 20)

    def work():
        host = HostMemory(drain(arena.fd, region, MIN))
        lent = host.view(*span(big))  # in place, as the numpy array's reducer reads it
        again = host.storage(*span(big))  # then the tensor's storage
        return {"lent": digest(lent), "again": digest(again), "drained": host.drained.nbytes}

    assert in_child(work) == {"lent": before, "again": before, "drained": 0}


def test_what_the_optimizer_steps_is_drained_first_in_step_order_then_the_rest():
    from gpusnap.stage.drain import _step_order

    model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.Linear(512, 512))
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(2, 512)).sum().backward()
    optimizer.step()
    first, second = model[0].weight, model[1].weight
    order = [id(t) for t in _step_order([optimizer], torch)]
    expected = [first, first.grad, optimizer.state[first]["exp_avg"], optimizer.state[first]["exp_avg_sq"], second]
    assert [order.index(id(t)) for t in expected] == sorted(order.index(id(t)) for t in expected)

    loose = torch.arange(1 << 18, dtype=torch.float32)  # no optimizer holds it: drained when reached
    before = {name: digest(view_at(*span(t))) for name, t in [("weight", first), ("exp_avg_sq", optimizer.state[first]["exp_avg_sq"]), ("loose", loose)]}
    arena, region = drain_region(64 << 20)

    def work():
        drained = drain_reaching(arena, region, loose, optimizers=[optimizer])
        tensors = {"weight": first, "exp_avg_sq": optimizer.state[first]["exp_avg_sq"], "loose": loose}
        return {name: digest(drained.view(*span(t))) for name, t in tensors.items()}

    assert in_child(work) == before


@pytest.mark.parametrize("how", ["reached", "stepped"])
def test_a_bytearray_under_a_drained_tensor_keeps_its_bytes(tmp_path, how):
    """``torch.frombuffer`` puts a tensor over a bytearray's memory, and pickle reads the
    bytearray in place, never through the drain's reader: a drain that dropped the writer's
    pages under the tensor first would save the bytearray as zeros. Reached by the pickler
    first, the tensor keeps its pages until the pickler is done; stepped by an optimizer, whose
    drain drops at once, it is left to the pickler too."""
    import io

    from gpusnap import restore
    from gpusnap.capture.pickling.pickler import GraphPickler
    from gpusnap.store import RunDir

    buf = bytearray(np.arange(1 << 20, dtype=np.float32).tobytes())  # 4 MiB, its own mapping
    tensor = torch.nn.Parameter(torch.frombuffer(buf, dtype=torch.float32))
    optimizers = []
    if how == "stepped":
        optimizers = [torch.optim.SGD([tensor], lr=0.1)]  # leaves 0.8 of each value
        tensor.square().sum().backward()
        optimizers[0].step()
    arena, region = drain_region(64 << 20)
    rd = RunDir.create(tmp_path / "run", {"command": ["test"]})

    def work():
        sink = rd.begin_snapshot("000001")
        stream = io.BytesIO()
        pickler = GraphPickler(stream, sink, drained=drain(arena.fd, region, MIN, optimizers))
        pickler.dump_graph({"tensor": tensor, "buf": buf})  # the tensor first
        pickler.host.drained.done()
        graph = sink.put_buffer(stream.getbuffer(), dtype="bytes", typesize=1)
        sink.commit({"buffers": {**pickler.buffers, "graph": graph}})
        return pickler.host.drained.nbytes

    assert in_child(work) >= len(buf)  # drained, by the pickler either way
    _, payload = restore.load(RunDir.open(tmp_path / "run"), "000001")
    assert digest(payload["buf"]) == digest(buf)
    assert digest(payload["tensor"].detach().numpy()) == digest(buf)
