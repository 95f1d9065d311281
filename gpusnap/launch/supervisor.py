"""The supervisor: the ``gpusnap run`` process, parent of the trainee.

Process model::

    gpusnap run / restart        supervisor (this module; never imports torch, stays responsive)
      └─ python -m gpusnap.boot SCRIPT ARGS...    the trainee, same cwd, stdio and process group
           └─ writer                              fork of the trainee, one per snapshot

The trainee dies with the supervisor, even one killed with SIGKILL, and a writer with its
trainee (``gpusnap.lifeline``): nothing goes on running without the run directory's lock.

The supervisor owns the schedule (signals, ``--every`` timer, ``--every auto`` from the costs
the trainee measures: ``launch.schedule``, ``gpusnap snap`` requests), the
run log (``DIR/log.jsonl``) and the exit status. It starts the trainee with ``GPUSNAP_BOOT``
set to a JSON object::

    {"run_dir": "/abs/DIR", "control": "/tmp/gpusnap-XXXX/control.sock",
     "signal": "SIGUSR1", "on_term": "snapshot" | "exit", "keep": 3 | null,
     "at": "/abs/FILE:LINE" | null, "instrument": ["/abs/path", "pkg.mod", ...],
     "resume": null | {"snapshot": "000003"}, "force": false,
     "verify_replay": true,         (only for `gpusnap verify --replay`: stop once the witness is compared)
     "lock_token": "9f3a..." | null,  (the token in DIR/lock: writers check it before a commit)
     "files": {"exclude": [GLOB, ...], "max_bytes": N | null, "after": "/abs/DIR/after-000003" | null},
     "dist": true}                  (only in the ranks of a torchrun job: capture/dist/coordinator.py)

A trainee started by the supervisor (not a torchrun agent) starts with the snapshot signal and
SIGTERM blocked, and unblocks them once its handlers are in place: a signal sent to it while
it boots (``scancel --signal``, a user's ``kill``) waits for them instead of killing it.

Control protocol: newline-delimited JSON objects over a unix socket, one message kind per
TypedDict, each message checked where it is read (``gpusnap.protocol``, which lists them all); a
malformed one is refused with one line in ``DIR/log.jsonl``, and the run goes on.

Every event is printed on stderr as one ``gpusnap: ...`` line and appended to ``DIR/log.jsonl``
with a ``"t"`` (unix time) field.

Exit status: the trainee's (killed by signal N: 128 + N). After SIGTERM with ``--on-term
snapshot``: 75 (``EXIT_PREEMPTED``) when a snapshot was committed, 76
(``EXIT_PREEMPTED_UNSAVED``) when none was within ``--grace`` and the trainee's process tree was
killed.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

import psutil

from gpusnap import knobs, lifeline, protocol
from gpusnap.console import Console
from gpusnap.errors import EXIT_PREEMPTED, EXIT_PREEMPTED_UNSAVED, StoreError
from gpusnap.launch.control import Connection, ControlServer
from gpusnap.launch.events import describe, progress_line, schedule_line, warning
from gpusnap.launch.notices import Watcher
from gpusnap.launch.options import format_duration
from gpusnap.launch.runfiles import RunLog, announce, live_supervisor, supervisor_file, withdraw
from gpusnap.launch.schedule import Schedule

TERMINAL_EVENTS = ("committed", "failed", "skipped")
# After the trainee exits, events still in flight (its last commit) are read for this long.
_DRAIN_S = 1.0


def _trainee_command(kind: str, target: str, args: list[str]) -> list[str]:
    """The trainee's argv. Module-level so tests can swap in a fake trainee."""
    boot = [sys.executable, "-m", "gpusnap.boot"]
    if kind == "module":
        return [*boot, "-m", target, *args]
    return [*boot, target, *args]


def string_hash_seed(nonce: str) -> str:
    """The PYTHONHASHSEED a run directory's program runs with, unless its environment sets one:
    the same for the run and every restart of it (derived from the directory's nonce). Python
    seeds its hash of a str at random in each process, so a program whose steps follow that hash
    (the hashing trick, ``hash(token) % buckets``; the order of a set of strings) restarted
    with another seed than its run's, and its witness refused the restart."""
    import xxhash

    return str(int(xxhash.xxh3_64_hexdigest(f"PYTHONHASHSEED:{nonce}".encode()), 16) % 4294967295 + 1)


