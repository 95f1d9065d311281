"""The writer process: fork, the child's life, and the parent's wait for its report.

The child runs ``writer.write_snapshot`` on its copy-on-write image of the trainee and reports
one JSON object on a pipe, its last act; a waiter thread in the parent reads it, reports to the
supervisor and releases the child's generation of staging-arena regions and its slot. A commit
goes before the child is reaped (the next snapshot need not wait until it has ended), a failure
after (no copy of the program is left when it is said). A child that dies without a report
(killed, out of memory) is reported as failed, unless its manifest was committed; one that makes
no progress for too long is killed by the waiter (``watchdog``) and reported as failed. Earlier
snapshots are intact, and training goes on.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import sys
import threading
import time
import warnings

from gpusnap import lifeline, rawmem, stage
from gpusnap.capture.trainee import control, costs, session, witness
from gpusnap.capture.writer import watchdog
from gpusnap.errors import NoSpace
from gpusnap.graph.warned import ignored


class Writer:
    def __init__(self, pid: int, snap_id: str, read_fd: int, stall_s: float, generation: int | None = None):
        self.pid, self.snap_id, self.read_fd, self.stall_s = pid, snap_id, read_fd, stall_s
        self.generation = generation  # of the arena regions the child reads
        self.thread = threading.Thread(target=self._wait, name="gpusnap-writer-wait", daemon=True)

    def _wait(self) -> None:
        import psutil  # imported at install

        timeout_s = watchdog.timeout_for(psutil.Process().memory_info().rss)
        report, hung = watchdog.read_report(self.read_fd, self.pid, timeout_s, self._progress)
        os.close(self.read_fd)
        try:
            result = json.loads(report or b"{}")
        except ValueError:
            result = {}
        if result.get("event") == "committed":
            # The report is the child's last act: the snapshot is whole once it comes. Reaping can
            # take seconds more, for a process ends only when each of its threads has run to its
            # end, and its encoders at idle priority were not scheduled while training and other
            # jobs kept every core busy (tools/results/writer-priority-inversion-cpu-2026-11-29.txt).
            # Held until then, the next snapshot waited, and a program that ended meanwhile never
            # took it (tools/results/writer-reaped-after-cpu-2026-11-30.txt). So the commit, the
            # regions and the writer's slot go now, and the reaping after. A starved encoder may
            # still hold a chunk another thread wrote for it: what it reads now goes nowhere.
            self._finish(result, result.get("writer_cpu_s"))
            os.wait4(self.pid, 0)
            return
        # A failure is said once its writer is gone: no second copy of the program is left then,
        # whatever the child met (an error in the fork window once returned into the program's loop).
        _, status, usage = os.wait4(self.pid, 0)
        if not result:
            why = hung or _died(self.pid, status)
            result = _committed_anyway(self.snap_id)
            if result is not None:  # it ended in retention, after the commit
                result.update(warning=f"after the commit, {why}", hint="`gpusnap gc DIR` removes what it left")
            else:
                result = {"event": "failed", "message": why}
        result["writer_cpu_s"] = round(usage.ru_utime + usage.ru_stime, 3)
        self._finish(result, result["writer_cpu_s"])

    def _finish(self, result: dict, cpu_s: float | None) -> None:
        """The writer's work is over (its report came, or it was reaped without one): its outcome
        to the supervisor, its regions and its slot to the next snapshot."""
        self._settle(result)
        if result.get("no_space"):
            session.disk_full = True
        if result.get("drain_wanted_bytes") is not None:
            stage.drained(result["drain_wanted_bytes"])  # the size of the next drain region
            session.windows_nbytes = _windows_ahead(int(result.get("bytes_written") or 0))
        stage.writer_done(self.generation)  # nothing the snapshot needs is read from its regions now
        session.writer = None
        session.prepared = False  # the next optimizer step readies memory for the next snapshot
        if session.dist is not None:  # a shard: the coordinator reports the global snapshot
            costs.writer_done(self.snap_id, cpu_s)  # a rank's cost too: --every auto times the job by it
            session.dist.shard_finished(result)
            return
        self._say(result)
        costs.writer_done(self.snap_id, cpu_s)  # its cost follows once measured (after the result: the supervisor's order)

    def _settle(self, result: dict) -> None:
        """The trainee's own part of the outcome: its witness may be written now, or not at all."""
        result.setdefault("id", self.snap_id)
        if result.get("event") == "committed":
            session.last_bytes_total = int(result.get("bytes_total") or 0)
            witness.committed(self.snap_id)
        else:
            witness.failed(self.snap_id)

    def _say(self, result: dict) -> None:
        """The outcome, to the supervisor (a process's own; a shard's goes to its coordinator)."""
        if result.get("event") == "failed" and not control.connected():  # else the supervisor says it
            print(f"gpusnap: snapshot {self.snap_id} failed: {result.get('message')}", file=sys.stderr, flush=True)
        session.last_result = result
        control.emit(**result)

    def _progress(self, line: bytes) -> None:
        try:
            progress = json.loads(line)
        except ValueError:
            return
        if isinstance(progress, dict):
            control.emit("progress", id=self.snap_id, **progress)


