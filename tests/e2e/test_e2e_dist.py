"""Distributed runs end to end: torchrun jobs on CPU over gloo, under the real CLI.

Each program in tests/programs/dist runs once uninterrupted (the reference: each rank with the
environment torchrun gives it) and once under `gpusnap run --nproc-per-node N`; the second is snapshotted at a random step, killed -9 (the whole
job, or one rank alone), restarted, and must end with every rank's final state byte for byte
the reference's. Seeds are logged.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from harness import Run, _env, as_host, assert_same, committed_ids, copy_programs, gpusnap, run_log, start_plain, wait_for

pytestmark = [pytest.mark.skipif(not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
                                 reason="torch.distributed with gloo is not available"),
              pytest.mark.slow]  # end-to-end runs: the full suite, not the quick loop

# Startup of several ranks on the CI machine's 2 cores takes seconds; the programs pace their steps.
# Writers at normal priority: at idle priority, four of them starve behind the ranks and whatever
# else the machine runs, and a program could end before its snapshot commits.
STEP_SLEEP = {"TEST_STEP_SLEEP_S": "0.05", "GPUSNAP_WRITER_PRIORITY": "0"}


@dataclasses.dataclass
class Job:
    """A reference job: its ranks' processes, and the rendezvous store they join."""
    ranks: list
    store: torch.distributed.TCPStore


def reference_job(program: str, *args, ranks: int, cwd: Path) -> Job:
    """The job run uninterrupted on one node, its ranks started as by ``torchrun --standalone``
    (the environment its agent gives each) but forked from an interpreter that has imported
    torch (tests/forkserver.py), without the agent: a rank's torch import was most of a
    reference job's CPU. As torchrun's agent does, the test holds the job's store, on a port it
    bound itself, and every rank joins it as a client: a port found free and handed to rank 0
    to bind could be taken in between by any other job on the machine. ``finish_job`` waits
    for the job."""
    store = torch.distributed.TCPStore("127.0.0.1", 0, world_size=ranks, is_master=True, wait_for_workers=False)
    job = {"WORLD_SIZE": str(ranks), "LOCAL_WORLD_SIZE": str(ranks), "GROUP_RANK": "0", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(store.port), "TORCHELASTIC_USE_AGENT_STORE": "True"}
    return Job([start_plain(cwd / program, *args, cwd=cwd, env={**job, "RANK": str(r), "LOCAL_RANK": str(r)})
                for r in range(ranks)], store)


def finish_job(job: Job, timeout: float = 150) -> None:
    """Wait for every rank to end with status 0. A rank still running after ``timeout`` seconds
    (a reference ends in seconds) fails the test before pytest's own timeout would, with each
    running rank's Python stacks (a forked reference's faulthandler writes them on SIGABRT)."""
    deadline = time.monotonic() + timeout
    try:
        for rank, reference in enumerate(job.ranks):
            while reference.poll() is None and time.monotonic() < deadline:
                time.sleep(0.1)
            if reference.poll() is None:
                pytest.fail(f"reference rank {rank} still runs after {timeout} s:\n{_stacks(job.ranks)}")
            _, err = reference.communicate()
            assert reference.returncode == 0, f"reference rank {rank}: {err[-3000:]}"
    finally:
        for reference in job.ranks:
            if reference.poll() is None:
                reference.kill()


def _stacks(ranks: list) -> str:
    for reference in ranks:
        if reference.poll() is None:
            os.kill(reference.pid, signal.SIGABRT)
    said = []
    for rank, reference in enumerate(ranks):
        try:
            said.append(f"--- rank {rank}:\n{reference.communicate(timeout=10)[1][-3000:]}")
        except subprocess.TimeoutExpired:
            said.append(f"--- rank {rank}: no stacks (still running after SIGABRT)")
    return "\n".join(said)


def rank_progress(out: Path, rank: int) -> int:
    try:
        return int((out / f"rank{rank}" / "progress").read_text() or 0)
    except (FileNotFoundError, ValueError):
        return 0