@dataclass
class Launch:
    """Everything the supervisor needs, validated by the CLI."""

    kind: str  # "script" | "module"
    target: str  # script as the program will see it in sys.argv[0], or the module name
    args: list[str]
    cwd: str
    run_dir: str  # absolute
    signal: signal.Signals = signal.SIGUSR1
    on_term: str = "snapshot"
    grace_s: float = knobs.DEFAULT_GRACE_S
    every_s: float | None = None
    overhead: float | None = None  # --every auto's budget (a fraction); None: no auto timer
    keep: int | None = None
    at: str | None = None
    instrument: list[str] = field(default_factory=list)
    resume: str | None = None  # snapshot id
    force: bool = False
    notices: str = "off"  # "off", "auto" or a provider of notices.PROVIDERS
    paranoid: bool = False  # copy every chunk of device memory, fingerprints notwithstanding
    verbosity: int = 1  # 0 --quiet: problems and stops only; 1: every snapshot; 2 --verbose: requests too
    torchrun: list[str] | None = None  # a distributed run: torchrun's arguments (launch.torchrun)
    verify_replay: bool = False  # `gpusnap verify --replay`: stop once the restart is compared with its witness
    lock_token: str | None = None  # the run directory's lock, held by the CLI: its writers check it before they commit
    files_exclude: list[str] = field(default_factory=list)  # --files-exclude, after files.DEFAULT_EXCLUDES
    files_max: int | None = None  # --files-max (None: knobs.FILES_MAX_BYTES)
    files_after: str | None = None  # a restart: where files newer than the snapshot were moved
    files_by_host: bool = False  # a distributed restart whose node put back the files recorded on its host
    store: str | None = None  # the shared level's URL (--dir s3://...): run_dir is its local level
    hash_seed: str | None = None  # the trainee's PYTHONHASHSEED where the environment sets none (``string_hash_seed``)

    def boot_config(self, control_path: str) -> dict:
        return {
            "run_dir": self.run_dir,
            "control": control_path,
            "signal": self.signal.name,
            "on_term": self.on_term,
            "keep": self.keep,
            "at": self.at,
            "instrument": list(self.instrument),
            "resume": {"snapshot": self.resume} if self.resume else None,
            "force": self.force,
            "verbosity": self.verbosity,
            "paranoid": self.paranoid,
            "lock_token": self.lock_token,
            "files": {"exclude": list(self.files_exclude), "max_bytes": self.files_max, "after": self.files_after,
                      **({"by_host": True} if self.files_by_host else {})},
            **({"dist": True} if self.torchrun is not None else {}),  # a rank of a torchrun job
            **({"verify_replay": True} if self.verify_replay else {}),
        }


@dataclass
class _Waiter:
    conn: Connection
    state: str = "pending"  # pending -> (deferred ->) bound
    snapshot_id: str | None = None


