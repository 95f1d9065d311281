"""The training program and the anchor runner of tools/bench_gpu.py (run on a CUDA GPU).

    python tools/bench_gpu_program.py train   GB FROZEN STAMPS STOP [--queued]
    python tools/bench_gpu_program.py anchors GB OUT_DIR REPEATS

The state: an MLP of square fp32 Linear layers on cuda:0 whose parameters, Adam's exp_avg and
exp_avg_sq come to GB (1e9 bytes), gradients set to None after each step (the state at a loop
boundary is what a state_dict holds). FROZEN (0..1) of the layers do not train: their weights
stay on the GPU, unchanged, and have no optimizer state.

``train`` steps until STOP exists, appending each step's end time to STAMPS; each step ends
with a synchronize (as a loop that reads its loss does), unless --queued, where it leaves the
step's kernels queued and adds a long tail of matmuls: a snapshot then lands on queued work.

``anchors`` prints one JSON object: torch.save of the state + fsync; DCP async_save's blocking
time and its total; a pinned device->host copy of the same bytes tensor by tensor (what staging
every tensor costs at best) and as one copy of one buffer of the same size (the merged copy);
cuMemHostRegister's cost per GB and fork() with the registered memory mapped.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time

import torch

WIDTH = 4096


def build(state_gb: float, frozen: float):
    n_params = int(state_gb * 1e9 / 3 / 4)
    depth = max(2, round(n_params / (WIDTH * WIDTH + WIDTH)))
    torch.manual_seed(0)
    layers = [torch.nn.Linear(WIDTH, WIDTH, device="cuda") for _ in range(depth)]
    cold = int(round(depth * frozen))
    for layer in layers[:cold]:
        layer.requires_grad_(False)
    model = torch.nn.Sequential(*layers)
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-6)
    batch = torch.randn(8, WIDTH, device="cuda")
    return model, optimizer, batch


def step(model, optimizer, batch) -> None:
    model(batch).square().mean().backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def state_tensors(model, optimizer) -> list:
    tensors = list(model.parameters())
    for state in optimizer.state.values():
        tensors += [v for v in state.values() if isinstance(v, torch.Tensor) and v.is_cuda]
    return tensors


def train(argv) -> None:
    gb, frozen, stamps_path, stop_path = float(argv[0]), float(argv[1]), argv[2], argv[3]
    queued = "--queued" in argv
    model, optimizer, batch = build(gb, frozen)
    tail = torch.randn(WIDTH, WIDTH, device="cuda")
    with open(stamps_path, "w") as stamps:
        while not os.path.exists(stop_path):
            step(model, optimizer, batch)
            if queued:
                for _ in range(20):
                    tail = (tail @ tail).tanh_()  # ~60 ms of queued work on an H100
            else:
                torch.cuda.synchronize()
            stamps.write(f"{time.time():.6f}\n")
            stamps.flush()


def timed(fn, repeats: int) -> list:
    runs = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        runs.append(time.perf_counter() - t)
    return runs


def anchors(argv) -> None:
    gb, out_dir, repeats = float(argv[0]), argv[1], int(argv[2])
    import torch.distributed.checkpoint as dcp

    model, optimizer, batch = build(gb, 0.0)
    for _ in range(3):
        step(model, optimizer, batch)
    tensors = state_tensors(model, optimizer)
    nbytes = sum(t.numel() * t.element_size() for t in tensors)
    result = {"state_bytes": nbytes, "tensors": len(tensors), "torch": torch.__version__,
              "gpu": torch.cuda.get_device_name(0), "cuda": torch.version.cuda}

    def state():
        return {"model": model.state_dict(), "optim": optimizer.state_dict()}

    path = os.path.join(out_dir, "torch_save.pt")

    def save():
        with open(path, "wb") as f:
            torch.save(state(), f)
            f.flush()
            os.fsync(f.fileno())

    result["torch_save_s"] = timed(save, repeats)
    os.remove(path)

    path = os.path.join(out_dir, "dcp_async")
    block, total = [], []
    for _ in range(repeats):
        t = time.perf_counter()
        future = dcp.async_save(state(), checkpoint_id=path)
        block.append(time.perf_counter() - t)
        future.result()
        total.append(time.perf_counter() - t)
        shutil.rmtree(path)
    result["dcp_async_block_s"], result["dcp_async_total_s"] = block, total

    pinned = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)

    def per_tensor():
        at = 0
        for t in tensors:
            n = t.numel() * t.element_size()
            pinned[at : at + n].copy_(t.detach().view(-1).view(torch.uint8), non_blocking=True)
            at += n

    result["pinned_copy_s"] = timed(per_tensor, repeats + 1)[1:]  # the first run faults pages in
    one = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    result["merged_copy_s"] = timed(lambda: pinned.copy_(one, non_blocking=True), repeats)
    del one, pinned

    from gpusnap.device.cuda import CudaBackend
    from gpusnap.stage.arena import Arena
    from gpusnap.stage.unforked import vmflags

    backend = CudaBackend()
    arena = Arena(capacity=int(min(gb, 4) * 1e9) + (1 << 20))
    arena.reserve(arena.capacity - (1 << 20), "device")
    offset, pinned = arena.pinned  # as staging registers it: fresh pages, allocated by the pinning
    t = time.perf_counter()
    backend.register_host(arena.address + offset, pinned)
    result["register_s"], result["register_bytes"] = time.perf_counter() - t, pinned
    result["arena_vmflags"] = vmflags(arena.address + offset)
    forks = []
    for _ in range(5):
        t = time.perf_counter()
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        forks.append(time.perf_counter() - t)
        os.waitpid(pid, 0)
    result["fork_s"] = forks
    backend.unregister_host(arena.address + offset)
    print(json.dumps(result))


if __name__ == "__main__":
    {"train": train, "anchors": anchors}[sys.argv[1]](sys.argv[2:])