def least_progress(out: Path, ranks: int) -> int:
    return min(rank_progress(out, r) for r in range(ranks))


def rank_pids(run: Run) -> dict[int, int]:
    """rank -> pid of the job's rank processes (children of torchrun's agent)."""
    import psutil

    found = {}
    for p in psutil.Process(run.proc.pid).children(recursive=True):
        try:
            if "gpusnap.boot" in p.cmdline():
                env = p.environ()
                if "RANK" in env:
                    found[int(env["RANK"])] = p.pid
        except psutil.Error:
            continue
    return found


def snapshot_at(run: Run, run_dir: Path, out: Path, ranks: int, step: int, tries: int = 3) -> str:
    """SIGUSR1 once every rank has reached ``step``; the id of the global snapshot it commits. On a
    loaded machine a global snapshot may fail by design (a rank learned the agreed iteration
    after passing it: "no snapshot was taken", training goes on): asked again, as a user would."""
    wait_for(lambda: least_progress(out, ranks) >= step, f"step {step} on every rank", proc=run, timeout=180)
    before = committed_ids(run_dir)

    def failures() -> int:
        return sum(1 for e in run_log(run_dir) if e.get("event") == "failed")

    for _ in range(tries):
        failed = failures()
        run.signal(signal.SIGUSR1)
        wait_for(lambda: committed_ids(run_dir) - before or failures() > failed, "a committed or failed global snapshot",
                 proc=run, timeout=120)
        if committed_ids(run_dir) - before:
            return max(committed_ids(run_dir) - before)
    pytest.fail(f"{tries} global snapshots asked for, none committed: {[e for e in run_log(run_dir) if e.get('event') == 'failed']}")


def compare(ref: Path, out: Path, ranks: int) -> None:
    for r in range(ranks):
        assert_same(torch.load(out / f"rank{r}" / "final.pt", weights_only=False),
                    torch.load(ref / f"rank{r}" / "final.pt", weights_only=False), f"rank {r}")


@contextlib.contextmanager
def running(*runs: Run):
    """The runs, killed (whole process groups) if a test leaves them running."""
    try:
        yield runs
    finally:
        for run in runs:
            if run.proc.poll() is None:
                run.kill_group()


def stop(run: Run) -> tuple[int, str, str]:
    """SIGTERM to the supervisor: a global snapshot, then the exit status."""
    run.signal(signal.SIGTERM)
    return run.wait(timeout=120)


def _setup(tmp_path: Path):
    progs = copy_programs(tmp_path) / "dist"
    ref, out = tmp_path / "ref", tmp_path / "out"
    return progs, ref, out, tmp_path / "run"


