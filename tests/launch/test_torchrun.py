"""Which ranks a node runs, as torchrun's options fix them before the rendezvous: the node's
supervisor puts back those ranks' files (gpusnap/files/rollback.py)."""

import pytest

from gpusnap.launch.torchrun import arguments, node_ranks


@pytest.mark.parametrize("options,world,ranks", [
    ({"nproc_per_node": "2"}, 2, [0, 1]),  # --standalone
    ({"nproc_per_node": "4", "nnodes": "1"}, 4, [0, 1, 2, 3]),
    ({"nproc_per_node": "2", "nnodes": "2", "node_rank": "1", "master_addr": "node0"}, 4, [2, 3]),
    ({"nproc_per_node": "2", "nnodes": "2", "node_rank": "0", "rdzv_backend": "static", "master_addr": "node0"}, 4, [0, 1]),
    ({"nproc_per_node": "1", "nnodes": "2", "rdzv_backend": "c10d", "rdzv_endpoint": "node0:29400"}, 2, None),
    ({"nproc_per_node": "2", "nnodes": "2", "node_rank": "1", "rdzv_backend": "c10d", "rdzv_endpoint": "node0"}, 4, None),
    ({"nproc_per_node": "gpu", "nnodes": "2", "node_rank": "1", "master_addr": "node0"}, 4, None),
])
def test_the_ranks_a_node_runs(options, world, ranks):
    assert node_ranks(arguments(options), world) == ranks
