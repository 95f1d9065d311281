"""Chaos: faults at random moments against gpusnap's promise that nothing committed is ever lost
and that a restart never restores wrong state.

    python tools/chaos.py [--events 100] [--seed S] [--dir WORK] [--steps 300] [--state-mb 48]

Episodes run the workload (tools/chaos/train.py: a numpy program with STATE_MB of state) under
`gpusnap run`; each event, chosen by the seeded generator, strikes at a random moment:

  kill-trainee     SIGKILL the trainee while its writer writes a snapshot
  kill-writer      SIGKILL the writer mid-write (training goes on)
  kill-supervisor  SIGKILL the supervisor mid-write
  kill-job         SIGKILL the whole process group mid-write, as a lost node does
  kill-gc          SIGKILL `gpusnap gc --keep 2` while it removes snapshots
  kill-restore     SIGKILL `gpusnap restart` while it replays, fast-forwards or merges
  ENOSPC, EIO, EROFS   every store write fails mid-write (a full disk, a failing disk, a file
                   system remounted read-only; tools/chaos/inject/sitecustomize.py), then heals
  full-disk        the run directory becomes a disk with room for half a snapshot more than the
                   --keep snapshots it holds: the next snapshot fails, and the run must commit
                   again by itself (retention before the write) within two more
  EIO-read         every other read of a pack fails with EIO while `gpusnap restart` restores:
                   it restores intact bytes or refuses, with one line
  torn-manifest    the newest manifest is cut in half: the same command again skips it and
                   resumes from the one before (the torn file is then moved aside, as verify says)
  fork-error       a writer's first file open fails (EMFILE, MemoryError or a Ctrl-C) right after
                   fork: the snapshot fails and exactly one copy of the program trains on
  forged-c10d      a two-rank torchrun job (tools/chaos/dist_train.py) whose c10d store holds
                   forged plan, done, global and position keys: its SIGTERM snapshot commits, from
                   shards of one iteration, nothing is written outside its run directory, and it
                   exits 75 only with a committed snapshot
  bad-metadata     the fake metadata service the runs watch (--notices aws) answers with a proxy
                   page, bad JSON, a redirect, a dribble or a huge body: the run trains on; half
                   the time a real notice follows, and the run stops with 75 and a snapshot
  stop-supervisor  SIGSTOP the supervisor while the program trains and snapshots itself
                   (SIGUSR1 to the trainee): training must go on; after SIGCONT a snapshot commits

The runs keep the newest --keep 3 snapshots. After every event `gpusnap verify` must find every
committed snapshot intact, and every snapshot committed before stays committed unless retention
may have removed it (all but the newest two: retention before a write on a full disk keeps
two) or gc was asked to; after a fault heals, the next snapshot must commit. A run that was
killed goes on with `gpusnap restart`; when it ends, its final state must equal an uninterrupted
run's. Prints every event with the seed, and a summary; exit 0 only when nothing was lost, no
restore was wrong and nothing was stuck.
"""

from __future__ import annotations

import argparse
import email.utils
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psutil

HERE = Path(__file__).resolve().parent
WORKLOAD = HERE / "chaos" / "train.py"
DIST_WORKLOAD = HERE / "chaos" / "dist_train.py"
INJECT = HERE / "chaos" / "inject"
KINDS = ("kill-trainee", "kill-writer", "kill-supervisor", "kill-job", "kill-gc", "kill-restore", "ENOSPC", "EIO", "EROFS",
         "full-disk", "EIO-read", "torn-manifest", "fork-error", "forged-c10d", "bad-metadata", "stop-supervisor")
KEEP = 3
SPOT_ACTION = "/latest/meta-data/spot/instance-action"
BAD_ANSWERS = ("proxy-page", "bad-json", "redirect", "dribble", "huge")


class Metadata(ThreadingHTTPServer):
    """The cloud's metadata service the runs watch (--notices aws): ``mode`` is "none" (no
    notice), "notice" (a real one, 60 s ahead) or one of BAD_ANSWERS."""

    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), _MetadataHandler)
        self.mode = "none"
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def handle_error(self, request, client_address) -> None:
        pass  # a client that hangs up on a huge or dribbled answer is the point, not news