@pytest.mark.parametrize("program,args,ranks,victim", [
    # one rank killed (a node lost), two ranks; the whole job killed: fsdp.py below. The full set
    # runs DDP's whole job too, and three ranks (an odd world size)
    ("ddp.py", ["5"], 2, "one"),
    pytest.param("ddp.py", ["5"], 2, "all", marks=pytest.mark.more),
    pytest.param("ddp.py", ["5"], 3, "one", marks=pytest.mark.more),
    # four ranks of collectives by hand: a shape the two-rank runs of allreduce.py cover
    # (test_forged_keys_in_the_jobs_store_steer_nothing and the shard tests)
    pytest.param("allreduce.py", ["150"], 4, "all", marks=pytest.mark.more),
    ("fsdp.py", ["150"], 2, "all"),
    # Lightning's Trainer(strategy="ddp") taking torchrun's ranks: its launcher's frame was not
    # instrumented (no snapshot ever), then its DistributedSampler's epoch read the replay's 0
    # (refused), then DDP's __setstate__ met the module on a cycle not yet built (refused)
    ("lightning_ddp.py", ["8"], 2, "all"),
    # a transformers Trainer on torchrun's ranks, evaluating every 6 steps: the first evaluation
    # after a restart gathered its losses through the snapshot's copy of the accelerator (the
    # Trainer's `gather_function`, a bound method), which kept the padded samples of the last
    # batch: another eval_loss, "verified", 6 of 6, until a method was bound to its owner's
    # counterpart
    pytest.param("hf_ddp.py", ["6"], 2, "all", marks=pytest.mark.more),
    # Accelerate's save_state every 6 steps, the newest loaded back at start: rank 1 made a
    # checkpoint's directory after the snapshot, rank 0 found it there, and the restart left it,
    # empty, for the replay's setup to load: refused, 2 of 2, until the rank that touched a path
    # first after the snapshot said what was there
    pytest.param("accelerate_state_ddp.py", ["4"], 2, "all", marks=pytest.mark.more),
    # DDP's PowerSGD hook: the reducer restore builds with the run's bucket layout lacked it, and
    # the restart reduced uncompressed gradients: refused, 2 of 2 (one rank killed, the job),
    # until the run's hook was registered on it again; registered mid-run too (a one-process
    # DDP of the default set: corpus ddp_one_process-powersgd)
    pytest.param("comm_hook.py", ["8"], 2, "one", marks=pytest.mark.more),
    pytest.param("comm_hook.py", ["8", "--late"], 2, "all", marks=pytest.mark.more),
    # post-local SGD with a periodic model averager, which leaves the parameters views of one
    # flat tensor: merged each into its own, they were apart after the restart, refused, 2 of 3,
    # until tensors that shared a storage no live one owned moved onto a copy of it
    pytest.param("local_sgd.py", ["6"], 2, "all", marks=pytest.mark.more),
])
def test_kill_and_restart_matches_uninterrupted(tmp_path, program, args, ranks, victim):
    if program.startswith("lightning"):
        pytest.importorskip("lightning")
    if program.startswith("accelerate"):
        pytest.importorskip("accelerate")
    if program.startswith("hf"):
        pytest.importorskip("transformers")
        pytest.importorskip("datasets")
    seed = int(os.environ.get("TEST_SEED") or random.randrange(1 << 30))
    print(f"seed {seed}")
    rnd = random.Random(seed)
    progs, ref, out, run_dir = _setup(tmp_path)
    reference = reference_job(program, ref, *args, ranks=ranks, cwd=progs)
    run = Run("run", "--nproc-per-node", ranks, "--dir", run_dir, program, out, *args, cwd=progs, env=STEP_SLEEP)
    snap = snapshot_at(run, run_dir, out, ranks, rnd.randint(3, 15))
    kill_at = least_progress(out, ranks) + rnd.randint(1, 5)
    wait_for(lambda: least_progress(out, ranks) >= kill_at, f"step {kill_at}", proc=run, timeout=120)
    if victim == "all":
        run.kill_group()
    else:  # one rank alone: torchrun's agent ends the others, and the job fails
        os.kill(rank_pids(run)[rnd.randrange(ranks)], signal.SIGKILL)
        code, _, err = run.wait(timeout=120)
        assert code not in (0, 75), err[-3000:]
    assert not any((out / f"rank{r}" / "final.pt").exists() for r in range(ranks)), "finished before the kill"
    listed = json.loads(gpusnap("ls", run_dir, "--json", cwd=progs).stdout)
    assert [s["id"] for s in listed][-1] == snap
    restart = gpusnap("restart", run_dir, cwd=progs, timeout=300, env=STEP_SLEEP)
    assert restart.returncode == 0, restart.stderr[-4000:]
    assert f"resuming from snapshot {snap}" in restart.stderr
    finish_job(reference)
    compare(ref, out, ranks)


