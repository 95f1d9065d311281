"""A journal whose pickling takes its lock, and a thread that holds that lock from step HOLD_FROM
to step HOLD_TO: a writer forked meanwhile waits forever for its copy of the lock, as any forked
child does for a lock that another thread held at fork (that thread does not exist in the child).
usage: held_lock.py OUT STEPS HOLD_FROM HOLD_TO"""

import sys
import threading
import time

from pace import finish, progress


class Journal:
    """Thread-safe, and pickled as a consistent copy, under its lock."""

    def __init__(self):
        self.lock = threading.Lock()
        self.lines = []

    def add(self, line):
        with self.lock:
            self.lines.append(line)

    def __getstate__(self):
        with self.lock:
            return {"lines": list(self.lines)}

    def __setstate__(self, state):
        self.lock = threading.Lock()
        self.lines = state["lines"]


journal = Journal()
hold, release = threading.Event(), threading.Event()


def flusher():
    hold.wait()
    with journal.lock:
        release.wait()


steps, hold_from, hold_to = map(int, sys.argv[2:5])
threading.Thread(target=flusher, daemon=True).start()
for step in range(steps):
    if step == hold_from:
        hold.set()
        while not journal.lock.locked():
            time.sleep(0.001)
    if step == hold_to:
        release.set()
        while journal.lock.locked():
            time.sleep(0.001)
    if not hold_from <= step < hold_to:
        journal.add(f"step {step}")
    progress(step + 1)
finish(lines=journal.lines)