class _MetadataHandler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def _send(self, status: int, body: bytes = b"", headers: dict | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def do_PUT(self):
        self._send(200, b"chaos-token") if self.path == "/latest/api/token" else self._send(404)

    def do_GET(self):
        mode = self.server.mode
        notice = json.dumps({"action": "terminate", "time": datetime.fromtimestamp(time.time() + 60, timezone.utc)
                             .strftime("%Y-%m-%dT%H:%M:%SZ")}).encode()
        if self.path == "/notice":
            return self._send(200, notice)
        if self.path != SPOT_ACTION or mode == "none":
            return self._send(404)
        if mode == "notice":
            return self._send(200, notice, {"Date": email.utils.formatdate(usegmt=True)})
        if mode == "proxy-page":
            return self._send(200, b"<html><body>502 Bad Gateway: the proxy cannot reach 169.254.169.254</body></html>")
        if mode == "bad-json":
            return self._send(200, b'{"action": 5, "time": []}')
        if mode == "redirect":
            return self._send(302, headers={"Location": "/notice"})
        if mode == "huge":
            return self._send(200, b"{" * (4 << 20))
        for byte in b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n":  # dribble
            try:
                self.wfile.write(bytes([byte]))
                self.wfile.flush()
            except OSError:
                return
            time.sleep(0.5)


class Chaos:
    def __init__(self, work: Path, seed: int, steps: int, state_mb: int, kinds=KINDS):
        self.work, self.rng, self.steps, self.state_mb, self.kinds = work, random.Random(seed), steps, state_mb, kinds
        self.fault = work / "fault"
        self.env = dict(os.environ)
        self.env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(INJECT), str(HERE.parent), self.env.get("PYTHONPATH")]))
        self.env["GPUSNAP_CHAOS_FAULT"] = str(self.fault)
        self.metadata = Metadata()
        self.env.update(GPUSNAP_METADATA_URL=self.metadata.url, GPUSNAP_NOTICE_POLL_S="0.2")
        self.reference = None
        self.job: subprocess.Popen | None = None
        self.episode = 0
        self.counts = {"events": 0, "runs": 0, "finished": 0, "committed": 0, "lost": 0, "wrong": 0, "refused": 0, "stuck": 0}
        self.committed: set[str] = set()

    # -- processes ---------------------------------------------------------------------------
    def gpusnap(self, *args) -> list[str]:
        return [sys.executable, "-m", "gpusnap", *map(str, args)]

    def start(self, *args) -> None:
        self.counts["runs"] += 1
        # The progress file counts this run's steps (a restarted run's may be lower than the killed
        # one's last; gpusnap puts it back as the snapshot found it before the program starts). A
        # signal sent to the program before gpusnap's handlers are in place waits for them.
        (self.work / "out" / "progress").unlink(missing_ok=True)
        # gpusnap's own lines go to a file: a pipe nobody reads would fill and stall the supervisor.
        with open(self.work / f"gpusnap-{self.counts['runs']}.log", "w") as log:
            self.job = subprocess.Popen(self.gpusnap(*args), cwd=self.work, env=self.env, start_new_session=True,
                                        stdout=subprocess.DEVNULL, stderr=log)

    def alive(self) -> bool:
        return self.job is not None and self.job.poll() is None

    def trainee(self) -> psutil.Process | None:
        try:
            kids = psutil.Process(self.job.pid).children()
        except psutil.NoSuchProcess:
            return None
        return kids[0] if kids else None

    def writer(self) -> psutil.Process | None:
        trainee = self.trainee()
        try:
            kids = trainee.children() if trainee is not None else []
        except psutil.NoSuchProcess:
            return None
        return kids[0] if kids else None

    def kill_job(self) -> None:
        if self.job is None:
            return
        try:
            os.killpg(self.job.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.job.wait()
        # Orphans of a killed supervisor (a trainee, a writer) are in its session too.
        for proc in psutil.process_iter(["pid"]):
            try:
                if os.getsid(proc.pid) == self.job.pid:
                    proc.kill()
            except (ProcessLookupError, psutil.NoSuchProcess, PermissionError):
                pass

    def step(self) -> int:
        try:
            return int((self.work / "out" / "progress").read_text() or 0)
        except (FileNotFoundError, ValueError):
            return 0

    def wait(self, condition, timeout: float = 30) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if condition():
                return True
            time.sleep(0.01)
        return False

    # -- the run and its snapshots ------------------------------------------------------------
    def new_episode(self) -> None:
        self.kill_job()
        self.episode += 1
        for name in ("out", "snaps"):
            shutil.rmtree(self.work / name, ignore_errors=True)
        (self.work / "out").mkdir()
        self.committed = set()
        self.run_again()

    def run_again(self) -> None:
        """The job's command, as a requeued job runs it again: it resumes from the newest
        intact snapshot, or starts afresh when there is none."""
        self.start("run", "--dir", "snaps", "--keep", KEEP, "--notices", "aws", WORKLOAD, "out", self.steps, self.state_mb)

    def ensure_running(self) -> None:
        """A finished run is compared and a new episode begins; a dead one is run again."""
        if self.alive():
            return
        if self.job is not None and self.job.returncode == 0 and (self.work / "out" / "final.json").exists():
            self.finished()
            self.new_episode()
            return
        if self.job is None:
            self.new_episode()
            return
        self.run_again()

    def finished(self) -> None:
        self.counts["finished"] += 1
        got = (self.work / "out" / "final.json").read_text()
        if got != self.reference:
            self.counts["wrong"] += 1
            self.say(f"WRONG RESTORE: episode {self.episode} ended with other bytes than the uninterrupted run")

    def listed(self) -> set[str]:
        done = subprocess.run(self.gpusnap("ls", "snaps", "--json"), cwd=self.work, env=self.env, capture_output=True, text=True)
        return {s["id"] for s in json.loads(done.stdout)} if done.returncode == 0 else set()

    def check(self, event: str, pruned: bool = False) -> None:
        """Every committed snapshot verifies; none vanished unless gc was asked to remove it, or
        retention may have: --keep keeps the newest KEEP, and before a write on a full disk the
        newest KEEP - 1."""
        if not (self.work / "snaps").exists():
            return
        verify = subprocess.run(self.gpusnap("verify", "snaps"), cwd=self.work, env=self.env, capture_output=True, text=True)
        now = self.listed()
        if verify.returncode != 0:
            self.counts["lost"] += 1
            self.say(f"LOST: after {event}, verify failed: {(verify.stderr or verify.stdout).strip()}")
        gone = (self.committed - now) & set(sorted(self.committed | now, key=int)[-(KEEP - 1):])
        if gone and not pruned:
            self.counts["lost"] += len(gone)
            self.say(f"LOST: after {event}, committed snapshots {sorted(gone)} are gone")
        self.counts["committed"] += len(now - self.committed)
        self.committed = now

    # -- events -------------------------------------------------------------------------------
    def mid_write(self) -> psutil.Process | None:
        """Ask for a snapshot, wait until its writer runs, then a random moment into it."""
        start = self.step()
        if not self.wait(lambda: self.step() > start + 2 or not self.alive(), 60) or not self.alive():
            return None
        os.kill(self.job.pid, signal.SIGUSR1)
        if not self.wait(lambda: self.writer() is not None or not self.alive(), 10):
            return None
        # A random moment of the write: within the time the last committed write took (on an idle
        # machine a fixed window outlasts most writes, and the strike finds no writer left).
        time.sleep(self.rng.uniform(0.0, 0.9 * self.last_write_s()))
        return self.writer()

    def last_write_s(self) -> float:
        """How long the last committed snapshot's write took (from the run log), or 0.25 s."""
        try:
            lines = (self.work / "snaps" / "log.jsonl").read_text().splitlines()
        except OSError:
            return 0.25
        for line in reversed(lines):
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if event.get("event") == "committed" and event.get("write_s"):
                return float(event["write_s"])
        return 0.25

    def strike(self, kind: str) -> str:
        new = {"full-disk": self.full_disk, "EIO-read": self.eio_read, "torn-manifest": self.torn_manifest,
               "fork-error": self.fork_error, "forged-c10d": self.forged_c10d, "bad-metadata": self.bad_metadata,
               "stop-supervisor": self.stop_supervisor}
        if kind in new:
            return new[kind]()
        if kind in ("kill-trainee", "kill-writer", "kill-supervisor", "kill-job", "ENOSPC", "EIO", "EROFS"):
            self.ensure_running()
            if kind in ("ENOSPC", "EIO", "EROFS"):
                return self.inject(kind)
            writer = self.mid_write()
            if writer is None:
                return "no writer ran (the run ended or died first)"
            target = {"kill-trainee": self.trainee(), "kill-writer": writer, "kill-supervisor": psutil.Process(self.job.pid)}.get(kind)
            if kind == "kill-job":
                self.kill_job()
            elif target is not None:
                try:
                    target.kill()
                except psutil.NoSuchProcess:
                    pass
                if kind != "kill-writer":
                    time.sleep(0.5)  # what dies with it dies; then the node is gone too
                    self.kill_job()
            return "struck mid-write"
        if kind == "kill-gc":
            self.snapshots_at_least(3)
            self.kill_job()
            if len(self.listed()) < 3:
                return "fewer than 3 snapshots: nothing for gc to remove"
            gc = subprocess.Popen(self.gpusnap("gc", "snaps", "--keep", "2"), cwd=self.work, env=self.env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(self.rng.uniform(0.0, 0.4))
            gc.kill()
            gc.wait()
            return f"gc killed (exit {gc.returncode})"
        # kill-restore
        self.snapshots_at_least(1)
        self.kill_job()
        if not self.listed():
            return "no snapshot to restore"
        self.start("restart", "snaps")
        time.sleep(self.rng.uniform(0.2, 3.0))
        self.kill_job()
        return "restart killed"

    # -- the faults of issue 24 ------------------------------------------------------------------
    def outcomes(self) -> list[dict]:
        """The terminal events of the snapshots in the run log, oldest first."""
        try:
            lines = (self.work / "snaps" / "log.jsonl").read_text().splitlines()
        except OSError:
            return []
        found = []
        for line in lines:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if event.get("source") == "trainee" and event.get("event") in ("committed", "failed", "skipped"):
                found.append(event)
        return found

    def settled(self) -> bool:
        """Every writer forked so far has its outcome in the run log (a writer that has exited
        may not have been reported yet: its outcome would be taken for the next snapshot's)."""
        try:
            events = [json.loads(line).get("event") for line in (self.work / "snaps" / "log.jsonl").read_text().splitlines()]
        except (OSError, ValueError):
            return False
        return events.count("forked") <= events.count("committed") + events.count("failed")

    def snapshot_outcome(self, timeout: float = 60) -> dict | None:
        """SIGUSR1 to the supervisor; the snapshot's outcome (None: none within ``timeout``)."""
        self.wait(lambda: self.settled() or not self.alive(), 30)
        before = len(self.outcomes())
        try:
            os.kill(self.job.pid, signal.SIGUSR1)
        except ProcessLookupError:
            return None  # the run ended meanwhile
        if not self.wait(lambda: len(self.outcomes()) > before or not self.alive(), timeout) or not self.alive():
            return None
        return self.outcomes()[before]

    def disk_bytes(self) -> int:
        return sum(p.stat().st_size for p in (self.work / "snaps").rglob("*") if p.is_file())

    def full_disk(self) -> str:
        self.snapshots_at_least(KEEP)
        if not self.alive():
            return "the run ended first"
        newest = max(self.listed(), key=int)
        info = subprocess.run(self.gpusnap("ls", "snaps", "--json"), cwd=self.work, env=self.env, capture_output=True, text=True)
        written = next(s["bytes_written"] for s in json.loads(info.stdout) if s["id"] == newest)
        self.fault.write_text(f"DISK {self.disk_bytes() + written // 2}")
        try:
            seen = []
            for _ in range(3):  # the first finds no room beside the KEEP it holds; then retention runs first
                outcome = self.snapshot_outcome()
                if outcome is None:
                    break
                seen.append(outcome["event"])
                if outcome["event"] == "committed":
                    break
        finally:
            self.fault.unlink()
        if "committed" not in seen and self.alive():
            self.counts["stuck"] += 1
            self.say(f"STUCK: on a full disk with --keep {KEEP}, no snapshot committed again ({seen})")
        return f"disk full: {' then '.join(seen) or 'the run ended'}"

    def eio_read(self) -> str:
        self.snapshots_at_least(1)
        self.kill_job()
        if not self.listed():
            return "no snapshot to restore"
        self.fault.write_text("EIO-READ 0.5")
        try:
            self.start("restart", "snaps")
            self.wait(lambda: not self.alive() or self.step() > 2, 120)
        finally:
            self.fault.unlink()
        log = (self.work / f"gpusnap-{self.counts['runs']}.log").read_text()
        if "Traceback" in log:
            self.counts["wrong"] += 1
            self.say(f"WRONG: a restart under EIO ended in a traceback: {log.strip()[-400:]}")
        return "restart under EIO on reads: " + ("trains on" if self.alive() else f"exit {self.job.returncode}")

    def torn_manifest(self) -> str:
        self.snapshots_at_least(2)
        if not self.alive():
            return "the run ended first"  # then the same command starts afresh, as it should
        self.kill_job()
        ids = sorted(self.listed(), key=int)
        if len(ids) < 2:
            return "fewer than 2 snapshots"
        torn = self.work / "snaps" / "snapshots" / f"{ids[-1]}.json"
        torn.write_bytes(torn.read_bytes()[: torn.stat().st_size // 2])
        self.committed.discard(ids[-1])  # damaged on purpose: not a loss of gpusnap's
        self.run_again()
        resumed = self.wait(lambda: self.step() > 2 or not self.alive(), 120)
        torn.rename(self.work / f"torn-{ids[-1]}.json")  # what verify's finding asks for
        log = (self.work / f"gpusnap-{self.counts['runs']}.log").read_text()
        if f"skipping snapshot {ids[-1]}: manifest_damaged" not in log:
            self.counts["wrong"] += 1
            self.say(f"WRONG: the run did not skip torn snapshot {ids[-1]}: {log.strip()[-400:]}")
        return f"torn {ids[-1]}: {'resumed from ' + ids[-2] if resumed else 'the run ended'}"

    def fork_error(self) -> str:
        self.ensure_running()
        if not self.wait(lambda: self.step() > 2 or not self.alive(), 60) or not self.alive():
            return "the run ended first"
        raised = self.rng.choice(["EMFILE", "MemoryError", "KeyboardInterrupt"])
        trainee = self.trainee()
        self.fault.write_text(f"FORK-{raised}")
        try:
            outcome = self.snapshot_outcome()
        finally:
            self.fault.unlink()
        if outcome is None:
            return "the run ended first"
        at = self.step()
        self.wait(lambda: self.step() > at + 5 or not self.alive(), 30)
        try:
            copies = trainee.children() if trainee is not None else []
        except psutil.NoSuchProcess:
            copies = []
        if copies:
            self.counts["wrong"] += 1
            self.say(f"WRONG: after {raised} in the fork window, a second copy trains (pid {copies[0].pid})")
        return f"{raised} in the fork window: snapshot {outcome['event']}; " + self.next_commits(raised)

    def next_commits(self, what: str) -> str:
        """After a fault healed, the next snapshot must commit."""
        if not self.alive():
            return "the run ended"
        outcome = self.snapshot_outcome()
        if outcome is None and self.alive():
            self.counts["stuck"] += 1
            self.say(f"STUCK: after {what} healed, no snapshot came within 60 s")
        elif outcome is not None and outcome["event"] != "committed":
            self.counts["stuck"] += 1
            self.say(f"STUCK: after {what} healed, the next snapshot {outcome['event']}: {outcome.get('message')}")
        return "the next snapshot committed" if outcome and outcome["event"] == "committed" else "the run ended"

    def bad_metadata(self) -> str:
        self.ensure_running()
        if not self.wait(lambda: self.step() > 2 or not self.alive(), 60) or not self.alive():
            return "the run ended first"
        bad = self.rng.choice(BAD_ANSWERS)
        self.metadata.mode = bad
        try:
            self.wait(lambda: not self.alive(), 3.0)
        finally:
            self.metadata.mode = "none"
        if not self.alive() and self.job.returncode in (75, 76):
            self.counts["wrong"] += 1
            self.say(f"WRONG: a {bad} answer of the metadata service stopped the run (exit {self.job.returncode})")
            return f"{bad}: the run stopped"
        if not self.alive():
            return f"{bad}: the run ended (exit {self.job.returncode})"
        if self.rng.random() < 0.5:
            return f"{bad}: trained on"
        before = self.listed()
        self.metadata.mode = "notice"
        try:
            stopped = self.wait(lambda: not self.alive(), 60)
        finally:
            self.metadata.mode = "none"
        if not stopped:
            self.counts["stuck"] += 1
            self.say("STUCK: a spot notice did not stop the run within 60 s")
            return f"{bad}, then a notice: still running"
        if self.job.returncode == 75 and not self.listed() - before:
            self.counts["lost"] += 1
            self.say("LOST: the run exited 75 on a notice with no new snapshot")
        return f"{bad}: trained on; then a notice: exit {self.job.returncode}"

    def stop_supervisor(self) -> str:
        self.ensure_running()
        if not self.wait(lambda: self.step() > 2 or not self.alive(), 60) or not self.alive():
            return "the run ended first"
        trainee = self.trainee()
        supervisor = psutil.Process(self.job.pid)
        supervisor.suspend()
        try:
            at = self.step()
            if at >= self.steps:  # training is over: nothing to go on with (its exit may wait for the supervisor)
                return "the run ended first"
            for _ in range(3):
                try:
                    trainee.send_signal(signal.SIGUSR1)  # the program snapshots itself; its events queue up
                except (psutil.NoSuchProcess, AttributeError):
                    break
                time.sleep(1.0)
            trained = self.wait(lambda: self.step() >= min(at + 10, self.steps) or self.trainee() is None, 30)
        finally:
            supervisor.resume()
        if not trained and self.alive():
            self.counts["stuck"] += 1
            self.say(f"STUCK: training stalled while the supervisor was stopped (step {at} -> {self.step()})")
        return "supervisor stopped, training went on; " + self.next_commits("a stopped supervisor")

    def forged_c10d(self) -> str:
        """A short two-rank job of its own, beside the episode (whose run is stopped meanwhile:
        the machine's cores are few)."""
        from torch.distributed import PrefixStore, TCPStore

        sys.path.insert(0, str(HERE.parent))
        from gpusnap.capture.dist import check as distcheck

        self.kill_job()
        job = self.work / f"dist-{self.counts['events']}"
        job.mkdir()
        (job / "out").mkdir()
        with open(job / "gpusnap.log", "w") as log:
            run = subprocess.Popen(self.gpusnap("run", "--nproc-per-node", "2", "--dir", job / "run", DIST_WORKLOAD, job / "out", 400),
                                   cwd=job, env={**self.env, "GPUSNAP_WRITER_PRIORITY": "0"}, start_new_session=True,
                                   stdout=subprocess.DEVNULL, stderr=log)
        try:
            def rank_env():
                for p in psutil.Process(run.pid).children(recursive=True):
                    try:
                        env = p.environ()
                    except psutil.Error:
                        continue
                    if env.get("RANK") == "1" and "MASTER_PORT" in env:
                        return env
                return None

            def progress():
                try:
                    return min(int((job / "out" / f"rank{r}").read_text() or 0) for r in (0, 1))
                except (OSError, ValueError):
                    return 0

            env = self.wait(lambda: progress() >= 3 or run.poll() is not None, 180) and rank_env()
            if not env:
                self.counts["stuck"] += 1
                self.say(f"STUCK: the two-rank job did not start: {(job / 'gpusnap.log').read_text()[-400:]}")
                return "the job did not start"
            nonce = json.loads((job / "run" / "run.json").read_text())["nonce"]
            store = TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]), is_master=False)
            for prefix in (distcheck.key_prefix(nonce, env["TORCHELASTIC_RUN_ID"], env.get("TORCHELASTIC_RESTART_COUNT", "0")),
                           "gpusnap/0/"):
                forged = PrefixStore(prefix, store)
                for g in (1, 2):
                    forged.set(f"plan/{g}", json.dumps({"id": "../../../../outside", "at": {"steps": 0}, "stop": True,
                                                        "reason": "term"}))
                    forged.set(f"done/{g}/1", json.dumps({"event": "committed", "id": "000001", "iteration": 99999}))
                    forged.set(f"global/{g}", json.dumps({"event": "committed", "id": f"{g:06d}", "stop": True}))
                    forged.set(f"pos/{g}/1", b"[" * 100_000)
            os.kill(run.pid, signal.SIGTERM)
            try:
                code = run.wait(timeout=180)
            except subprocess.TimeoutExpired:
                self.counts["stuck"] += 1
                self.say("STUCK: the two-rank job did not stop within 180 s of SIGTERM")
                return "did not stop"
        finally:
            try:
                os.killpg(run.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            run.wait()
        committed = sorted(p.stem for p in (job / "run" / "snapshots").glob("*.json"))
        outside = [p for p in self.work.rglob("outside*")]
        verified = subprocess.run(self.gpusnap("verify", job / "run"), cwd=job, env=self.env, capture_output=True, text=True)
        if code == 75 and not committed or outside or (committed and verified.returncode != 0):
            self.counts["wrong"] += 1
            self.say(f"WRONG: forged c10d keys steered the job: exit {code}, committed {committed}, outside the run "
                     f"directory {outside}, verify {verified.returncode}")
        shutil.rmtree(job, ignore_errors=True)
        return f"forged keys: exit {code}, committed {committed}"

    def snapshots_at_least(self, n: int) -> None:
        """Take snapshots until ``n`` are committed (or the run ends)."""
        self.ensure_running()
        self.wait(lambda: self.step() > 2 or not self.alive(), 60)
        while len(self.listed()) < n and self.alive():
            before = self.listed()
            os.kill(self.job.pid, signal.SIGUSR1)
            if not self.wait(lambda: self.listed() - before or not self.alive(), 60):
                return
        self.check("snapshots for the next event")

    def inject(self, name: str) -> str:
        if self.mid_write() is None:
            return "no writer ran"
        self.fault.write_text(name)
        self.wait(lambda: self.writer() is None, 30)
        self.fault.unlink()
        if not self.alive():
            return f"the run ended ({self.job.returncode}) under {name}"
        # Training goes on, and the next snapshot commits.
        return f"{name} mid-write; " + self.next_commits(name)

    # -- main ---------------------------------------------------------------------------------
    def say(self, line: str) -> None:
        print(f"chaos: {line}", flush=True)

    def run(self, events: int) -> int:
        self.say(f"reference run ({self.steps} steps, {self.state_mb} MB of state)")
        ref = self.work / "ref"
        ref.mkdir(exist_ok=True)
        subprocess.run([sys.executable, str(WORKLOAD), str(ref), str(self.steps), str(self.state_mb)], check=True, env=self.env)
        self.reference = (ref / "final.json").read_text()
        self.new_episode()
        for n in range(events):
            kind = self.rng.choice(self.kinds)
            started = time.monotonic()
            what = self.strike(kind)
            self.check(kind, pruned=kind == "kill-gc")
            self.counts["events"] += 1
            self.say(f"event {n + 1}/{events} episode {self.episode}: {kind}: {what} ({time.monotonic() - started:.1f} s)")
        # The last episode runs to its end, through restarts, and is compared too.
        if self.alive():
            self.job.wait()
        if not (self.job.returncode == 0 and (self.work / "out" / "final.json").exists()):
            self.run_again()
            self.job.wait()
        if self.job.returncode == 0:
            self.finished()
        else:
            self.counts["refused"] += 1
            log = (self.work / f"gpusnap-{self.counts['runs']}.log").read_text().strip().splitlines()
            self.say(f"the last run ended with {self.job.returncode}: {' | '.join(log[-3:])}")
        c = self.counts
        self.say(f"summary: {c['events']} events, {c['runs']} runs and restarts, {c['finished']} runs finished and compared, "
                 f"{c['committed']} snapshots committed; lost {c['lost']}, wrong restores {c['wrong']}, last restart refused {c['refused']}, "
                 f"stuck after a fault {c['stuck']}")
        return 0 if c["lost"] == c["wrong"] == c["refused"] == c["stuck"] == 0 else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=100)
    ap.add_argument("--seed", type=int, default=None, help="replays a run (default: from the clock, printed)")
    ap.add_argument("--dir", type=Path, default=None, help="work directory (default: a new temporary one, removed on success)")
    ap.add_argument("--steps", type=int, default=300, help="training steps of the workload")
    ap.add_argument("--state-mb", type=int, default=48, help="the workload's state")
    ap.add_argument("--kinds", default=",".join(KINDS), help="the events to choose from, comma-separated (default: all)")
    args = ap.parse_args()
    seed = args.seed if args.seed is not None else time.time_ns() % 1_000_000
    work = (args.dir or Path(tempfile.mkdtemp(prefix="gpusnap-chaos-"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    print(f"chaos: seed {seed} (--seed {seed} replays it), working in {work}", flush=True)
    kinds = tuple(args.kinds.split(","))
    unknown = set(kinds) - set(KINDS)
    if unknown:
        ap.error(f"unknown event kinds {sorted(unknown)}; known: {', '.join(KINDS)}")
    status = Chaos(work, seed, args.steps, args.state_mb, kinds).run(args.events)
    if status == 0 and args.dir is None:
        shutil.rmtree(work, ignore_errors=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
