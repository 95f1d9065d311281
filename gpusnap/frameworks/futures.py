"""``concurrent.futures.Future``: the future of an async save (``pool.submit(torch.save, ...)``,
torch.distributed.checkpoint's ``async_save``), kept until the next save waits on it.

A future made after setup has no counterpart in the replay, so restore takes the snapshot's,
whose condition variable was not captured (live-only). One that was done at the snapshot needs
nothing else: nothing will notify it again, and ``result()`` only takes the condition to read
what the snapshot holds. So once merged, each such future gets a new condition. One that was
still running keeps the placeholder: its work is gone with the process that did it, and the
program's first use of it is the restore's refusal (``graph.load.NotCaptured``), never a wait
that no thread would end. A snapshot waits for such futures first, within a bound
(``capture.safepoints.inflight``).

An executor is live-only, kept as the replay made it: merged, the replay's pool took the run's
count of threads (placeholders) and started none, and the restart's first ``submit`` waited for
ever (``tests/programs/corpus/async_eval.py``).
"""

from __future__ import annotations

import sys
import threading

from gpusnap.capture.pickling import pickler
from gpusnap.graph.load import LiveOnly
from gpusnap.restore import replay

pickler.LIVE_NAMES.add("concurrent.futures._base.Executor")


def _give_done_futures_a_condition(objects) -> None:
    base = sys.modules.get("concurrent.futures._base")
    if base is None:
        return
    done = (base.FINISHED, base.CANCELLED_AND_NOTIFIED)
    for future in objects:
        if isinstance(future, base.Future) and isinstance(future.__dict__.get("_condition"), LiveOnly) and future._state in done:
            future._condition = threading.Condition()


replay.AFTER_MERGE["giving the futures made after setup and done a condition"] = _give_done_futures_a_condition