def test_a_job_requeued_on_a_node_of_another_name_gets_each_ranks_files_back(tmp_path):
    """Each rank appends to a log of its own every step; the job is snapshotted, killed -9 and
    restarted under another host name (a scheduler's requeue onto another node). With the
    output directory gone (the old node's disk) the restart refuses (exit 6) before anything
    changes; with it there, every rank's log is put back as it was at the snapshot, and ends
    byte for byte as an uninterrupted run's. (A rank's files once went back only on the host
    that recorded them: the restart said it resumed, and the logs kept the killed run's lines.)"""
    other = as_host("the-next-node", hosts_dir=tmp_path)
    if other is None:
        pytest.skip("needs unshare --uts (root, or user namespaces) to restart under another host name")
    progs, ref, out, run_dir = _setup(tmp_path)
    finish_job(reference_job("allreduce.py", ref, 80, "log", ranks=2, cwd=progs))
    out.mkdir()  # the program makes only its ranks' directories: out is the node's disk
    run = Run("run", "--nproc-per-node", 2, "--dir", run_dir, "allreduce.py", out, 80, "log", cwd=progs, env=STEP_SLEEP)
    with running(run):
        snap = snapshot_at(run, run_dir, out, 2, 10)
        at = least_progress(out, 2)
        wait_for(lambda: least_progress(out, 2) >= at + 5, "5 more steps", proc=run)
        run.kill_group()
    assert not any((out / f"rank{r}" / "final.pt").exists() for r in range(2)), "finished before the kill"

    def restart(*more):  # the dead node's shard locks, which name its host, are taken over at once
        env = {"TEST_STEP_SLEEP_S": "0", "GPUSNAP_LOCK_STALE_S": "0"}
        return Run("restart", run_dir, *more, cwd=progs, env=env, prefix=other).wait(timeout=300)

    gone = tmp_path / "gone"
    out.rename(gone)
    code, _, err = restart()
    assert code == 6, err[-3000:]
    lines = err.splitlines()
    assert lines[-2].startswith(f"gpusnap: cannot put {out / 'rank0'}"), err[-3000:]
    assert "not here" in lines[-2] and lines[-1].startswith("hint: ") and "--force" in lines[-1], err[-3000:]
    assert not out.exists(), "the refused restart changed the files"

    gone.rename(out)
    code, _, err = restart()
    assert code == 0, err[-4000:]
    assert f"gpusnap: resuming from snapshot {snap}" in err
    assert any(line.startswith(f"gpusnap: files back to snapshot {snap}: ") for line in err.splitlines()), err[-3000:]
    compare(ref, out, 2)
    for r in range(2):
        assert (out / f"rank{r}" / "train.log").read_bytes() == (ref / f"rank{r}" / "train.log").read_bytes(), f"rank {r}"


def _run_two_nodes(progs: Path, run_dir: Path, out: Path, args, env: dict | None = None) -> list[Run]:
    """Two `gpusnap run`s, one per "node", meeting through torchrun's c10d rendezvous on localhost."""
    port = random.randrange(20000, 30000)
    common = ["--nproc-per-node", "1", "--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"localhost:{port}",
              "--rdzv-id", f"test{port}", "--dir", run_dir]
    return [Run("run", *common, "ddp.py", out, *args, cwd=progs, env={**STEP_SLEEP, **(env or {})}) for _ in range(2)]


def test_two_nodes_sigterm_exits_75_on_each_and_both_restart(tmp_path):
    """Two torchrun agents on localhost (c10d rendezvous), one `gpusnap run` each, one run
    directory: a snapshot asked of one node is global; SIGTERM to both supervisors snapshots
    and exits 75 on each; restarts that would resume the nodes from different snapshots refuse;
    `gpusnap restart DIR` on each continues to the uninterrupted bytes."""
    progs, ref, out, run_dir = _setup(tmp_path)
    finish_job(reference_job("ddp.py", ref, 6, ranks=2, cwd=progs))
    nodes = _run_two_nodes(progs, run_dir, out, ["6"])
    with running(*nodes):
        first = snapshot_at(nodes[0], run_dir, out, 2, 5)
        wait_for(lambda: least_progress(out, 2) >= 25, "step 25", proc=nodes[1])
        for node in nodes:
            node.signal(signal.SIGTERM)
        results = [node.wait(timeout=120) for node in nodes]
    for code, _, err in results:
        assert code == 75, err[-3000:]
        assert "gpusnap: stopped after a committed snapshot: exit status 75 (requeue to continue)" in err
    ids = sorted(committed_ids(run_dir))
    assert ids[0] == first and len(ids) == 2
    assert sorted(os.listdir(run_dir / "ranks")) == ["0", "1"]

    def restart_each(*extra):
        return [subprocess.Popen([sys.executable, "-m", "gpusnap", "restart", str(run_dir), *more], cwd=progs, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, env=_env(STEP_SLEEP)) for more in extra]

    # Nodes that choose different snapshots (here by --snapshot on one) must not train on as one job.
    mixed = [p.communicate(timeout=300)[1] for p in restart_each(["--snapshot", ids[0]], [])]
    said = "".join(mixed)
    assert "restore refused: the ranks of this job resume from different snapshots (rank 0: snapshot " in said, said[-3000:]
    assert not (out / "rank0" / "final.pt").exists() and sorted(committed_ids(run_dir)) == ids

    restarts = restart_each([], [])
    for p in restarts:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
        assert f"resuming from snapshot {ids[1]}" in err
    compare(ref, out, 2)


