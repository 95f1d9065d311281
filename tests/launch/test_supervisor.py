"""The supervisor against a stand-in trainee, through the real CLI in real subprocesses.

The CLI runs in a subprocess whose ``gpusnap.launch.supervisor._trainee_command`` is swapped so
the supervisor starts FAKE_TRAINEE (below, stdlib only) directly instead of ``python -m
gpusnap.boot``; the stand-in speaks the control protocol the way the capture side will. Tests
of snapshots that the real trainee commits belong with the capture tests.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time

import pytest
from harness import _env

FAKE_TRAINEE = r'''
"""A stand-in for the trainee side, speaking the supervisor protocol with the stdlib only.

Started directly (``python fake_trainee.py MODE ...``) by tests/launch/test_supervisor.py, which swaps
``gpusnap.launch.supervisor._trainee_command`` so the supervisor runs this instead of
``python -m gpusnap.boot``. It writes its GPUSNAP_BOOT config to $FAKE_OUT/boot.json, then:

  serve       answer each snapshot request with honored/forked/committed; exit 75 after a
              committed stop request
  hang        connect, then ignore every request (the grace period runs out)
  skip        answer each request with "skipped"
  exit N      connect, then exit with status N
  slow S      wait S seconds before connecting, then serve
  garbage     send malformed messages after its hello, then serve
"""

import json
import os
import signal
import socket
import sys
import time

mode = sys.argv[1]
config = json.loads(os.environ["GPUSNAP_BOOT"])
out = os.environ["FAKE_OUT"]
with open(os.path.join(out, "boot.json.tmp"), "w") as f:
    json.dump({"config": config, "argv": sys.argv, "cwd": os.getcwd(), "pid": os.getpid()}, f)
os.rename(os.path.join(out, "boot.json.tmp"), os.path.join(out, "boot.json"))

if mode == "slow":
    time.sleep(float(sys.argv[2]))
    mode = "serve"

sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.connect(config["control"])


def send(msg):
    sock.sendall((json.dumps(msg) + "\n").encode())


send({"op": "hello", "pid": os.getpid()})
if mode == "garbage":
    sock.sendall(b"not json\n")
    for bad in ([1, 2], {"op": "launch"}, {"op": "event"}, {"op": "hello", "pid": "me"},
                {"op": "event", "event": "committed", "id": "000009", "stall_s": "fast"}):
        send(bad)
    mode = "serve"
signal.pthread_sigmask(signal.SIG_SETMASK, set())  # as the trainee does once its handlers are in place
if mode == "exit":
    sys.exit(int(sys.argv[2]))

received = open(os.path.join(out, "received.jsonl"), "a", buffering=1)
buf = b""
n = 0
while True:
    data = sock.recv(65536)
    if not data:
        sys.exit(9)
    buf += data
    *lines, buf = buf.split(b"\n")
    for line in lines:
        msg = json.loads(line)
        received.write(json.dumps(msg) + "\n")
        if mode == "hang":
            continue
        if mode == "skip":
            send({"op": "event", "event": "skipped", "message": "not enough host memory"})
            continue
        n += 1
        sid = f"{n:06d}"
        send({"op": "event", "event": "honored", "iteration": 10 * n, "where": "train.py:7 in <module>",
              "reason": msg["reason"]})
        send({"op": "event", "event": "forked", "id": sid, "stall_s": 0.012})
        send({"op": "event", "event": "committed", "id": sid, "stall_s": 0.012, "write_s": 2.1,
              "bytes_written": 1_200_000, "bytes_total": 480_000_000})
        if msg.get("stop"):
            sys.exit(75)
'''

# Runs the real CLI with the trainee command swapped for the stand-in (started as a plain
# `python SCRIPT ARGS`).
WRAPPER = textwrap.dedent("""
    import sys
    import gpusnap.launch.supervisor as s
    s._trainee_command = lambda kind, target, args: [sys.executable, target, *args]
    from gpusnap.cli import main
    main()
