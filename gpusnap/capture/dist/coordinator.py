"""Global snapshots of a torchrun job: every rank snapshots at one agreed iteration, and the
snapshot exists once every rank's shard has committed (docs/distributed.md).

Each rank is an ordinary trainee writing its own shard (``store.shards``: ``DIR/ranks/<rank>``).
The ranks coordinate through the job's own c10d store (the TCPStore that torchrun's agent hosts
at MASTER_ADDR:MASTER_PORT), under the prefix ``gpusnap/<nonce>/<restart count>/`` (the nonce: of
the run directory and torchrun's run id), one generation ``g`` of keys per global snapshot::

    wake/g/<rank>  someone asked: a rank with a request (signal, timer, `gpusnap snap`, SIGTERM
                   through its supervisor, gpusnap.snapshot()) sets it for every rank at its next
                   safe point (one key per rank: each rank's watcher waits for its own, and sets
                   it itself to stop waiting once the generation is over without it)
    pos/g/<rank>   where the rank stood at its first safe point after the request: optimizer
                   steps, the loops on its path, its stop flag and reason, its next shard id
    plan/g         rank 0, once every position is in: the target position (DIST_MARGIN steps,
                   or DIST_LEAD_S of the fastest rank's steps, whichever is more,
                   past the furthest rank), the global snapshot id, stop, reason
    done/g/<rank>  the rank's shard: committed (with its report) or failed (with why)
    global/g       rank 0: the global manifest is committed, or why not

Every value read from the store is checked before use (``distcheck``): a forged or stale plan,
shard outcome or global outcome is waited past, never believed.

No rank ever waits for another at a loop boundary: it posts where it stands and trains on (a
rank blocked at a boundary while another needs it for DDP's all-reduce would deadlock), then
snapshots at its first safe point at or past the target. A rank that learns the target only
after passing it (where ranks do not meet in a collective every step, or where its store thread
waited longer than the target's lead) fails that snapshot for everyone, loudly; it never takes
a shard at another iteration than the others.

Threads, so that the main thread never talks to the store: the *poster* sends what the main
thread posts (a queue), the *watcher* waits for this rank's ``wake`` key, the *runner* moves a
generation on once this rank knows it was asked for (from the watcher, or from its own post:
the store may not answer). Each has its own client connection (a TCPStore client is not safe to
share between threads, and one whose wait timed out is discarded: its stale reply would answer
the next call). At rest, the watcher asks whether its ``wake`` key is set five times a second:
that is all the store hears while no snapshot is pending, whatever the step rate.
"""

from __future__ import annotations

import atexit
import datetime
import json
import os
import queue
import sys
import threading
import time

from gpusnap import knobs, lifeline
from gpusnap.capture.dist import check as distcheck
from gpusnap.capture.dist import plan as planning
from gpusnap.capture.safepoints import steploop
from gpusnap.capture.trainee import control, session
from gpusnap.errors import EXIT_PREEMPTED_UNSAVED, GpusnapError, RestoreError, RunDirError
from gpusnap.instrument import loops
from gpusnap.onimport import after_import
from gpusnap.store import shards
from gpusnap.store.info import snapshot_id

coordinator: "Coordinator | None" = None
_FOREVER = datetime.timedelta(days=3650)
_POLL_S = 0.002  # how often a rank asks the store while a snapshot is being agreed and written
_WATCH_POLL_S = 0.2  # how often it asks whether a peer wants one: the only traffic at rest
_REFUSED_POLL_S = 0.05  # how often while the store holds a value that is refused (forged, stale)


