"""The trainee side of a snapshot: requests, safe points, fork, and the writer's result.

Flow of one snapshot (DESIGN.md, Snapshot pipeline)::

    request()            signal handler / control thread / gpusnap.snapshot(): set loops.pending
    _on_boundary(loop)   every main-thread loop boundary while pending: is this a safe point?
    _snapshot(loop)      quiesce, stage, check headroom, fork  <- the stall ends here
      child:  writer.write_snapshot(job) -> result on a pipe -> os._exit
      parent: a waiter thread reads the result, reaps the child, reports to the supervisor

A safe point is a boundary of the *step loop* (the innermost loop running when an optimizer
step starts, or the loop `--at` names); while no step loop is running (setup, evaluation) any
main-thread boundary serves. Either way it must be a place replay can return to: every frame from
the script's module frame down to the loop is instrumented code (never a model's forward called
back from torch.optim, never a loop inside a generator or a library: ``capture.safepoints``).
At most one writer runs; a request during a write is coalesced into one snapshot taken after it. A stop request (SIGTERM) waits for its writer and exits with
EXIT_PREEMPTED once the snapshot is committed.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import sys
import threading
import time
import warnings
import weakref

from gpusnap import knobs, stage
from gpusnap.capture import safepoints
from gpusnap.graph import rng
from gpusnap.errors import EXIT_PREEMPTED, EXIT_PREEMPTED_UNSAVED
from gpusnap.instrument import loops

_config: dict = {}
_rundir = None
_control = None  # socket to the supervisor
_send_lock = threading.Lock()
_requests: list[tuple[str, bool]] = []
_writer = None  # the running _Writer, if any
_coalesced_said = False
# (id(code), loop_id) -> code: ids hash in nanoseconds, a code object's hash is recomputed (about
# 1 us) at every lookup; holding the code keeps its id its own.
_step_loops: dict = {}
_steps = 0  # optimizer steps seen (two optimizers in one iteration count twice)
_iterations = 0  # iterations of step loops in which an optimizer stepped: what snapshots report
_last_stepping = (lambda: None, -1)  # (weak ActiveLoop, index) of the last iteration counted
_resumed_from = None
_optimizers = weakref.WeakSet()  # every optimizer that stepped: what the drain copies first
_prepared = False  # stage.prepare has run since the last writer ended and the last new optimizer
_note_source = None  # fastforward.part, handed over by boot
_stepper_checked = False  # the first optimizer step looked for a step loop gpusnap cannot reach


# -- install -------------------------------------------------------------------------------
def install(config: dict, note_source) -> None:
    """Called by gpusnap.boot before the first line of the program runs. ``note_source(source)``
    is what fast-forward will need of a loop's source (restore's ``fastforward.part``): capture
    takes the notes, restore reads them."""
    global _config, _rundir, _resumed_from, _note_source
    _note_source = note_source
    _config = dict(config)
    os.register_at_fork(after_in_child=loops.reset_after_fork_in_child)
    if not _config.get("run_dir"):
        return
    import psutil  # noqa: F401  (the headroom check runs inside the stall)

    from gpusnap.capture import writer  # noqa: F401  (every forked writer would import it again)
    from gpusnap.store import RunDir, preload

    preload()
    _rundir = RunDir.open(_config["run_dir"], trusted=True)
    resume = _config.get("resume") or {}
    _resumed_from = resume.get("snapshot")
    loops.on_boundary = _on_boundary
    _install_signals()
    _connect(_config.get("control"))
    _watch_optimizers()
    atexit.register(_wait_for_writer_at_exit)
    loops.describe_source = _describe_source
    loops.capture_rng = rng.compact


def resuming():
    """(run directory, snapshot id) when this run restarts from a snapshot, else None: boot
    then installs the replay, handing it ``emit`` and ``resumed``."""
    return (_rundir, _resumed_from) if _resumed_from is not None else None


def emit(event: str, **fields) -> None:
    _emit(event, **fields)


def _install_signals() -> None:
    name = _config.get("signal") or "SIGUSR1"
    signum = getattr(signal, name if name.startswith("SIG") else "SIG" + name)
    signal.signal(signum, lambda *_: request("signal"))
    if _config.get("on_term", "snapshot") == "snapshot":
        signal.signal(signal.SIGTERM, lambda *_: request("term", stop=True))


def _connect(path: str | None) -> None:
    global _control
    if not path:
        return
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError as exc:
        sock.close()
        print(f"gpusnap: no supervisor at {path} ({exc.strerror}); snapshots on signal still work", file=sys.stderr)
        return
    _control = sock
    _send({"op": "hello", "pid": os.getpid()})
    threading.Thread(target=_read_control, args=(sock,), name="gpusnap-control", daemon=True).start()


def _read_control(sock) -> None:
    for line in sock.makefile("r", encoding="utf-8"):
        try:
            message = json.loads(line)
        except ValueError:
            continue
        if message.get("op") == "snapshot":
            request(message.get("reason", "request"), stop=bool(message.get("stop")))


def _send(message: dict) -> None:
    if _control is None:
        return
    data = (json.dumps(message, default=str) + "\n").encode()
    with _send_lock:
        try:
            _control.sendall(data)
        except OSError:
            pass  # the supervisor is gone; training goes on


def _emit(event: str, **fields) -> None:
    _send({"op": "event", "event": event, **fields})


# -- step loop detection -------------------------------------------------------------------
def _watch_optimizers() -> None:
    if "torch.optim.optimizer" in sys.modules:
        _hook_optimizers(sys.modules["torch.optim.optimizer"])
    else:
        sys.meta_path.insert(0, _AfterImport("torch.optim.optimizer", _hook_optimizers))


def _hook_optimizers(module) -> None:
    module.register_optimizer_step_pre_hook(_before_optimizer_step)
    module.register_optimizer_step_post_hook(_after_optimizer_step)


def _before_optimizer_step(optimizer, *_):
    """Before the step runs (LBFGS's closure calls the model from inside it): know the step loop,
    so that no boundary inside the step is taken for a safe point."""
    global _iterations, _last_stepping
    if loops.replaying is not None:
        loops.replaying()
    for i in range(len(loops.ACTIVE) - 1, -1, -1):
        loop = loops.ACTIVE[i]
        if loop.frame.f_back is not None:  # a suspended generator's frame has no caller
            code = loop.frame.f_code
            _step_loops[(id(code), loop.loop_id)] = code
            _mark_enclosing(i)
            if _last_stepping[0]() is not loop or _last_stepping[1] != loop.index:
                _iterations += 1  # the GAN's second optimizer in the same iteration does not count
                _last_stepping = (weakref.ref(loop), loop.index)  # never keeps a frame alive
            break
    if not _stepper_checked:
        _check_stepper(sys._getframe(1))


def _after_optimizer_step(optimizer, *_):
    global _steps, _prepared
    _steps += 1
    if optimizer not in _optimizers:
        _optimizers.add(optimizer)
        _prepared = False  # its state exists from its first step on
    if not _prepared and _writer is None and _config.get("run_dir") and knobs.DRAIN != "off":
        _prepared = True  # until a new optimizer steps or a writer has finished
        stage.prepare(list(_optimizers))


def _mark_enclosing(i: int) -> None:
    """The running loops outside ``ACTIVE[i]`` record their RNG states at each iteration start
    from now on (fast-forward gives them back to the body prefix it reruns)."""
    for loop in loops.ACTIVE[:i]:
        if type(loop) is loops.ActiveLoop and loop.frame.f_back is not None:
            loop.__class__ = loops.EnclosingLoop


def _describe_source(loop, source):
    """``loops.describe_source``: the fast-forward note of a loop that may be on a snapshot's
    path. A loop that starts inside a running step loop's body ends before that loop's next
    boundary, the only safe point while it runs, so it needs none (unless it is a step loop
    itself): this keeps the cost of taking RNG states out of training steps."""
    try:
        part = _note_source(source)
    except Exception:  # an adapter that cannot read this source: consumed, and checked, on replay
        part = {"kind": "iter"}
    if part is None or _inside_step_body(loop):
        return None
    return {**part, "rng": rng.compact()}


def _inside_step_body(loop) -> bool:
    if not _step_loops and not _config.get("at"):
        return False
    if _is_step_loop(loop):
        return False
    for other in loops.ACTIVE:
        if _is_step_loop(other) and other.frame.f_back is not None:
            return True
    return False


class _AfterImport:
    """A meta path entry that runs ``callback(module)`` right after ``name`` is imported."""

    def __init__(self, name: str, callback):
        self.name, self.callback = name, callback

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        import importlib.util

        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        exec_module, callback = spec.loader.exec_module, self.callback

        def exec_then_hook(module):
            exec_module(module)
            callback(module)

        spec.loader.exec_module = exec_then_hook
        return spec


def _at_matches(loop) -> bool:
    at = _config.get("at")
    if not at:
        return False
    file, _, line = at.rpartition(":")
    code_file = loop.frame.f_code.co_filename
    return loop.loop_id.split(":")[0] == line and (code_file == file or code_file.endswith("/" + file.lstrip("./")))


def _check_stepper(frame) -> None:
    """Once, at the first optimizer step: if a loop in code gpusnap does not instrument (a
    framework's trainer) runs the steps, say so now, not when a snapshot never comes."""
    global _stepper_checked
    _stepper_checked = True
    found = safepoints.uninstrumented_step_loop(frame)
    if found is not None:
        where, modules = found
        option = " ".join(f"--instrument {module}" for module in modules)
        print(
            f"gpusnap: the optimizer steps inside a loop at {where}, which gpusnap does not instrument: "
            f"a snapshot waits for a loop boundary of your own code ({option} instruments the way there)",
            file=sys.stderr,
            flush=True,
        )


def _is_step_loop(loop) -> bool:
    return (id(loop.frame.f_code), loop.loop_id) in _step_loops or _at_matches(loop)


def _is_safe_point(loop) -> bool:
    if not safepoints.returnable(loop.frame):
        return False
    if _is_step_loop(loop):
        return True
    # A step loop further out is running: wait for its own boundary.
    return not any(_is_step_loop(other) and other.frame.f_back is not None for other in loops.ACTIVE)


# -- requests and safe points --------------------------------------------------------------
def request(reason: str, stop: bool = False) -> None:
    # No lock: this runs inside signal handlers, which interrupt the main thread wherever it is
    # (a lock held there would deadlock). list.append is atomic under the GIL.
    _requests.append((reason, stop))
    loops.pending = True


def request_from_program(reason: str) -> bool:
    if _rundir is None:
        warnings.warn("gpusnap.snapshot() does nothing: this program is not running under `gpusnap run`", stacklevel=3)
        return False
    request(reason)
    return True


def resumed(snap_id: str, steps: int, iteration: int | None) -> None:
    """The replay merged snapshot ``snap_id``: count steps and iterations on from it."""
    global _steps, _iterations, _resumed_from
    _steps, _resumed_from = steps, snap_id
    _iterations = iteration if iteration is not None and steps else 0


def _on_boundary(loop) -> None:
    global _coalesced_said
    if loops.replaying is not None:
        return  # nothing to snapshot until the replay has merged its snapshot
    stop = any(s for _, s in list(_requests))
    running = _writer
    if running is not None and not stop:
        if not _coalesced_said:
            _coalesced_said = True
            _emit("coalesced", id=running.snap_id, reason=_requests[0][0] if _requests else "?")
        return
    if not _is_safe_point(loop):
        return
    _snapshot(loop)


def _snapshot(loop) -> None:
    global _coalesced_said
    requested_s = time.perf_counter()
    loops.pending = False
    reasons = list(_requests)
    del _requests[: len(reasons)]  # a request that lands meanwhile stays for the next boundary
    if _requests:
        loops.pending = True
    stop = any(s for _, s in reasons)
    reason = "term" if stop else reasons[0][0] if reasons else "request"
    iteration = _iterations if _iterations else loop.index
    if loop in loops.ACTIVE:
        _mark_enclosing(loops.ACTIVE.index(loop))
    _emit("honored", reason=reason, iteration=iteration, where=loop.where())
    running = _writer
    if running is not None:  # only a stop request gets here with a writer running
        running.thread.join()
    _coalesced_said = False

    stage.quiesce()
    staged = stage.stage()
    refusal = _headroom_refusal() or stage.unstaged_device_memory()
    if refusal is not None:
        if _control is None:  # otherwise the supervisor prints the event
            print(f"gpusnap: snapshot skipped: {refusal}", file=sys.stderr, flush=True)
        _emit("skipped", reason=reason, message=refusal)
        if stop:
            _exit(EXIT_PREEMPTED_UNSAVED)
        return
    from gpusnap.capture.writer import WriteJob  # imported at install: free here

    job = WriteJob(
        run_dir=_config["run_dir"],
        snap_id=_rundir.next_snapshot_id(),
        frame=loop.frame,
        active_loops=list(loops.ACTIVE),
        rng_states=rng.capture(),
        requested_s=requested_s,
        iteration=iteration,
        reason=reason,
        resumed_from=_resumed_from,
        keep=_config.get("keep"),
        steps=_steps,
        sources=_sources(),
        staged=staged,
        pool=stage.host_pool() if knobs.DRAIN != "off" else None,
        optimizers=list(_optimizers),
    )
    stage.writer_starting()
    try:
        writer = _start_writer(job)
    except OSError as exc:  # fork itself failed (no memory, process limit): training goes on
        stage.writer_done()
        message = f"could not fork the writer: {exc.strerror or exc}"
        if _control is None:
            print(f"gpusnap: snapshot {job.snap_id} failed: {message}", file=sys.stderr, flush=True)
        _emit("failed", id=job.snap_id, message=message)
        if stop:
            _exit(EXIT_PREEMPTED_UNSAVED)
        return
    if stop:
        writer.thread.join()
        _exit(EXIT_PREEMPTED if _writer_last_result.get("event") == "committed" else EXIT_PREEMPTED_UNSAVED)


def _sources() -> dict:
    try:
        from gpusnap.instrument.importer import SOURCES
    except ImportError:
        return {}
    return dict(SOURCES)


def _headroom_refusal() -> str | None:
    import psutil

    rss = psutil.Process().memory_info().rss
    available = psutil.virtual_memory().available
    if rss > available * knobs.HEADROOM_FRACTION:
        return (
            f"copy-on-write worst case {rss / 2**30:.1f} GiB exceeds "
            f"{knobs.HEADROOM_FRACTION:.0%} of the {available / 2**30:.1f} GiB available"
        )
    return None


# -- the writer process --------------------------------------------------------------------
_writer_last_result: dict = {}


class _Writer:
    def __init__(self, pid: int, snap_id: str, read_fd: int, stall_s: float):
        self.pid, self.snap_id, self.read_fd, self.stall_s = pid, snap_id, read_fd, stall_s
        self.thread = threading.Thread(target=self._wait, name="gpusnap-writer-wait", daemon=True)

    def _wait(self) -> None:
        global _writer, _writer_last_result, _prepared
        chunks = []
        while True:
            data = os.read(self.read_fd, 65536)
            if not data:
                break
            chunks.append(data)
        os.close(self.read_fd)
        _, status = os.waitpid(self.pid, 0)
        try:
            result = json.loads(b"".join(chunks) or b"{}")
        except ValueError:
            result = {}
        if not result:
            how = f"killed by signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else f"exit {os.waitstatus_to_exitcode(status)}"
            result = {"event": "failed", "message": f"writer process {self.pid} died ({how}); earlier snapshots are intact"}
        result.setdefault("id", self.snap_id)
        if result.get("event") == "failed":
            print(f"gpusnap: snapshot {self.snap_id} failed: {result.get('message')}", file=sys.stderr, flush=True)
        _writer_last_result = result
        _writer = None
        stage.writer_done()
        _prepared = False  # the next optimizer step readies memory for the next snapshot
        _emit(**result)


def _start_writer(job) -> "_Writer":
    global _writer
    read_fd, write_fd = os.pipe()
    with warnings.catch_warnings():
        # Python >= 3.12 warns about fork() in a threaded process. The child runs only
        # fork-safe code (no CUDA, no torch operators, no locks other threads may hold).
        warnings.filterwarnings("ignore", category=DeprecationWarning, message=".*fork.*")
        pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        _child_main(job, write_fd)
    os.close(write_fd)
    stall_s = time.perf_counter() - job.requested_s
    writer = _writer = _Writer(pid, job.snap_id, read_fd, stall_s)
    _emit("forked", id=job.snap_id, stall_s=stall_s, iteration=job.iteration)
    writer.thread.start()
    return writer


def _child_main(job, write_fd: int) -> None:
    code = 1
    try:
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(signum, signal.SIG_IGN)  # finish the write; the supervisor kills on --grace
        if "blosc2" in sys.modules:
            sys.modules["blosc2"].free_resources()  # its thread pool did not survive fork
        from gpusnap.capture.writer import write_snapshot

        result = write_snapshot(job)
        code = 0
    except BaseException as exc:  # noqa: BLE001 - every failure becomes a report
        result = {"event": "failed", "id": job.snap_id, "message": _describe(exc)}
    try:
        os.write(write_fd, json.dumps(result, default=str).encode())
    finally:
        os._exit(code)


def _describe(exc: BaseException) -> str:
    message = getattr(exc, "message", None) or str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {message}"


def _wait_for_writer_at_exit() -> None:
    writer = _writer
    if writer is not None:
        writer.thread.join()


def _exit(code: int) -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(code)