@pytest.mark.more  # --every auto alone: tests/launch/test_auto_every.py (CI's time)
def test_every_auto_goes_on_taking_global_snapshots_timed_by_their_measured_cost(tmp_path):
    """--every auto in a distributed run: each global snapshot's cost is measured on the node's
    lowest rank, and the timer asks for the next one (it waited forever for the first cost)."""
    progs, _, out, run_dir = _setup(tmp_path)
    fast = {**STEP_SLEEP, "GPUSNAP_AUTO_FIRST_S": "1", "GPUSNAP_AUTO_MIN_INTERVAL_S": "0.5"}
    # 13 epochs: on a loaded machine the measured cost spaces the snapshots out (9 left room for 2)
    done = gpusnap("run", "--nproc-per-node", 2, "--every", "auto", "--overhead", "20%", "--dir", run_dir, "ddp.py", out, "13",
                   cwd=progs, timeout=300, env=fast)
    assert done.returncode == 0, done.stderr[-3000:]
    log = run_log(run_dir)
    costs = [e for e in log if e.get("event") == "cost" and e.get("source") != "supervisor"]
    assert len(committed_ids(run_dir)) >= 3 and len(costs) >= 2, [e.get("event") for e in log]
    assert [e["every"] for e in log if e.get("event") == "schedule"][-1:] == ["auto"]


def test_a_failing_writer_on_one_rank_fails_the_snapshot_for_all_and_training_goes_on(tmp_path):
    """Rank 1's writer hangs (stopped) and its watchdog kills it: the global snapshot fails on
    every rank with one line naming the rank, no global manifest names its shards, training goes
    on, and the next snapshot commits."""
    import psutil

    progs, _, out, run_dir = _setup(tmp_path)
    run = Run("run", "--nproc-per-node", "2", "--dir", run_dir, "ddp.py", out, "20", cwd=progs,
              env={**STEP_SLEEP, "GPUSNAP_WRITER_TIMEOUT_S": "3"})
    with running(run):
        wait_for(lambda: least_progress(out, 2) >= 3, "step 3", proc=run, timeout=180)
        rank1 = psutil.Process(wait_for(lambda: rank_pids(run).get(1), "rank 1", proc=run))
        run.signal(signal.SIGUSR1)
        writer = wait_for(lambda: rank1.children(), "rank 1's writer", proc=run, timeout=60)[0]
        writer.suspend()
        failed = wait_for(lambda: [e for e in run_log(run_dir) if e["event"] == "failed" and e.get("rank") == 0],
                          "the global snapshot to fail", proc=run, timeout=120)[0]
        assert failed["message"].startswith(f"rank 1: the writer (pid {writer.pid}) made no progress for 3 s"), failed
        assert committed_ids(run_dir) == set()
        reached = least_progress(out, 2)
        wait_for(lambda: least_progress(out, 2) > reached + 3, "training to go on", proc=run)
        later = snapshot_at(run, run_dir, out, 2, reached + 4)
        code, _, err = stop(run)
    assert code == 75, err[-3000:]
    assert f"gpusnap: snapshot {failed['id']} failed: {failed['message']}" in err.splitlines()
    assert later > failed["id"]
    verified = gpusnap("verify", run_dir, cwd=progs)
    assert verified.returncode == 0, verified.stdout + verified.stderr