def install(config: dict):
    """From the agent's install, in a rank of a `gpusnap run --nproc-per-node` job: open this
    rank's shard (locked for the run), map a global snapshot to resume from onto the shard's,
    and start coordinating once the program has imported torch. Returns the shard RunDir."""
    global coordinator
    from gpusnap.store import RunDir

    try:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    except (KeyError, ValueError) as exc:
        _refuse(f"a rank of a distributed run needs RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT from torchrun ({exc})",
                "start it with `gpusnap run --nproc-per-node N ...`, which runs torchrun", 2)
    # Die with torchrun's agent, as the agent dies with the supervisor (gpusnap/lifeline.py): a
    # rank orphaned by a kill -9 of its node's supervisor would train on, holding its shard.
    lifeline.arm()
    lifeline.die_with_parent(os.getppid())
    try:
        top = RunDir.open(config["run_dir"], trusted=True)
        shard = shards.open_shard(top, rank, create=True)
        lock = shard.lock("run")
    except RunDirError as exc:
        _refuse(exc.message, exc.hint, exc.exit_code)
    resume = (config.get("resume") or {}).get("snapshot")
    if resume is not None:
        try:
            manifest = top.load_manifest(resume)
        except GpusnapError as exc:
            _refuse(exc.message, exc.hint, exc.exit_code)
        saved = manifest.get("world_size")
        if saved != world:
            _refuse(f"snapshot {resume} was taken by {saved} ranks and this job has {world}: gpusnap restores each "
                    "rank from its own shard and does not reshard",
                    f"restart with {saved} ranks in all (--nnodes x --nproc-per-node), or start afresh with --resume never",
                    RestoreError.exit_code)
        own = shards.shards_of(manifest).get(rank)
        if own is None:
            _refuse(f"snapshot {resume} holds no shard for rank {rank}", "see `gpusnap verify DIR`; restart from "
                    "another snapshot with --snapshot ID", RestoreError.exit_code)
        config["resume"] = {"snapshot": own}
    coordinator = Coordinator(rank, world, top, shard, addr, port, lock)
    coordinator.resume = resume
    after_import("torch", lambda _module: coordinator.start())
    return shard


def _refuse(message: str, hint: str, code: int) -> None:
    print(f"gpusnap: rank {os.environ.get('RANK', '?')}: {message}\nhint: {hint}", file=sys.stderr, flush=True)
    os._exit(code)


def position(loop) -> dict:
    """Where this rank stands at a safe point: its optimizer steps, the loops on its path (for
    programs without torch.optim, whose step count stays 0), and its recent seconds per
    iteration (None before it has a measure), which set how far ahead the target lies; for a
    program without steps, each loop's seconds per iteration so far (``paces``)."""
    path, paces, lengths = [], [], []
    now = time.perf_counter()
    for active in loops.ACTIVE:
        code = active.frame.f_code
        path.append([code.co_filename, code.co_qualname, active.loop_id, active.index])
        paces.append((now - active.started_s) / active.index if active.index else None)
        lengths.append(steploop.last_length(active))
        if active is loop:
            break
    from gpusnap.capture.trainee import costs

    return {"steps": session.steps, "path": path, "step_s": costs.step_s(), "paces": paces, "lengths": lengths}