def _died(pid: int, status: int) -> str:
    how = f"killed by signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else f"exit {os.waitstatus_to_exitcode(status)}"
    return f"writer process {pid} died ({how}); earlier snapshots are intact"


def _committed_anyway(snap_id: str) -> dict | None:
    """The report of a writer that died after its manifest's rename, from the manifest: a
    commit is a commit, however its writer ended."""
    try:
        m = session.rundir.load_manifest(snap_id)
    except Exception:  # noqa: BLE001 - absent or unreadable: not committed
        return None
    stats = m.get("stats") or {}
    return {"event": "committed", "id": snap_id, "iteration": m.get("iteration"), "stall_s": m.get("stall_s") or 0.0,
            "write_s": m.get("write_s") or 0.0, "durable_s": m.get("durable_s") or 0.0,
            "bytes_written": stats.get("bytes_written", 0),
            "bytes_total": stats.get("bytes_total", 0)}


# Blocked across fork(): a signal that reached the child before it ignored the trainee's would run
# the program's handler there (a Ctrl-C's KeyboardInterrupt, raised inside the program's loop).
_FORK_BLOCKED = signal.valid_signals() - {signal.SIGKILL, signal.SIGSTOP}
_IGNORED_IN_CHILD = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2)


def start_writer(job, at_step_loop: bool = True) -> Writer:
    """Fork the writer of ``job``; ``at_step_loop``: the safe point is a boundary of the step
    loop (what ``costs`` needs to know to measure the snapshot's cost). OSError when fork itself
    fails; whatever goes wrong in the child stays in the child (``_child``)."""
    read_fd, write_fd = os.pipe()
    trainee = os.getpid()
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, _FORK_BLOCKED)
    # Raised across fork(), the score is the child's from its first instruction. Raised by the
    # child itself, it would come only once the child is scheduled; meanwhile the trainee's
    # copy-on-write faults can reach a cgroup's limit with both at score 0, and the kernel kills
    # the trainee, the larger of the two.
    own_score = _oom_score_adj(b"1000")
    try:
        # Python >= 3.12 warns about fork() in a threaded process; the child runs only fork-safe
        # code (no CUDA, no torch operators, no locks other threads may hold). Ignored through
        # graph.warned.ignored, not catch_warnings: that let every warning the program had been shown
        # once per place show again after each snapshot (into its log, where captureWarnings
        # sends them), as they never do in a run without gpusnap.
        with ignored(DeprecationWarning, ".*fork.*"):
            pid = os.fork()
        if pid == 0:
            _child(job, trainee, read_fd, write_fd, mask)  # never returns
    except OSError:
        os.close(read_fd)
        os.close(write_fd)
        raise
    finally:
        # The parent's, as they were: the child never gets here.
        score_kept = own_score is None or _oom_score_adj(own_score) is not None
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    os.close(write_fd)
    stall_s = time.perf_counter() - job.requested_s
    writer = session.writer = Writer(pid, job.snap_id, read_fd, stall_s, job.generation)
    costs.forked(job.snap_id, stall_s, at_step_loop)  # before the waiter can report the writer done
    warned = {} if score_kept else {
        "warning": f"the trainee's oom_score_adj stays 1000 (was {own_score.decode()}): it could not be lowered again after the fork",
        "hint": "the out-of-memory killer now picks the trainee as readily as its writer"}
    control.emit("forked", id=job.snap_id, stall_s=stall_s, iteration=job.iteration, **warned)
    writer.thread.start()
    return writer