def exit_status(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def _tty_foreground() -> bool:
    """True when our process group is a terminal's foreground group: a Ctrl-C (SIGINT) or a
    hangup (SIGHUP) from it reached the trainee too, so forwarding would deliver it twice."""
    for fd in (0, 1, 2):
        try:
            if os.isatty(fd):
                return os.tcgetpgrp(fd) == os.getpgrp()
        except OSError:
            continue
    return False


class Supervisor:
    def __init__(self, launch: Launch, err=None):
        self.launch = launch
        self.err = err or sys.stderr
        self.server: ControlServer | None = None
        self.child: subprocess.Popen | None = None
        self.conns: list[Connection] = []
        self.trainee: Connection | None = None
        self.queue: list[dict] = []  # requests made before the trainee said hello
        self.waiters: list[_Waiter] = []
        self.signals: list[int] = []
        self.notices: list = []  # notices.Notice, or a message when none can be watched
        self.stop_by_notice = False
        self.term_deadline: float | None = None
        self.committed_after_term = False
        self.last_iteration = None
        self.killed = False
        self.schedule = Schedule(launch.every_s, launch.overhead, time.monotonic())
        self.console = Console(self.err, launch.verbosity, status=launch.verbosity >= 1)
        self.last_total = None  # bytes of the last committed snapshot: a long write's progress is shown against it
        self.ranks: dict[int, Connection] = {}  # a distributed run: this node's ranks by global rank
        self.stop_outcome: str | None = None  # a distributed run: a global stop snapshot's event
        self.runlog: RunLog | None = None
        self._wake_r = self._wake_w = -1
        self._old_handlers: dict[int, object] = {}
        self._old_wakeup = -1

    # -- output ---------------------------------------------------------------------------

    def say(self, line: str, level: int = 0) -> None:
        """One ``gpusnap:`` line on stderr, when ``--quiet``/``--verbose`` let lines of ``level``
        through (0: problems and stops, always; 1: snapshots; 2: requests and connections)."""
        self.console.say(line, level)

    def log(self, record: dict) -> None:
        if self.runlog is not None:
            self.runlog.append(record)

    # -- lifecycle ------------------------------------------------------------------------

    def run(self) -> int:
        """Start the trainee, serve it until it exits, return the exit status to use."""
        L = self.launch
        self.runlog = RunLog(L.run_dir)
        self.server = ControlServer()
        info_key = supervisor_file(L.torchrun is not None)
        try:
            # Handlers first: supervisor.json tells the world where to send signals, and a
            # SIGUSR1 before its handler would kill the supervisor.
            self._install_signals()
            if L.torchrun is None or not live_supervisor(L.run_dir, info_key):  # the first node's answers `snap`
                try:
                    announce(L.run_dir, info_key, self.server.path)
                except StoreError as exc:  # a full disk: the run goes on (and frees room), without `gpusnap snap`
                    self.say(f"warning: {exc.message}: `gpusnap snap` cannot reach this run; signals and timers still work")
            if L.resume:
                self._put_files_back()
            env = dict(os.environ)
            env["GPUSNAP_BOOT"] = json.dumps(L.boot_config(self.server.path))
            if L.hash_seed is not None:
                env.setdefault("PYTHONHASHSEED", L.hash_seed)
            if L.torchrun is not None:
                from gpusnap.launch.torchrun import command

                cmd = command(L.torchrun, L.kind, L.target, L.args)
            else:
                cmd = _trainee_command(L.kind, L.target, L.args)
            lifeline.arm()
            me = os.getpid()
            # torchrun's agent handles SIGTERM itself and would never see one held back.
            held = {L.signal, signal.SIGTERM} if L.torchrun is None else set()

            def in_trainee():
                # It dies with us, even when we are killed with SIGKILL (gpusnap/lifeline.py).
                lifeline.die_with_parent(me)
                signal.pthread_sigmask(signal.SIG_BLOCK, held)

            self.child = subprocess.Popen(cmd, cwd=L.cwd, env=env, preexec_fn=in_trainee)
            self.log({"source": "supervisor", "event": "start", "pid": os.getpid(), "trainee_pid": self.child.pid,
                      "command": cmd, "resume": L.resume})
            if L.notices != "off":
                Watcher(L.notices, self._from_watcher, self._from_watcher, self._notice_problem).start()
            status = self._loop()
            self.log({"source": "supervisor", "event": "exit", "status": status,
                      "trainee_returncode": self.child.returncode})
            return status
        finally:
            if self.child is not None and self.child.poll() is None:
                self._kill_tree()  # only on a supervisor bug: never leave an unsupervised trainee
            self._restore_signals()
            for w in self.waiters:
                w.conn.close()
            for c in self.conns:
                c.close()
            self.server.close()
            withdraw(L.run_dir, info_key)

    def _put_files_back(self) -> None:
        """Before the replay: the program's files as they were at the snapshot (gpusnap/files)."""
        from gpusnap.errors import FilesNotRestorable
        from gpusnap.files import before_replay
        from gpusnap.files.paths import Excludes
        from gpusnap.store.rundir import RunDir

        L = self.launch
        # The snapshot's table holds the run's exclusions; this restart's own leave more alone.
        leave = Excludes(L.files_exclude, L.cwd) if L.files_exclude else (lambda path: False)
        shared = None
        if L.store is not None:  # a restart elsewhere may have put an after-<id>/ in the store
            from gpusnap.store.objects import open_backend

            shared = open_backend(L.store)
        rd = RunDir.open(L.run_dir, trusted=True)
        ranks = None
        if L.torchrun is not None:  # the ranks this node runs, where the options fix them
            from gpusnap.launch.torchrun import node_ranks

            ranks = node_ranks(L.torchrun, rd.load_manifest(L.resume).get("world_size") or 0)
            L.files_by_host = ranks is None
        try:
            plan = before_replay(rd, L.resume, L.force, leave, shared, ranks)
        except FilesNotRestorable as exc:
            done = exc.plan.report() if exc.plan is not None else {}
            self.log({"source": "supervisor", "event": "files_refused", "snapshot": L.resume,
                      "problems": [list(p) for p in exc.problems], **done})
            raise
        if plan is None:
            return
        self.log({"source": "supervisor", "event": "files", "snapshot": L.resume, **plan.report()})
        L.files_after = plan.after_dir
        summary = plan.summary()
        if summary is not None:
            self.say(f"files back to snapshot {L.resume}: {summary}", level=0 if plan.problems else 1)
        for path, why in plan.problems:
            self.say(f"warning: {path} is left as it is (--force): it was {why}")
        for path, why in plan.failed:
            self.say(f"warning: {path} is left as it is (--force): it {why}")
        for _, why, here in plan.cut:
            if here is not None:
                self.say(f"warning: files the program first wrote after snapshot {L.resume} may be left as they are "
                         f"(--force): {why}, and its files outlived the machine that wrote them")

    def _install_signals(self) -> None:
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._old_wakeup = signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)
        wanted = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD, self.launch.signal}
        for sig in wanted:
            # A Python handler (not SIG_IGN) is reset to the default by exec, so the trainee
            # starts with default dispositions.
            self._old_handlers[sig] = signal.signal(sig, self._on_signal)

    def _restore_signals(self) -> None:
        for sig, old in self._old_handlers.items():
            signal.signal(sig, old if old is not None else signal.SIG_DFL)
        self._old_handlers.clear()
        if self._wake_w >= 0:
            signal.set_wakeup_fd(self._old_wakeup)
            os.close(self._wake_r)
            os.close(self._wake_w)
            self._wake_r = self._wake_w = -1

    def _on_signal(self, signum, frame) -> None:
        if signum != signal.SIGCHLD:
            self.signals.append(signum)

    # -- the loop -------------------------------------------------------------------------

    def _loop(self) -> int:
        L = self.launch
        tick = knobs.SUPERVISOR_TICK_S
        drain_until = None
        while True:
            self._handle_signals()
            self._handle_notices()
            now = time.monotonic()
            next_timer = self.schedule.due(now)
            if next_timer is not None and now >= next_timer and self.child.poll() is None:
                self.request("timer")
                self.schedule.requested(now)
                next_timer = self.schedule.due(now)
            if self.term_deadline is not None and now >= self.term_deadline and not self.killed:
                saved = "a snapshot was committed" if self.committed_after_term else "no snapshot was committed"
                self.say(f"--grace {format_duration(L.grace_s)} is over and {saved}: killing the program")
                self.log({"source": "supervisor", "event": "grace_over", "committed": self.committed_after_term})
                self._kill_tree()
            if self.child.poll() is not None:
                if drain_until is None:
                    drain_until = now + _DRAIN_S
                sources = [c for c in self.conns if c.pid is not None and not c.closed]
                if not sources or now >= drain_until:
                    break
            timeout = tick
            if next_timer is not None:
                timeout = min(timeout, max(0.0, next_timer - now))
            if self.term_deadline is not None and not self.killed:
                timeout = min(timeout, max(0.0, self.term_deadline - now))
            self._poll(timeout)
        return self._final_status()

    def _final_status(self) -> int:
        rc = self.child.returncode
        if self.stop_outcome is not None and not (self.killed and not self.committed_after_term):
            # The ranks of a distributed run end themselves after a global stop snapshot.
            status = EXIT_PREEMPTED if self.stop_outcome == "committed" else EXIT_PREEMPTED_UNSAVED
        elif self.term_deadline is not None and (self.launch.on_term == "snapshot" or self.stop_by_notice):
            if self.killed:
                status = EXIT_PREEMPTED if self.committed_after_term else EXIT_PREEMPTED_UNSAVED
            elif rc == EXIT_PREEMPTED or (rc == -signal.SIGTERM and self.committed_after_term):
                status = EXIT_PREEMPTED
            else:
                status = exit_status(rc)
        else:
            status = exit_status(rc)
        self._fail_waiters(f"the program exited (status {exit_status(rc)}) before the snapshot was committed")
        if rc is not None and rc < 0 and -rc != signal.SIGINT and not self.killed and self.term_deadline is None:
            self._say_killed(-rc)  # (a Ctrl-C's SIGINT: the user knows)
        if status == EXIT_PREEMPTED:
            self.say(f"stopped after a committed snapshot: exit status {status} (requeue to continue)")
        elif status == EXIT_PREEMPTED_UNSAVED:
            self.say(f"stopped without a new snapshot: exit status {status}")
        return status

    def _say_killed(self, signum: int) -> None:
        """A signal the supervisor did not send ended the program (a kill -9, the kernel's
        out-of-memory killer): one line and a hint, as for any other failure."""
        try:
            name = signal.Signals(signum).name
        except ValueError:
            name = f"signal {signum}"
        why = " (if nothing else sent it, the kernel's out-of-memory killer did: `dmesg` says)" if signum == signal.SIGKILL else ""
        self.say(f"the program was killed by {name}{why}")
        where = self.launch.store or self.launch.run_dir
        self.console.write(f"hint: `gpusnap restart {where}` continues from the last committed snapshot\n")

    def _poll(self, timeout: float) -> None:
        rlist = [self._wake_r, self.server.fileno(), *[c for c in self.conns if not c.closed]]
        wlist = [c for c in self.conns if c.wants_write]
        try:
            readable, writable, _ = select.select(rlist, wlist, [], timeout)
        except InterruptedError:
            return
        for c in writable:
            c.flush()
        for r in readable:
            if r == self._wake_r:
                try:
                    while os.read(self._wake_r, 512):
                        pass
                except BlockingIOError:
                    pass
            elif r == self.server.fileno():
                conn = self.server.accept()
                if conn is not None:
                    self.conns.append(conn)
            else:
                for msg in r.read():
                    try:
                        protocol.check(msg, protocol.TO_SUPERVISOR)
                    except protocol.Malformed as exc:
                        self._refuse(r, str(exc))
                        continue
                    self._on_message(r, msg)
        for c in list(self.conns):
            if c.closed or (c.close_after_flush and not c.wants_write):
                self._drop(c)

    def _drop(self, conn: Connection) -> None:
        conn.close()
        if conn in self.conns:
            self.conns.remove(conn)
        self.waiters = [w for w in self.waiters if w.conn is not conn]
        if conn is self.trainee:
            self.trainee = None
        if conn.rank is not None and self.ranks.get(conn.rank) is conn:
            del self.ranks[conn.rank]
            if self.trainee is None and self.ranks:
                self.trainee = self.ranks[min(self.ranks)]

    # -- signals and requests -------------------------------------------------------------

    def _handle_signals(self) -> None:
        while self.signals:
            sig = self.signals.pop(0)
            name = signal.Signals(sig).name
            self.log({"source": "supervisor", "event": "signal", "signal": name})
            if sig == self.launch.signal:
                self.request("signal")
            elif sig == signal.SIGTERM:
                self._on_term()
            elif sig in (signal.SIGINT, signal.SIGHUP):
                if self.child.poll() is None and not _tty_foreground():
                    self._send_signal(sig)

    def _on_term(self) -> None:
        L = self.launch
        if self.child.poll() is not None:
            return
        if L.on_term == "exit":
            self._send_signal(signal.SIGTERM)
            return
        if self.term_deadline is not None:
            self.say("SIGTERM again: already stopping after the next snapshot")
            return
        self.term_deadline = time.monotonic() + L.grace_s
        self.say(f"SIGTERM: snapshot at the next safe point, then stop (grace {format_duration(L.grace_s)})")
        self.request("term", stop=True)

    def _from_watcher(self, notice_or_message) -> None:
        """From the watcher's thread: queue it and wake the loop (as a signal does)."""
        self.notices.append(notice_or_message)
        try:
            os.write(self._wake_w, b"n")
        except OSError:
            pass  # the pipe is full: the loop is awake anyway, or it has ended

    def _notice_problem(self, message: str) -> None:
        self._from_watcher(("problem", message))

    def _handle_notices(self) -> None:
        while self.notices:
            notice = self.notices.pop(0)
            if isinstance(notice, str):
                self.say(notice)
                self.log({"source": "supervisor", "event": "notices_off", "message": notice})
                continue
            if isinstance(notice, tuple):  # an answer that is no notice: said once, polling goes on
                self.say(f"warning: spot notices: {notice[1]}")
                self.log({"source": "supervisor", "event": "notice_problem", "message": notice[1]})
                continue
            self.log({"source": "supervisor", "event": "notice", "provider": notice.provider,
                      "action": notice.action, "left_s": round(notice.left_s, 3)})
            if self.child.poll() is not None:
                continue
            # Stop before the machine goes: the grace ends a little before the cloud's deadline,
            # counted on the monotonic clock from when the notice was read.
            deadline = min(time.monotonic() + self.launch.grace_s, notice.stop_by(knobs.NOTICE_MARGIN_S))
            if self.term_deadline is not None:
                self.term_deadline = min(self.term_deadline, deadline)
                self.say(f"{notice.describe()}; already stopping after the next snapshot")
                continue
            self.stop_by_notice = True
            self.term_deadline = deadline
            self.say(f"{notice.describe()}: snapshot at the next safe point, then stop "
                     f"(grace {format_duration(deadline - time.monotonic())})")
            self.request("notice", stop=True)

    def _send_signal(self, sig: int) -> None:
        try:
            os.kill(self.child.pid, sig)
        except ProcessLookupError:
            pass

    def _kill_tree(self) -> None:
        self.killed = True
        try:
            root = psutil.Process(self.child.pid)
            procs = root.children(recursive=True) + [root]
        except psutil.NoSuchProcess:
            return
        for p in procs:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(procs, timeout=5)

    def request(self, reason: str, stop: bool = False) -> bool:
        """Ask the trainee for a snapshot now, or as soon as it connects. True if sent now."""
        msg = {"op": "snapshot", "reason": reason, "stop": stop, "schedule": self.schedule.info(time.monotonic())}
        self.log({"source": "supervisor", "event": "request", "reason": reason, "stop": stop,
                  "queued": self.trainee is None})
        self.say(f"asking for a snapshot ({reason}{', then stop' if stop else ''})"
                 f"{'' if self.trainee is not None else ': queued until the program connects'}", level=2)
        if self.trainee is not None and self.trainee.send(msg):
            return True
        if not any(m["reason"] == reason and m["stop"] == stop for m in self.queue):
            self.queue.append(msg)  # a trainee that never connects must not grow the queue
        return False

    # -- messages -------------------------------------------------------------------------

    def _refuse(self, conn: Connection, why: str) -> None:
        """A message that is not the protocol's: one line in the log (and on stderr with
        --verbose), and nothing else happens."""
        who = "the program" if conn is self.trainee else f"pid {conn.pid}" if conn.pid is not None else "a peer"
        self.log({"source": "supervisor", "event": "refused", "from": who, "why": why})
        self.say(f"refused a malformed message from {who}: {why}", level=2)

    def _on_message(self, conn: Connection, msg: dict) -> None:
        op = msg.get("op")
        if op == "hello":
            self._on_hello(conn, msg)
        elif op == "event":
            if conn.pid is None:
                conn.pid = msg.get("pid", -1)
            if self.ranks and conn is not self.trainee:
                self._on_rank_event(conn, msg)
            else:
                self._on_event(msg)
        elif op == "snapshot":
            wait = bool(msg.get("wait", True))
            sent = self.request(str(msg.get("reason", "request")), stop=False)
            conn.send({"op": "accepted", "queued": not sent})
            if wait:
                self.waiters.append(_Waiter(conn))
            else:
                conn.close_after_flush = True
        elif op == "status":
            conn.send({"op": "status", "pid": os.getpid(), "trainee_pid": self.child.pid,
                       "connected": self.trainee is not None, "run_dir": self.launch.run_dir,
                       "stopping": self.term_deadline is not None})
            conn.close_after_flush = True

    def _on_hello(self, conn: Connection, msg: dict) -> None:
        pid = msg.get("pid")
        conn.pid = pid if isinstance(pid, int) else -1
        rank = msg.get("rank")
        if not self._is_trainee(conn.pid):
            return
        if isinstance(rank, int):
            # A distributed run: this node's lowest rank speaks for the node (requests go to it,
            # its events are shown); every rank's events are logged.
            conn.rank = rank
            self.ranks[rank] = conn
            self.log({"source": "supervisor", "event": "connected", "pid": conn.pid, "rank": rank})
            if self.trainee is not None and self.trainee.rank is not None and self.trainee.rank < rank:
                return
        elif self.trainee is not None:
            return
        if self.trainee is None and rank is None:
            self.log({"source": "supervisor", "event": "connected", "pid": conn.pid})
        if self.trainee is None:
            self.say(f"the program connected (pid {conn.pid})", level=2)
            self.schedule.connected(time.monotonic())
        self.trainee = conn
        queued, self.queue = self.queue, []
        for m in queued:
            if not conn.send(m):
                self.queue.append(m)

    def _is_trainee(self, pid: int) -> bool:
        if pid == self.child.pid:
            return True
        try:
            return any(p.pid == pid for p in psutil.Process(self.child.pid).children(recursive=True))
        except psutil.NoSuchProcess:
            return False

    def _on_rank_event(self, conn: Connection, msg: dict) -> None:
        """An event of a rank that is not this node's lead: the lead says the same (each rank
        reports the global snapshot's outcome); logged, and a stop's outcome noted."""
        ev = {k: v for k, v in msg.items() if k != "op"}
        self.log({"source": "trainee", "rank": conn.rank, **ev})
        self._note_stop(ev)

    def _note_stop(self, ev: dict) -> None:
        if ev.get("stop") and ev.get("event") in ("committed", "failed"):
            self.stop_outcome = self.stop_outcome or ev["event"]
            if ev["event"] == "committed":
                self.committed_after_term = True

    def _on_event(self, msg: dict) -> None:
        ev = {k: v for k, v in msg.items() if k != "op"}
        self._note_stop(ev)
        name = ev.get("event")
        if name == "progress":  # a long write: the status line on a terminal, nothing in the log
            if float(ev.get("s") or 0) >= knobs.STATUS_AFTER_S:
                self.console.show("gpusnap: " + progress_line(ev, self.last_total))
            return
        if name == "committed":
            self.last_total = ev.get("bytes_total")
        if name == "honored" and ev.get("iteration") is not None:
            self.last_iteration = ev["iteration"]
        line = describe(ev, self.last_iteration)
        if line is not None:
            self.say(line, level=0 if name in ("failed", "skipped") else 2 if name in ("cost", "steps") else 1)
        warned = warning(ev)
        if warned is not None:
            self.say(warned[0])
            self.console.write(f"hint: {warned[1]}\n")
        elif name in ("failed", "skipped") and ev.get("hint"):
            self.console.write(f"hint: {ev['hint']}\n")
        rank = self.trainee.rank if self.trainee is not None else None
        self.log({"source": "trainee", **({"rank": rank} if rank is not None else {}), **ev})
        if name == "committed" and self.term_deadline is not None:
            self.committed_after_term = True
        if self.schedule.event(ev, time.monotonic()):
            self._retuned(ev)
        self._update_waiters(ev)

    def _retuned(self, cost: dict) -> None:
        """A snapshot's cost is known: log the schedule it leads to, and send it to the trainee
        (the next manifest records it)."""
        now = time.monotonic()
        info = self.schedule.info(now)
        due = self.schedule.due(now)
        self.log({"source": "supervisor", "event": "schedule", "snapshot": cost.get("id"), **info,
                  "next_in_s": None if due is None else round(max(0.0, due - now), 3)})
        if self.trainee is not None:
            self.trainee.send({"op": "schedule", "schedule": info})
        line = schedule_line(info, due, now)
        if line is not None:
            self.say(line, level=1 if info["measured"] == 1 and self.schedule.auto else 2)

    def _update_waiters(self, ev: dict) -> None:
        name, sid = ev.get("event"), ev.get("id")
        keep = []
        for w in self.waiters:
            deliver = False
            if name == "coalesced" and w.state == "pending":
                w.state = "deferred"  # the next terminal event is the running writer's
            elif name == "honored" and w.state in ("pending", "deferred"):
                w.state = "bound"
            elif name == "forked" and w.state == "bound" and w.snapshot_id is None:
                w.snapshot_id = sid
            elif name in ("committed", "failed"):
                if w.state == "pending" or (w.state == "bound" and (w.snapshot_id is None or w.snapshot_id == sid)):
                    deliver = True
            elif name == "skipped" and w.snapshot_id is None:
                deliver = True
            if deliver:
                if name == "committed" and "iteration" not in ev and self.last_iteration is not None:
                    ev = {**ev, "iteration": self.last_iteration}
                w.conn.send({"op": "event", **ev})
                w.conn.close_after_flush = True
            else:
                keep.append(w)
        self.waiters = keep

    def _fail_waiters(self, message: str) -> None:
        for w in self.waiters:
            w.conn.send({"op": "event", "event": "failed", "message": message})
            w.conn.flush()
        self.waiters = []