class Coordinator:
    def __init__(self, rank: int, world: int, top, shard, addr: str, port: int, lock):
        self.rank, self.world = rank, world
        self.top, self.shard, self.lock_held = top, shard, lock
        self.addr, self.port = addr, port
        # This run's keys: a store another run left at the same address names none of them.
        self.prefix = distcheck.key_prefix(top.nonce, os.environ.get("TORCHELASTIC_RUN_ID", ""),
                                           os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        self.gen = 1  # the global snapshot being agreed or written; one generation of keys each
        self.requested = 0  # the last generation this rank knows was asked for
        self.posted = 0  # the last generation this rank posted its position for
        self.taken = 0  # the last generation this rank took (or gave up) its shard for
        self.abandoned = 0  # the last generation the waiter gave up on
        self.plan: dict | None = None  # rank 0's plan for self.gen, once known
        self.plan_gen = 0
        self.previous = None  # position at the safe point before this one, since posting
        self.mine: list[tuple[str, bool]] = []  # this rank's requests folded into its post
        self.shard_results: dict[int, dict] = {}
        self.global_results: dict[int, dict] = {}
        self.cond = threading.Condition()
        self.outbox: queue.Queue = queue.Queue()
        self.wake = threading.Event()  # the runner has a generation to run
        self.closing = threading.Event()  # the program is exiting: the threads end, and their clients
        self.threads: list[threading.Thread] = []
        self.started = False
        self.resume: str | None = None  # the global snapshot this rank resumes from

    # -- store clients (threads only) ------------------------------------------------------
    def _client(self, timeout_s: float):
        from torch.distributed import PrefixStore, TCPStore

        timeout = datetime.timedelta(seconds=timeout_s) if timeout_s else _FOREVER
        return PrefixStore(self.prefix, TCPStore(self.addr, self.port, is_master=False, timeout=timeout))

    def _connect(self):
        return _within(knobs.DIST_TIMEOUT_S, self._client, knobs.DIST_TIMEOUT_S)

    def start(self) -> None:
        if self.started:
            return
        self.started = True
        # Every rank says which global snapshot it resumes from; a rank that resumes compares
        # them all before it merges (agree_resume).
        self.outbox.put((f"resume/{self.rank}", self.resume or "none"))
        for target, name in ((self._post_forever, "post"), (self._watch_forever, "watch"), (self._run_forever, "run")):
            thread = threading.Thread(target=target, name=f"gpusnap-dist-{name}", daemon=True)
            thread.start()
            self.threads.append(thread)
        atexit.register(self.shutdown)

    def agree_resume(self) -> None:
        """Before the replay merges: every rank of the job resumes from the same global
        snapshot. Each node's supervisor chooses it on its own (the newest intact one it sees,
        or what its command line named), and ranks merged from different ones would train on
        as one job with mixed state."""
        try:
            said = _wait_get(self._connect(), [f"resume/{r}" for r in range(self.world)], knobs.DIST_TIMEOUT_S,
                             lambda key, value: distcheck.resume(value))
        except Exception as exc:  # noqa: BLE001 - a refusal either way: the agreement is not known
            raise RestoreError(f"the other ranks did not say which snapshot they resume from ({exc})",
                               "start every node of the job; GPUSNAP_DIST_TIMEOUT_S sets how long ranks wait") from None
        if any(value != said[self.rank] for value in said):
            which = ", ".join(f"rank {r}: {'the beginning' if v == 'none' else 'snapshot ' + v}" for r, v in enumerate(said))
            raise RestoreError(f"the ranks of this job resume from different snapshots ({which})",
                               "start every node with the same command (the same --resume), or `gpusnap restart DIR "
                               "--snapshot ID` on every node")

    def shutdown(self) -> None:
        """At exit, before the interpreter finalizes: end the threads and drop their store
        clients. A daemon thread that is inside a store call, or a client torn down with the
        interpreter, when finalization comes aborts the process ("terminate called without an
        active exception"), and the rank would exit -6 after a run that went well."""
        with self.cond:  # a shard in flight: its global snapshot may still commit (as a writer is waited for)
            g, deadline = self.gen, time.monotonic() + knobs.DIST_TIMEOUT_S
            while self.taken >= g and g not in self.global_results and time.monotonic() < deadline:
                self.cond.wait(0.1)
        self.closing.set()
        self.wake.set()
        self.outbox.put((None, None))
        with self.cond:
            self.cond.notify_all()
        deadline = time.monotonic() + 2.0
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        with self.cond:  # nothing waits for a generation that will not end now
            if g not in self.global_results:
                self.global_results[g] = {"event": "failed", "message": "the program exited before the snapshot was committed"}
            self.cond.notify_all()

    def _first_client(self):
        """Each thread connects as it starts, while the store surely answers (the job has just
        rendezvoused): a set on a connected client never blocks, a new connection may."""
        try:
            return self._connect()
        except Exception:  # noqa: BLE001 - the thread connects again when it needs to
            return None

    def _post_forever(self) -> None:
        client = self._first_client()
        while not self.closing.is_set():
            key, value = self.outbox.get()
            if key is None:
                break
            try:
                if client is None:
                    client = self._connect()
                for one in [key] if isinstance(key, str) else key:
                    client.set(one, json.dumps(value))
            except Exception as exc:  # noqa: BLE001 - the waiter times out and says so
                client = None
                print(f"gpusnap: rank {self.rank}: the job's c10d store did not take {key}: {exc}", file=sys.stderr, flush=True)

    # -- the main thread, at loop boundaries while a snapshot is pending --------------------
    def wants_boundary(self) -> bool:
        """Must boundaries come here, the program's requests aside: a generation asked for and
        not taken, or requests taken and not yet posted?"""
        g = self.gen
        return bool(self.mine) or self.requested >= g > self.taken

    def on_boundary(self, loop) -> None:
        if loops.replaying is not None:
            return  # nothing to post until the replay has merged its snapshot
        g = self.gen
        try:
            if self.posted < g:
                self._maybe_post(loop, g)
            elif self.taken < g:
                self._maybe_take(loop, g)
        finally:
            loops.pending = bool(control.requests) or (self.requested >= g > self.taken)

    def _maybe_post(self, loop, g: int) -> None:
        requests = control.requests
        if requests:
            taken = list(requests)
            del requests[: len(taken)]
            # One timer runs per node: rank 0's alone decides, or each node would add its own.
            self.mine += [(reason, stop) for reason, stop in taken if reason != "timer" or self.rank == 0]
        if self.requested < g and not self.mine:
            return
        if not steploop.is_safe_point(loop):
            return
        pos = position(loop)
        stop = any(s for _, s in self.mine)
        reason = "term" if stop else self.mine[0][0] if self.mine else "peer"
        if self.requested < g:
            self.outbox.put(([f"wake/{g}/{r}" for r in range(self.world) if r != self.rank], {"rank": self.rank}))
        self.outbox.put((f"pos/{g}/{self.rank}", {**pos, "stop": stop, "reason": reason,
                                                    "next": self.shard.next_snapshot_id()}))
        self.mine = []
        self.posted, self.previous = g, pos
        self._asked(g)

    def _maybe_take(self, loop, g: int) -> None:
        plan = self.plan if self.plan_gen == g else None
        if not steploop.is_safe_point(loop):
            return
        pos, previous = position(loop), self.previous
        self.previous = pos
        if plan is not None and planning.left_before(previous, pos, plan["at"]):
            with self.cond:
                if self.abandoned >= g:
                    return
                self.taken = g
            self.shard_failed(f"rank {self.rank} left the loop of the agreed iteration before reaching it (its ranks do "
                              "not meet in a collective every iteration); no snapshot was taken")
            return
        if plan is None or not planning.reached(pos, plan["at"]):
            return
        with self.cond:
            if self.abandoned >= g:
                return
            self.taken = g
        if planning.reached(previous, plan["at"]):
            self.shard_failed(f"rank {self.rank} learned the agreed iteration only after passing it (its ranks do not "
                              "meet in a collective every step, or the machine kept its store thread waiting longer than "
                              "GPUSNAP_DIST_LEAD_S); no snapshot was taken")
            return
        from gpusnap.capture.trainee import agent

        agent.take(loop, snap_id=plan["id"], reason=plan["reason"], stop=plan["stop"])

    # -- results ---------------------------------------------------------------------------
    def shard_failed(self, message: str) -> None:
        """From the main thread: this rank has no shard for the current generation (skipped, the
        fork failed, it passed the target). The global snapshot fails and training goes on; a
        stop request still stops every rank."""
        g = self.gen
        self._record_shard(g, {"event": "failed", "message": message})
        if (self.plan or {}).get("stop"):
            self.stop_after()

    def shard_finished(self, result: dict) -> dict:
        """From the writer's waiter thread: this rank's shard is written (committed or not).
        Returns the global outcome, once known (the coordinator has reported it)."""
        g = self.gen
        self._record_shard(g, result)
        with self.cond:
            while g not in self.global_results:
                self.cond.wait()
            return self.global_results[g]

    def _record_shard(self, g: int, result: dict) -> None:
        with self.cond:
            self.shard_results[g] = result
            self.cond.notify_all()

    def stop_after(self) -> None:
        """A stop snapshot: wait for its global outcome, then leave (the waiter may be first)."""
        g = self.gen
        with self.cond:
            while g not in self.global_results:
                self.cond.wait()
            result = self.global_results[g]
        _exit(result)

    # -- the watcher and runner threads ------------------------------------------------------
    def _asked(self, g: int) -> None:
        """Generation ``g`` was asked for (by a peer, or by this rank's own post)."""
        with self.cond:
            if self.gen != g or self.requested >= g:
                return
            self.requested = g
        loops.pending = True
        self.wake.set()

    def _watch_forever(self) -> None:
        client = self._first_client()
        while not self.closing.is_set():
            g = self.gen
            try:
                if client is None:
                    client = self._connect()
                _poll(client, [f"wake/{g}/{self.rank}"], _WATCH_POLL_S, None, self.closing)  # set is enough: never read
            except Exception:  # noqa: BLE001 - the store went away: the job is ending, or it comes back
                client = None
                time.sleep(1.0)
                continue
            self._asked(g)
            with self.cond:
                while self.gen == g and not self.closing.is_set():
                    self.cond.wait()

    def _run_forever(self) -> None:
        client, ran = self._first_client(), 0
        while not self.closing.is_set():
            self.wake.wait()
            self.wake.clear()
            while self.requested >= self.gen > ran and not self.closing.is_set():
                ran = self.gen
                if client is None:
                    try:
                        client = self._connect()
                    except Exception:  # noqa: BLE001 - _generation says so
                        client = None
                client = self._generation(client, ran)

    def _generation(self, client, g: int):
        """One global snapshot, from its request to its outcome. Returns the client to go on
        with (a new one after a timeout)."""
        plan = None
        try:
            if client is None:
                raise ConnectionError("no connection to the job's c10d store")
            if self.rank == 0:
                posts = _wait_get(client, [f"pos/{g}/{r}" for r in range(self.world)], knobs.DIST_TIMEOUT_S,
                                  lambda key, value: distcheck.post(value))
                plan = self._plan(posts)
                client.set(f"plan/{g}", json.dumps(plan))
            else:
                plan = _wait_get(client, [f"plan/{g}"], knobs.DIST_TIMEOUT_S, lambda key, value: distcheck.plan(value))[0]
        except Exception as exc:  # noqa: BLE001 - a timeout, or a store that went away
            client = None
            outcome = {"event": "failed", "message": f"abandoned: the ranks did not agree on an iteration within "
                                                      f"{knobs.DIST_TIMEOUT_S:g} s ({_short(exc)})"}
        else:
            outcome = None
            with self.cond:
                self.plan, self.plan_gen = plan, g
        shard = outcome if outcome is not None else self._await_shard(g)
        if outcome is None:
            outcome, client = self._settle(client, g, plan, shard)
        else:
            with self.cond:
                self.abandoned = max(self.abandoned, g)
            self.outbox.put((f"done/{g}/{self.rank}", outcome))  # rank 0 need not wait it out
        self._close(g, plan, outcome)
        return client

    def _plan(self, posts: list[dict]) -> dict:
        at = planning.target(posts, planning.margin(posts, knobs.DIST_MARGIN, knobs.DIST_LEAD_S), knobs.DIST_LEAD_S)
        stop = any(p.get("stop") for p in posts)
        requested = [p.get("reason") for p in posts if p.get("reason") not in (None, "peer")]
        top_ids = [int(s) for s in self.top.snapshot_ids()]
        next_id = max([int(p.get("next") or 1) for p in posts] + [max(top_ids) + 1 if top_ids else 1])
        plan = {"id": snapshot_id(next_id), "stop": stop,
                "reason": "term" if stop else requested[0] if requested else "request"}
        return {**plan, "at": at}

    def _await_shard(self, g: int) -> dict:
        """This rank's shard result: the main thread must reach the target within the timeout
        (then the write may take as long as it takes: the writer has its own watchdog)."""
        deadline = time.monotonic() + knobs.DIST_TIMEOUT_S
        with self.cond:
            while g not in self.shard_results:
                left = deadline - time.monotonic()
                if self.taken < g and left <= 0:
                    self.abandoned = g
                    return {"event": "failed", "message": f"rank {self.rank} did not reach the agreed iteration within "
                                                          f"{knobs.DIST_TIMEOUT_S:g} s"}
                self.cond.wait(timeout=max(left, 0.05) if self.taken < g else None)
            return self.shard_results[g]

    def _settle(self, client, g: int, plan: dict, shard: dict):
        """Post this rank's shard; rank 0 commits the global manifest when every shard is in."""
        try:
            client.set(f"done/{g}/{self.rank}", json.dumps(shard, default=str))
            if self.rank == 0:
                dones = _wait_get(client, [f"done/{g}/{r}" for r in range(self.world)], knobs.DIST_TIMEOUT_S,
                                  lambda key, value: distcheck.done(value, plan, self._shard_manifest(int(key.rsplit("/", 1)[1]))))
                outcome = self._commit(plan, [distcheck.outcome_fields(d) for d in dones])
                client.set(f"global/{g}", json.dumps(outcome, default=str))
            else:
                # Rank 0 waits up to the timeout for the last shard, then commits.
                outcome = distcheck.outcome_fields(_wait_get(
                    client, [f"global/{g}"], knobs.DIST_TIMEOUT_S * 2 + 10,
                    lambda key, value: distcheck.outcome(value, plan, _manifest_of(self.top), self.rank))[0])
        except Exception as exc:  # noqa: BLE001 - a timeout, or a store that went away
            return {"event": "failed", "message": f"abandoned: no word from every rank within {knobs.DIST_TIMEOUT_S:g} s "
                                                  f"({_short(exc)})"}, None
        return outcome, client

    def _shard_manifest(self, rank: int):
        """``shard_manifest(id)`` for ``distcheck.done``: rank ``rank``'s committed shard manifest."""
        try:
            return _manifest_of(shards.open_shard(self.top, rank))
        except GpusnapError:
            return lambda snap_id: None

    def _commit(self, plan: dict, dones: list[dict]) -> dict:
        failed = [(r, d) for r, d in enumerate(dones) if d.get("event") != "committed"]
        if failed:
            r, d = failed[0]
            more = f" (and {len(failed) - 1} more ranks)" if len(failed) > 1 else ""
            return {"event": "failed", "message": f"rank {r}: {d.get('message', 'no reason given')}{more}"}
        other = [(r, d) for r, d in enumerate(dones) if d.get("iteration") != dones[0].get("iteration")]
        if other:  # one global snapshot, one iteration: never shards of different points as one
            r, d = other[0]
            return {"event": "failed", "message": f"rank {r}'s shard is of iteration {d.get('iteration')}, rank 0's of "
                                                  f"{dones[0].get('iteration')}: no global snapshot was committed"}
        shard_reports = {r: {**d, "snapshot": d["id"]} for r, d in enumerate(dones)}
        fields = {"iteration": dones[0].get("iteration"), "reason": plan["reason"], "resumed_from": session.resumed_from}
        try:
            info = shards.commit_global(self.top, plan["id"], self.world, shard_reports, fields)
        except Exception as exc:  # noqa: BLE001 - the shards stay orphans; training goes on
            return {"event": "failed", "message": f"the global manifest could not be committed: {_short(exc)}"}
        outcome = {"event": "committed", "id": info.id, "iteration": info.iteration, "stall_s": info.stall_s,
                   "write_s": max(float(d.get("write_s") or 0) for d in dones), "durable_s": info.durable_s,
                   "bytes_written": info.bytes_written,
                   "bytes_total": info.bytes_total, "ranks": self.world}
        keep = session.config.get("keep")
        if keep:
            try:
                self.top.prune(keep)
            except Exception as exc:  # noqa: BLE001 - a commit is a commit
                outcome.update(warning=f"retention (--keep {keep}) failed after the commit: {_short(exc)}",
                               hint="run `gpusnap gc DIR --keep N` once the cause is fixed")
        return outcome

    def _close(self, g: int, plan: dict | None, outcome: dict) -> None:
        outcome = {**outcome, "id": outcome.get("id") or (plan or {}).get("id")}
        if plan is not None and plan.get("stop"):
            outcome["stop"] = True
        if outcome.get("event") == "committed":
            try:
                shards.prune_shard(self.top, self.shard)  # beyond --keep, and orphans of failed ones
            except Exception as exc:  # noqa: BLE001 - a commit is a commit
                outcome.setdefault("warning", f"removing rank {self.rank}'s old shards failed: {_short(exc)}")
                outcome.setdefault("hint", "`gpusnap gc DIR` removes them")
        elif not control.connected():
            print(f"gpusnap: snapshot {outcome.get('id') or ''} failed: {outcome.get('message')}", file=sys.stderr, flush=True)
        session.last_result = outcome
        control.emit(**outcome)
        with self.cond:
            self.global_results[g] = outcome
            self.plan = None
            self.gen = g + 1
            self.cond.notify_all()
        loops.pending = True  # requests that came meanwhile are served by the next generation
        self.outbox.put((f"wake/{g}/{self.rank}", {"closed": True}))  # the watcher may still wait for it
        if outcome.get("stop"):
            _exit(outcome)


def _poll(client, keys: list[str], every_s: float, deadline: float | None, closing=None, check=None) -> list | None:
    """The keys' values once all are set and ``check(key, value)`` (``distcheck``) refuses none
    (None when ``check`` is None: only that they are set). Polled with ``check``, not waited for
    with ``wait``: a thread blocked inside a store call when the interpreter finalizes (a program
    that ends while a snapshot is being agreed) aborts the process as it returns (pthread_exit
    through C++), so the threads stay in short calls and sleeps. A refused value is waited past:
    the rank that owns the key replaces it. While one is refused the polls slow down, to
    _REFUSED_POLL_S: each reads every value again, and a forged one may be megabytes (read 500
    times a second, it kept the cores from the ranks that would replace it)."""
    refused = None
    while deadline is None or time.monotonic() < deadline:
        if closing is not None and closing.is_set():
            raise TimeoutError("the program is exiting")
        if client.check(keys):
            if check is None:
                return None
            values, refused = [], None
            for key, raw in zip(keys, client.multi_get(keys)):
                try:
                    value = distcheck.parse(raw)
                    why = check(key, value)
                except ValueError as exc:
                    why = f"no JSON ({exc})"
                if why is not None:
                    refused = f"{key}: {why}"
                    break
                values.append(value)
            else:
                return values
        time.sleep(every_s if refused is None else max(every_s, _REFUSED_POLL_S))
    raise TimeoutError("timed out" + (f"; refused what the store held: {refused}" if refused else ""))


def _wait_get(client, keys: list[str], timeout_s: float, check) -> list:
    deadline = time.monotonic() + timeout_s
    return _within(timeout_s, _poll, client, keys, _POLL_S, deadline, coordinator.closing if coordinator else None, check)


def _within(timeout_s: float, call, *args):
    """``call(*args)``, or TimeoutError after ``timeout_s``. A TCPStore client blocks in recv,
    whatever its timeout, on a store that holds the connection but does not answer (a stopped
    agent), and its constructor too: the call runs in a thread of its own, which is left behind
    (with its connection, never used again) when it does not return in time."""
    done: dict = {}

    def run():
        try:
            done["value"] = call(*args)
        except BaseException as exc:  # noqa: BLE001 - raised in the caller's thread
            done["error"] = exc

    thread = threading.Thread(target=run, name="gpusnap-dist-call", daemon=True)
    thread.start()
    thread.join(timeout_s or None)
    if "error" in done:
        raise done["error"]
    if "value" not in done:
        raise TimeoutError(f"the job's c10d store did not answer within {timeout_s:g} s")
    return done["value"]


def _manifest_of(rd):
    """``manifest(id)``: ``rd``'s committed manifest ``id``, or None when there is none (for
    ``distcheck``: what the store says is committed must be on disk)."""

    def manifest(snap_id):
        try:
            return rd.load_manifest(snap_id)
        except GpusnapError:
            return None

    return manifest


def _exit(outcome: dict) -> None:
    """A stop snapshot's end on every rank: 0 once committed (torchrun then ends quietly, and
    each node's supervisor exits 75 on the committed event), 76 otherwise."""
    from gpusnap.capture.writer.fork import exit_now

    exit_now(0 if outcome.get("event") == "committed" else EXIT_PREEMPTED_UNSAVED)


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"