def test_restart_of_a_static_rendezvous_asks_for_this_nodes_options(tmp_path):
    """--node-rank differs per node: the recorded one (the first node's) must not be reused."""
    (tmp_path / "ok.py").write_text("print('ok')\n")
    port = str(random.randrange(20000, 30000))
    static = ["--nproc-per-node", "1", "--nnodes", "1", "--node-rank", "0", "--master-addr", "127.0.0.1", "--master-port", port]
    done = gpusnap("run", *static, "--dir", "run", "ok.py", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    refused = gpusnap("restart", "run", cwd=tmp_path)
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.splitlines()[0] == (
        f"gpusnap: {tmp_path / 'run'} was started with a static rendezvous (--node-rank), which differs per node")


@pytest.mark.more  # a global snapshot one rank fails: the failing writer above (CI's time)
def test_a_store_that_stops_answering_abandons_the_snapshot_and_training_goes_on(tmp_path):
    """The job's c10d store lives in torchrun's agent: stopped (SIGSTOP), it answers nothing.
    A snapshot asked meanwhile is abandoned after GPUSNAP_DIST_TIMEOUT_S with one line, the ranks
    train on (their collectives do not use the store); once it answers again, snapshots commit."""
    import psutil

    progs, _, out, run_dir = _setup(tmp_path)
    run = Run("run", "--nproc-per-node", "2", "--dir", run_dir, "ddp.py", out, "30", cwd=progs,
              env={**STEP_SLEEP, "GPUSNAP_DIST_TIMEOUT_S": "4"})
    with running(run):
        wait_for(lambda: least_progress(out, 2) >= 3, "step 3", proc=run, timeout=180)
        agent = psutil.Process(run.proc.pid).children()[0]
        agent.suspend()
        try:
            run.signal(signal.SIGUSR1)
            failed = wait_for(lambda: [e for e in run_log(run_dir) if e["event"] == "failed"], "the snapshot to be abandoned",
                              proc=run, timeout=120)[0]
            reached = least_progress(out, 2)
            wait_for(lambda: least_progress(out, 2) > reached + 5, "training to go on", proc=run)
        finally:
            agent.resume()
        assert failed["message"].startswith("abandoned: "), failed
        time.sleep(5)  # what the ranks posted meanwhile reaches the store, and their timeouts run out
        assert committed_ids(run_dir) == set()
        later = snapshot_at(run, run_dir, out, 2, least_progress(out, 2) + 2)
        code, _, err = stop(run)
    assert code == 75, err[-3000:]
    assert f"gpusnap: snapshot failed: {failed['message']}" in err.splitlines()  # no id: none was agreed
    assert later in committed_ids(run_dir)


def test_sharded_directory_ls_verify_gc_and_a_restart_with_another_world_size(tmp_path):
    """ls lists global snapshots; verify names the rank of damage; gc --keep removes old
    shards; a restart with another number of ranks refuses before starting anything."""
    progs, _, out, run_dir = _setup(tmp_path)
    run = Run("run", "--nproc-per-node", "2", "--dir", run_dir, "ddp.py", out, "20", cwd=progs, env=STEP_SLEEP)
    with running(run):
        first = snapshot_at(run, run_dir, out, 2, 3)
        # `gpusnap snap` finds this host's node through its own supervisor file
        assert (run_dir / f"supervisor-{socket.gethostname()}.json").exists()
        snapped = gpusnap("snap", run_dir, cwd=progs)
        assert snapped.returncode == 0 and "committed" in snapped.stderr, snapped.stderr
        second = max(committed_ids(run_dir))
        code, _, err = stop(run)
    assert code == 75, err[-3000:]
    listed = json.loads(gpusnap("ls", run_dir, "--json", cwd=progs).stdout)
    third = sorted(committed_ids(run_dir))[-1]
    assert [s["id"] for s in listed] == [first, second, third]
    shard = json.loads((run_dir / "ranks" / "1" / "snapshots" / f"{second}.json").read_text())
    assert listed[1]["bytes_total"] > shard["stats"]["bytes_total"]  # the sum over ranks
    # Time to durable: each rank's, and the job's (its slowest rank's), in the manifest and the log.
    top = json.loads((run_dir / "snapshots" / f"{second}.json").read_text())
    assert top["durable_s"] > 0 and top["durable_s"] == max(s["durable_s"] for s in top["shards"].values())
    log = [json.loads(line) for line in (run_dir / "log.jsonl").read_text().splitlines()]
    assert all(e["durable_s"] > 0 for e in log if e.get("event") == "committed" and e.get("ranks"))

    inspected = gpusnap("inspect", run_dir, second, "--rank", "1", cwd=progs)
    assert inspected.returncode == 0, inspected.stderr
    assert f"global snapshot {second} of 2 ranks" in inspected.stdout
    assert "globals[__main__].model" in inspected.stdout

    refused = gpusnap("restart", run_dir, "--nproc-per-node", "3", cwd=progs)
    assert refused.returncode == 6, refused.stderr
    assert refused.stderr.splitlines()[-2:] == [
        f"gpusnap: snapshot {third} was taken by 2 ranks and this job would have 3: "
        "gpusnap restores each rank from its own shard and does not reshard",
        "hint: restart with 2 ranks in all (--nnodes x --nproc-per-node), or start afresh with --resume never"]

    # Damage in rank 1's shard of the second snapshot: verify says so, restart falls back.
    packs = sorted((run_dir / "ranks" / "1" / "packs").rglob("*.pack"))
    for pack in packs:
        data = bytearray(pack.read_bytes())
        data[-100] ^= 0xFF
        pack.write_bytes(bytes(data))
    verified = gpusnap("verify", run_dir, cwd=progs)
    assert verified.returncode == 4, verified.stdout + verified.stderr
    assert "rank 1: " in verified.stdout

    gc = gpusnap("gc", run_dir, "--keep", "1", cwd=progs)
    assert gc.returncode == 0, gc.stderr
    assert sorted(committed_ids(run_dir)) == [third]
    for rank in ("0", "1"):
        assert sorted(p.stem for p in (run_dir / "ranks" / rank / "snapshots").glob("*.json")) == [third]

    # A global manifest that names no shard for a rank is damage, not an intact snapshot.
    manifest_path = run_dir / "snapshots" / f"{third}.json"
    manifest = json.loads(manifest_path.read_text())
    del manifest["shards"]["1"]
    manifest_path.write_text(json.dumps(manifest))
    verified = gpusnap("verify", run_dir, cwd=progs)
    assert verified.returncode == 4 and "the manifest names no shard for rank 1" in verified.stdout, verified.stdout


def test_forged_keys_in_the_jobs_store_steer_nothing(tmp_path):
    """Someone else's keys in the job's TCPStore, under this run's prefix and under the prefix a
    leftover store of another run would use: a plan whose id is a path out of the run directory,
    a shard reported committed at another iteration, a global snapshot reported committed that
    is not, a value too large to be one. A SIGTERM's global snapshot still commits, from shards
    of one iteration, nothing is written outside the run directory, and the run exits 75 only
    with that snapshot committed."""
    import psutil
    from torch.distributed import PrefixStore, TCPStore

    from gpusnap.capture.dist import check as distcheck

    progs, _, out, run_dir = _setup(tmp_path)
    run = Run("run", "--nproc-per-node", "2", "--dir", run_dir, "allreduce.py", out, "400", cwd=progs, env=STEP_SLEEP)
    with running(run):
        wait_for(lambda: least_progress(out, 2) >= 3, "step 3", proc=run, timeout=180)
        env = psutil.Process(wait_for(lambda: rank_pids(run).get(1), "rank 1", proc=run)).environ()
        nonce = json.loads((run_dir / "run.json").read_text())["nonce"]
        prefixes = [distcheck.key_prefix(nonce, env["TORCHELASTIC_RUN_ID"], env.get("TORCHELASTIC_RESTART_COUNT", "0")),
                    "gpusnap/0/"]  # the keys of gpusnap before they carried a nonce: any run's
        store = TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]), is_master=False)
        # A plan a rank would reach a few steps on: the program's step loop, by its LINE:COL.
        source = (progs / "allreduce.py").read_text().splitlines()
        line = next(n for n, text in enumerate(source, 1) if "for step in range(steps):" in text)
        loop = [str(progs / "allreduce.py"), "main", f"{line}:{source[line - 1].index('for')}"]
        soon = {"steps": 10 ** 9, "loops": [loop], "index": [least_progress(out, 2) + 8]}
        outside = "../../../../outside"  # from ranks/1/snapshots/: out of the run directory
        for prefix in prefixes:
            forged = PrefixStore(prefix, store)  # as the ranks name their keys
            for g in (1, 2, 3):
                forged.set(f"plan/{g}", json.dumps({"id": outside, "at": soon, "stop": True, "reason": "term"}))
                forged.set(f"done/{g}/1", json.dumps({"event": "committed", "id": "000001", "iteration": 99999}))
                forged.set(f"global/{g}", json.dumps({"event": "committed", "id": f"{g:06d}", "stop": True}))
                forged.set(f"pos/{g}/{g % 2}", b"[" * (2 << 20) if g < 3 else b"[" * 100_000)
        first = snapshot_at(run, run_dir, out, 2, least_progress(out, 2) + 2)
        code, _, err = stop(run)
    assert code == 75, err[-3000:]
    assert sorted(committed_ids(run_dir)) == [first, f"{int(first) + 1:06d}"]
    for committed in committed_ids(run_dir):
        manifest = json.loads((run_dir / "snapshots" / f"{committed}.json").read_text())
        assert {s["snapshot"] for s in manifest["shards"].values()} == {committed}
        iterations = {json.loads((run_dir / "ranks" / r / "snapshots" / f"{committed}.json").read_text())["iteration"]
                      for r in manifest["shards"]}
        assert iterations == {manifest["iteration"]}
    assert [p for p in tmp_path.rglob("outside*")] == []
    verified = gpusnap("verify", run_dir, cwd=progs)
    assert verified.returncode == 0, verified.stdout + verified.stderr