def _child(job, trainee: int, read_fd: int, write_fd: int, mask) -> None:
    """The writer's whole life: one try whose only way out is ``os._exit``, so that nothing the
    child meets (EMFILE, MemoryError, a Ctrl-C) can return into the program's own loop, where a
    second copy of the program would train on. Its report goes to the trainee on ``write_fd``."""
    code = 1
    try:
        try:
            for signum in _IGNORED_IN_CHILD:
                signal.signal(signum, signal.SIG_IGN)  # finish the write; the supervisor kills on --grace
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            # The address space fork passed on, before the writer maps anything into the holes
            # that do-not-fork memory left (rawmem.mapped).
            rawmem.freeze_maps()
            lifeline.die_with_parent(trainee)  # an orphaned writer's snapshot would never be reported
            lifeline.set_name("gpusnap-writer")
            os.close(read_fd)
            result = _write(job, write_fd)
            code = 0
        except BaseException as exc:  # noqa: BLE001 - every failure becomes a report
            result = {"event": "failed", "id": job.snap_id, "message": _describe(exc)}
            if getattr(exc, "hint", None):
                result["hint"] = exc.hint
            if isinstance(exc, NoSpace):
                result["no_space"] = True  # the next writers prune first (agent.take)
        usage = resource.getrusage(resource.RUSAGE_SELF)  # every thread's, to its report
        result["writer_cpu_s"] = round(usage.ru_utime + usage.ru_stime, 3)
        os.write(write_fd, json.dumps(result, default=str).encode())
        os.close(write_fd)  # the report's end: the trainee need not wait for every thread of this one to end
    finally:
        os._exit(code)


def _windows_ahead(written_bytes: int) -> int:
    """The pack windows the trainee allocates ahead for the next writer (``stage.prepare``):
    all of them once a snapshot has written more than one pack (its writer filled both), none
    for a smaller one (its writer touches little of its own)."""
    from gpusnap.store.writer import windows_nbytes

    nbytes = windows_nbytes()
    return nbytes if written_bytes > nbytes // 2 else 0


def _oom_score_adj(score: bytes) -> bytes | None:
    """Set this process's ``oom_score_adj``; the score it had, or None where it cannot be set.
    1000 makes the writer the out-of-memory killer's first choice (no privilege needed): when the
    host or the job's cgroup runs out while a snapshot is written, the writer dies and its
    snapshot fails, instead of the program, whose resident set is otherwise the larger. Lowering
    it back needs no privilege either, down to the lowest score a privileged process gave it."""
    try:
        fd = os.open("/proc/self/oom_score_adj", os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return None  # not Linux, or no /proc: the writer is as likely a victim as any
    try:
        before = os.read(fd, 16).strip()
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, score)
        return before
    except OSError:
        return None
    finally:
        os.close(fd)


def _write(job, write_fd: int) -> dict:
    # The walks touch every attribute of the program's objects and modules (deprecated ones
    # of torch.distributed warn): the writer speaks only through its report.
    warnings.simplefilter("ignore")
    if "blosc2" in sys.modules:
        sys.modules["blosc2"].free_resources()  # its thread pool did not survive fork
    from gpusnap.capture.writer.process import write_snapshot

    return write_snapshot(job, _progress_reporter(write_fd))


# A writer tells the trainee how far it is this often (the live status line of a long write),
# as often as a restore redraws its own.
PROGRESS_EVERY_S = 0.2


def _progress_reporter(write_fd: int):
    """In the writer: ``WriterSetup.report_progress``, a line on the report pipe every
    ``PROGRESS_EVERY_S`` (the trainee's waiter passes it on to the supervisor)."""
    started = time.perf_counter()
    last = [started]

    def report(bytes_put: int, bytes_written: int) -> None:
        now = time.perf_counter()
        if now - last[0] < PROGRESS_EVERY_S:
            return
        last[0] = now
        line = json.dumps({"bytes_put": bytes_put, "bytes_written": bytes_written, "s": round(now - started, 1)})
        try:
            os.write(write_fd, line.encode() + b"\n")
        except OSError:
            pass  # the trainee is gone: the lifeline ends this process

    return report


def _describe(exc: BaseException) -> str:
    message = getattr(exc, "message", None) or str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {message}"


def wait_for_writer_at_exit() -> None:
    writer = session.writer
    if writer is not None:
        writer.thread.join()


def exit_now(code: int) -> None:
    control.flush()  # the stop snapshot's last events
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(code)