""")

# This checkout's gpusnap (harness._env puts it first on PYTHONPATH), whatever checkout the
# interpreter's editable install names.
ENV = _env({"GPUSNAP_SUPERVISOR_TICK_S": "0.05"})


@pytest.fixture
def work(tmp_path):
    (tmp_path / "fake.py").write_text(FAKE_TRAINEE)
    (tmp_path / "wrap.py").write_text(WRAPPER)
    (tmp_path / "out").mkdir()
    return tmp_path


def start(work, *cli_args, mode=("serve",)):
    env = {**ENV, "FAKE_OUT": str(work / "out")}
    return subprocess.Popen(
        [sys.executable, str(work / "wrap.py"), "run", "--dir", str(work / "rd"), *cli_args, "fake.py", *mode],
        cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def log_events(work) -> list[dict]:
    try:
        with open(work / "rd" / "log.jsonl") as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []


def wait_for(pred, timeout=10.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def wait_connected(work):
    wait_for(lambda: any(e.get("event") == "connected" for e in log_events(work)), what="trainee hello")


def received(work) -> list[dict]:
    try:
        with open(work / "out" / "received.jsonl") as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []


def boot_info(work) -> dict:
    return json.loads((work / "out" / "boot.json").read_text())


def gpusnap(*args, cwd):
    return subprocess.run([sys.executable, "-m", "gpusnap", *args], cwd=cwd, env=ENV,
                          capture_output=True, text=True, timeout=30)


def test_signal_snap_and_sigterm_commit_exit_75(work):
    p = start(work, "--keep", "2", "--signal", "usr2", "--instrument", "fake.py", "--at", "fake.py:3")
    try:
        wait_connected(work)
        info = json.loads((work / "rd" / "supervisor.json").read_text())
        assert info["pid"] == p.pid
        assert stat.S_IMODE(os.stat(info["socket"]).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(os.path.dirname(info["socket"])).st_mode) == 0o700

        boot = boot_info(work)
        cfg = boot["config"]
        assert cfg == {
            "run_dir": str(work / "rd"), "control": info["socket"], "signal": "SIGUSR2",
            "on_term": "snapshot", "keep": 2, "at": f"{work / 'fake.py'}:3",
            "instrument": [str(work / "fake.py")], "resume": None, "force": False, "verbosity": 1, "paranoid": False,
            "lock_token": json.loads((work / "rd" / "lock").read_text())["token"],
            "files": {"exclude": [], "max_bytes": None, "after": None},
        }
        assert boot["cwd"] == str(work)

        os.kill(p.pid, signal.SIGUSR2)
        wait_for(lambda: len(received(work)) == 1, what="the signal request")
        snap = gpusnap("snap", str(work / "rd"), cwd=work)
        assert snap.returncode == 0, snap.stderr
        assert snap.stderr.splitlines()[-1] == (
            "gpusnap: snapshot 000002 committed at iteration 20: stall 0.012 s, wrote 1.2 MB of 480 MB in 2.1 s")
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=20)
    finally:
        p.kill()
    assert p.returncode == 75, err
    assert [m["reason"] for m in received(work)] == ["signal", "request", "term"]
    assert received(work)[-1]["stop"] is True
    lines = err.splitlines()
    assert "gpusnap: snapshot 000001 committed at iteration 10: stall 0.012 s, wrote 1.2 MB of 480 MB in 2.1 s" in lines
    assert lines[-1] == "gpusnap: stopped after a committed snapshot: exit status 75 (requeue to continue)"
    trainee = [e for e in log_events(work) if e.get("source") == "trainee"]
    assert [e["event"] for e in trainee] == ["honored", "forked", "committed"] * 3
    assert all(isinstance(e["t"], float) for e in trainee)
    assert not (work / "rd" / "supervisor.json").exists()
    assert not os.path.exists(info["socket"])


def test_malformed_messages_from_the_program_are_refused_and_the_run_goes_on(work):
    p = start(work, mode=("garbage",))
    try:
        wait_for(lambda: len([e for e in log_events(work) if e.get("event") == "refused"]) == 6, what="refusals")
        os.kill(p.pid, signal.SIGUSR1)
        wait_for(lambda: any(e.get("event") == "committed" for e in log_events(work)), what="a commit")
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=20)
    finally:
        p.kill()
    assert p.returncode == 75, err
    refused = [(e["from"], e["why"]) for e in log_events(work) if e.get("event") == "refused"]
    assert refused == [
        ("the program", "not a JSON object: 'not json'"),
        ("the program", "not a JSON object: [1, 2]"),
        ("the program", "unknown op 'launch' (known: event, hello, snapshot, status)"),
        ("the program", "'event' without event"),
        ("the program", "'hello' with pid='me': not int"),
        ("the program", "'event' with stall_s='fast': not float"),
    ]
    assert [e["event"] for e in log_events(work) if e.get("source") == "trainee"] == ["honored", "forked", "committed"] * 2
    assert "refused" not in err  # one line in the log each; on stderr only with --verbose


def test_grace_over_kills_the_tree_exit_76(work):
    p = start(work, "--grace", "300ms", mode=("hang",))
    try:
        wait_connected(work)
        trainee_pid = boot_info(work)["pid"]
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=20)
    finally:
        p.kill()
    assert p.returncode == 76, err
    assert "gpusnap: --grace 300ms is over and no snapshot was committed: killing the program" in err
    assert err.splitlines()[-1] == "gpusnap: stopped without a new snapshot: exit status 76"
    with pytest.raises(ProcessLookupError):
        os.kill(trainee_pid, 0)


def test_requests_before_hello_are_queued(work):
    p = start(work, "--every", "100ms", mode=("slow", "0.6"))
    try:
        wait_for(lambda: (work / "rd" / "supervisor.json").exists(), what="supervisor.json")
        os.kill(p.pid, signal.SIGUSR1)
        wait_for(lambda: len(received(work)) >= 3, what="queued requests")
        p.send_signal(signal.SIGTERM)
        p.communicate(timeout=20)
    finally:
        p.kill()
    reasons = [m["reason"] for m in received(work)]
    assert "signal" in reasons and "timer" in reasons
    assert p.returncode == 75


def test_on_term_exit_forwards_sigterm(work):
    p = start(work, "--on-term", "exit", mode=("hang",))
    try:
        wait_connected(work)
        p.send_signal(signal.SIGTERM)
        p.communicate(timeout=20)
    finally:
        p.kill()
    assert p.returncode == 128 + signal.SIGTERM
    assert received(work) == []


def test_snap_skipped_and_no_wait(work):
    p = start(work, mode=("skip",))
    try:
        wait_connected(work)
        r = gpusnap("snap", str(work / "rd"), cwd=work)
        assert r.returncode == 5
        assert r.stderr.splitlines()[-2:] == [
            "gpusnap: snapshot skipped: not enough host memory",
            "hint: training goes on; earlier snapshots are intact",
        ]
        r = gpusnap("snap", "--no-wait", str(work / "rd"), cwd=work)
        assert r.returncode == 0
        assert r.stderr == "gpusnap: snapshot requested\n"
        p.send_signal(signal.SIGINT)  # not a terminal's foreground group: forwarded
        _, err = p.communicate(timeout=20)
    finally:
        p.kill()
    assert p.returncode == 128 + signal.SIGINT


def test_snap_fails_when_the_program_exits_first(work):
    p = start(work, mode=("hang",))
    try:
        wait_connected(work)
        snap = subprocess.Popen([sys.executable, "-m", "gpusnap", "snap", str(work / "rd")], cwd=work,
                                env=ENV, stderr=subprocess.PIPE, text=True)
        wait_for(lambda: len(received(work)) == 1, what="the request")
        os.kill(boot_info(work)["pid"], signal.SIGKILL)
        _, err = snap.communicate(timeout=20)
        p.communicate(timeout=20)
    finally:
        p.kill()
    assert snap.returncode == 5
    assert "gpusnap: snapshot failed: the program exited (status 137) before the snapshot was committed" in err
    assert p.returncode == 137


def test_status_passes_through_when_the_trainee_never_connects(work):
    (work / "crash.py").write_text("raise SystemExit(4)\n")
    r = subprocess.run([sys.executable, str(work / "wrap.py"), "run", "--dir", str(work / "rd"), "--every", "50ms",
                        "crash.py"], cwd=work, env=ENV, capture_output=True, text=True, timeout=30)
    assert r.returncode == 4, r.stderr


def test_restart_runs_the_same_command_from_a_snapshot(work):
    p = start(work, mode=("exit", "0"))
    p.communicate(timeout=20)
    assert p.returncode == 0
    # A committed snapshot, as far as the launcher looks at one: a manifest in snapshots/.
    (work / "rd" / "snapshots" / "000001.json").write_text(json.dumps({"format": 1, "buffers": {}}))
    (work / "out" / "boot.json").unlink()
    env = {**ENV, "FAKE_OUT": str(work / "out")}
    r = subprocess.run([sys.executable, str(work / "wrap.py"), "restart", str(work / "rd"), "--snapshot", "000001",
                        "--force", "--signal", "SIGUSR2"], cwd="/", env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert r.stderr.splitlines()[0] == "gpusnap: resuming from snapshot 000001"
    boot = boot_info(work)
    assert boot["cwd"] == str(work)
    assert boot["argv"][1:] == ["exit", "0"]
    assert boot["config"]["resume"] == {"snapshot": "000001"}
    assert boot["config"]["force"] is True
    assert boot["config"]["signal"] == "SIGUSR2"

    r = gpusnap("restart", str(work / "rd"), "--snapshot", "000007", cwd=work)
    assert r.returncode == 4
    assert r.stderr.splitlines()[0] == f"gpusnap: no snapshot 000007 in {work / 'rd'}"


def test_resume_auto_skips_snapshots_that_do_not_verify(work):
    p = start(work, mode=("exit", "1"))  # runs that do not end well: the same command continues them
    p.communicate(timeout=20)
    snaps = work / "rd" / "snapshots"
    (snaps / "000001.json").write_text(json.dumps({"format": 1, "buffers": {}, "iteration": 40}))
    (snaps / "000002.json").write_text('{"format": 1, "buf')
    p = start(work, mode=("exit", "1"))
    _, err = p.communicate(timeout=20)
    assert p.returncode == 1, err
    lines = err.splitlines()
    assert lines[0].startswith("gpusnap: skipping snapshot 000002: ")
    assert lines[1] == "gpusnap: resuming from snapshot 000001 (iteration 40)"
    assert boot_info(work)["config"]["resume"] == {"snapshot": "000001"}

    p = start(work, "--resume", "never", mode=("exit", "1"))
    _, err = p.communicate(timeout=20)
    assert p.returncode == 1 and err == ""
    assert boot_info(work)["config"]["resume"] is None

    r = gpusnap("run", "--dir", str(work / "rd"), "--resume", "000002", "fake.py", "exit", "1", cwd=work)
    assert r.returncode == 4
    assert r.stderr.startswith("gpusnap: manifest of snapshot 000002 is damaged: ")