def test_ranks_lightning_starts_itself_are_named_and_no_snapshot_is_taken(tmp_path):
    """The same Lightning program under the plain `gpusnap run`: Lightning's launcher starts the
    other rank as a process of its own, which gpusnap does not run. With the launcher's module
    instrumented (for torchrun's ranks, above), a snapshot of rank 0 alone would be taken; the
    launch says so instead, and a request is skipped while that rank runs."""
    pytest.importorskip("lightning")
    progs, _, out, run_dir = _setup(tmp_path)
    run = Run("run", "--dir", run_dir, "lightning_ddp.py", out, "4", cwd=progs, env={**STEP_SLEEP, "TEST_STEP_SLEEP_S": "0.1"})
    with running(run):
        wait_for(lambda: least_progress(out, 2) >= 3, "step 3 on both ranks", proc=run, timeout=180)
        run.signal(signal.SIGUSR1)
        code, _, err = run.wait(timeout=180)
    assert code == 0, err[-3000:]
    said = [line for line in err.splitlines() if line.startswith("gpusnap: Lightning started this job's other ranks")]
    assert len(said) == 1 and "launch the job with `gpusnap run --nproc-per-node 2`" in said[0], err[-3000:]
    assert "(Lightning's subprocess launcher) is running, and a snapshot cannot hold its work" in err, err[-3000:]
    assert not committed_ids(run_dir)
