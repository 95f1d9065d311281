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

After every event `gpusnap verify` must find every committed snapshot intact, and every snapshot
committed before stays committed (unless gc was asked to remove it); after a fault heals, the
next snapshot must commit. A run that was killed goes
on with `gpusnap restart`; when it ends, its final state must equal an uninterrupted run's.
Prints every event with the seed, and a summary; exit 0 only when nothing was lost and no
restore was wrong.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

HERE = Path(__file__).resolve().parent
WORKLOAD = HERE / "chaos" / "train.py"
INJECT = HERE / "chaos" / "inject"
KINDS = ("kill-trainee", "kill-writer", "kill-supervisor", "kill-job", "kill-gc", "kill-restore", "ENOSPC", "EIO", "EROFS")


class Chaos:
    def __init__(self, work: Path, seed: int, steps: int, state_mb: int, kinds=KINDS):
        self.work, self.rng, self.steps, self.state_mb, self.kinds = work, random.Random(seed), steps, state_mb, kinds
        self.fault = work / "fault"
        self.env = dict(os.environ)
        self.env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(INJECT), str(HERE.parent), self.env.get("PYTHONPATH")]))
        self.env["GPUSNAP_CHAOS_FAULT"] = str(self.fault)
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
        # The progress file counts this run's steps from its first (a restarted run's may be lower
        # than the killed one's last); signals wait for it, as gpusnap's handlers are in place then.
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
        self.start("run", "--dir", "snaps", WORKLOAD, "out", self.steps, self.state_mb)

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
        """Every committed snapshot verifies; none vanished unless gc was asked to remove it."""
        if not (self.work / "snaps").exists():
            return
        verify = subprocess.run(self.gpusnap("verify", "snaps"), cwd=self.work, env=self.env, capture_output=True, text=True)
        now = self.listed()
        if verify.returncode != 0:
            self.counts["lost"] += 1
            self.say(f"LOST: after {event}, verify failed: {(verify.stderr or verify.stdout).strip()}")
        gone = self.committed - now
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
        after = self.listed()
        os.kill(self.job.pid, signal.SIGUSR1)
        committed = self.wait(lambda: len(self.listed() - after) > 0 or not self.alive(), 60)
        if not committed and self.alive():
            self.counts["stuck"] += 1
            self.say(f"STUCK: after {name} healed, no snapshot committed within 60 s")
        return f"{name} mid-write; {'the next snapshot committed' if committed else 'the run ended'}"

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
