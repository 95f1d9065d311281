"""The trainee's gpusnap session: the state the agent's parts share (requests and control in
``control``, the step loop in ``steploop``, the writer process in ``fork``, the snapshot itself in
``agent``). Plain module globals, read and written as ``session.NAME``."""

from __future__ import annotations

import weakref

config: dict = {}  # GPUSNAP_BOOT's object, as boot read it
rundir = None  # the RunDir, open for the whole run; None when not under `gpusnap run`
resumed_from: str | None = None  # the snapshot this run restarted from, then the last one merged
writer = None  # the running fork.Writer, if any: at most one runs
last_result: dict = {}  # the last writer's report
last_bytes_total = 0  # raw bytes the last committed snapshot held (the next writer's pace)
windows_nbytes = 0  # the next writer's pack windows, allocated ahead (0: none; fork.Writer sets it)
disk_full = False  # a snapshot of this run failed for lack of space: retention runs before each write
steps = 0  # optimizer steps seen (two optimizers in one iteration count twice)
iterations = 0  # iterations of step loops in which an optimizer stepped: what snapshots report
optimizers = weakref.WeakSet()  # every optimizer that stepped: what the drain copies first
prepared = False  # stage.prepare has run since the last writer ended and the last new optimizer
schedule: dict | None = None  # the supervisor's timer and the overhead it measured: in the next manifest
dist = None  # capture.dist.coordinator's Coordinator in a rank of a torchrun job (global snapshots), else None
