"""`gpusnap run` / `restart` / `snap` through the real CLI and the real trainee bootstrap, in real
subprocesses: exit status and argv pass through, bad input is refused with one line and touches
nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

ENV = {**os.environ, "GPUSNAP_SUPERVISOR_TICK_S": "0.05"}


def gpusnap(*args, cwd, timeout=60, env=None):
    return subprocess.run([sys.executable, "-m", "gpusnap", *args], cwd=cwd, env={**ENV, **(env or {})},
                          capture_output=True, text=True, timeout=timeout)


def first_line(r) -> str:
    return r.stderr.splitlines()[0] if r.stderr else ""


@pytest.fixture
def work(tmp_path):
    (tmp_path / "ok.py").write_text("print('ok')\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    return tmp_path


def test_exit_status_passes_through(work):
    (work / "three.py").write_text("import sys\nfor i in range(3):\n    pass\nsys.exit(3)\n")
    r = gpusnap("run", "three.py", cwd=work)
    assert r.returncode == 3, r.stderr
    assert (work / "gpusnap-runs" / "three" / "run.json").exists()


def test_killed_by_signal_is_128_plus_n(work):
    (work / "die.py").write_text("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    r = gpusnap("run", "--dir", "d", "die.py", cwd=work)
    assert r.returncode == 128 + signal.SIGKILL
    # A kill the supervisor did not send (kill -9, the OOM killer) is said, with the way on.
    assert "gpusnap: the program was killed by SIGKILL (if nothing else sent it, the kernel's out-of-memory killer did" in r.stderr
    assert f"hint: `gpusnap restart {work / 'd'}` continues from the last committed snapshot" in r.stderr


def test_argv_cwd_and_stdio_are_the_programs(work):
    (work / "show.py").write_text(
        "import json, os, sys\n"
        "print(json.dumps({'argv': sys.argv, 'cwd': os.getcwd(), 'stdin': sys.stdin.read(),\n"
        "                  'pgid': os.getpgid(0), 'ppid': os.getppid()}))\n"
    )
    args = ["--lr", "3", "--dir", "x", "-m", "y", "--every", "bogus", "--help", "--", "z"]
    p = subprocess.run([sys.executable, "-m", "gpusnap", "run", "--dir", "d", "show.py", *args], cwd=work, env=ENV,
                       input="hello", capture_output=True, text=True, timeout=60, start_new_session=True)
    assert p.returncode == 0, p.stderr
    seen = json.loads(p.stdout)
    assert seen["argv"] == ["show.py", *args]
    assert seen["cwd"] == str(work)
    assert seen["stdin"] == "hello"
    assert seen["pgid"] == seen["ppid"]  # the supervisor's group (a new session made it leader)
    assert not (work / "x").exists()


def test_module_runs_with_its_args(work):
    (work / "pkg" / "train.py").write_text("import sys\nprint(sys.argv[1:])\nsys.exit(7)\n")
    r = gpusnap("run", "-m", "pkg.train", "--dir", "q", cwd=work)
    assert r.returncode == 7, r.stderr
    assert r.stdout == "['--dir', 'q']\n"
    assert (work / "gpusnap-runs" / "pkg.train" / "run.json").exists()
    assert not (work / "q").exists()


def test_boot_config_reaches_the_program(work):
    (work / "cfg.py").write_text("import os\nprint(os.environ['GPUSNAP_BOOT'])\n")
    r = gpusnap("run", "--dir", "d", "--keep", "3", "--signal", "SIGUSR2", "--on-term", "exit", "cfg.py", cwd=work)
    assert r.returncode == 0, r.stderr
    cfg = json.loads(r.stdout)
    assert cfg["run_dir"] == str(work / "d")
    assert cfg["signal"] == "SIGUSR2" and cfg["on_term"] == "exit" and cfg["keep"] == 3
    assert cfg["resume"] is None and cfg["at"] is None and cfg["instrument"] == []
    assert len(cfg["control"]) <= 107


BAD_INPUT = [
    (["run", "nope.py"], 2, "gpusnap: no such script: nope.py"),
    (["run"], 2, "gpusnap: no script to run"),
    (["run", "--bogus", "ok.py"], 2, "gpusnap: no such option: --bogus"),
    (["run", "-m", "not a module"], 2, "gpusnap: not a module name: 'not a module'"),
    (["run", "-m", "nosuch.module"], 2,
     "gpusnap: no module named nosuch.module ('nosuch' is not in the working directory or on sys.path)"),
    (["run", "-m", "pkg.nope"], 2, "gpusnap: no module named pkg.nope (package 'pkg' has no 'nope')"),
    (["run", "-m", "pkg"], 2, "gpusnap: pkg is a package without a __main__ module: python -m cannot run it"),
    (["run", "--dir", "d", "-m", "nosuch"], 2,
     "gpusnap: no module named nosuch ('nosuch' is not in the working directory or on sys.path)"),
    (["run", "--dir", "d", "nope.py"], 2, "gpusnap: no such script: nope.py"),
    (["run", "--signal", "FOO", "ok.py"], 2, "gpusnap: unknown signal name 'FOO' for --signal"),
    (["run", "--signal", "KILL", "ok.py"], 2, "gpusnap: --signal cannot be KILL: it already means something"),
    (["run", "--every", "10x", "ok.py"], 2, "gpusnap: malformed duration '10x' for --every"),
    (["run", "--every", "0", "ok.py"], 2, "gpusnap: --every must be longer than 0 s, not '0'"),
    (["run", "--grace", "1h30", "ok.py"], 2, "gpusnap: malformed duration '1h30' for --grace"),
    (["run", "--keep", "0", "ok.py"], 2, "gpusnap: --keep takes a number of snapshots >= 1, not '0'"),
    (["run", "--at", "ok.py", "ok.py"], 2, "gpusnap: --at takes FILE:LINE, not 'ok.py'"),
    (["run", "--at", "gone.py:3", "ok.py"], 2, "gpusnap: --at names a file that does not exist: gone.py"),
    (["run", "--instrument", "no/such/dir", "ok.py"], 2,
     "gpusnap: --instrument no/such/dir: no such file or directory, and not a module name"),
    (["run", "--on-term", "maybe", "ok.py"], 2, None),  # click's own message for a choice
]


@pytest.mark.parametrize("args,code,line", BAD_INPUT, ids=[" ".join(a[1:]) for a, _, _ in BAD_INPUT])
def test_bad_input_is_refused_and_touches_nothing(work, args, code, line):
    before = sorted(os.listdir(work))
    r = gpusnap(*args, cwd=work)
    assert r.returncode == code, r.stderr
    if line is not None:
        assert first_line(r) == line
        assert r.stderr.splitlines()[1].startswith("hint: ")
    assert sorted(os.listdir(work)) == before


BAD_KNOBS = [
    ({"GPUSNAP_DRAIN": "sometimes"}, "gpusnap: GPUSNAP_DRAIN='sometimes' is not one of keep, release, off"),
    ({"GPUSNAP_CODEC": "gzip"}, "gpusnap: GPUSNAP_CODEC='gzip' is not one of auto, zstd, lz4, none"),
    ({"GPUSNAP_CHUNK_BYTES": "4M"}, "gpusnap: GPUSNAP_CHUNK_BYTES='4M' is not an integer"),
    ({"GPUSNAP_WRITER_PRIORITY": "low"}, "gpusnap: GPUSNAP_WRITER_PRIORITY='low' is not idle or a nice value"),
    ({"GPUSNAP_HUGEPAGES": "yes"}, "gpusnap: GPUSNAP_HUGEPAGES='yes' is not one of on, off"),
    ({"GPUSNAP_WRITER_TIMEOUT_S": "-5"}, "gpusnap: GPUSNAP_WRITER_TIMEOUT_S='-5' is not a number of seconds >= 0"),
    ({"GPUSNAP_DIST_TIMEOUT_S": "0"}, "gpusnap: GPUSNAP_DIST_TIMEOUT_S='0' is not a number of seconds > 0"),
]


@pytest.mark.parametrize("env,line", BAD_KNOBS, ids=[next(iter(e)) for e, _ in BAD_KNOBS])
def test_a_bad_setting_in_the_environment_is_refused_and_touches_nothing(work, env, line):
    before = sorted(os.listdir(work))
    r = gpusnap("run", "--dir", "d", "ok.py", cwd=work, env=env)
    assert r.returncode == 2, r.stderr
    assert first_line(r) == line
    assert r.stderr.splitlines()[1].startswith("hint: ")
    assert sorted(os.listdir(work)) == before


def test_resume_id_on_a_fresh_dir_touches_nothing(work):
    r = gpusnap("run", "--dir", "d", "--resume", "000004", "ok.py", cwd=work)
    assert r.returncode == 4
    assert first_line(r) == f"gpusnap: no snapshot 000004 in {work / 'd'}: it holds no run yet"
    assert not (work / "d").exists()


def test_resume_id_absent_in_an_existing_run(work):
    assert gpusnap("run", "--dir", "d", "ok.py", cwd=work).returncode == 0
    r = gpusnap("run", "--dir", "d", "--resume", "000004", "ok.py", cwd=work)
    assert r.returncode == 4
    assert first_line(r) == f"gpusnap: no snapshot 000004 in {work / 'd'}"


def test_the_same_command_after_a_clean_end_starts_over_and_restart_still_continues(work):
    (work / "count.py").write_text(
        "import gpusnap, sys\n"
        "total = 0\n"
        "for i in range(6):\n"
        "    if i == 3 and not sys.argv[1:]:\n"
        "        gpusnap.snapshot()\n"
        "    total += i\n"
        "    print(i, flush=True)\n")
    first = gpusnap("run", "--dir", "d", "count.py", cwd=work)
    assert first.returncode == 0 and first.stdout.split() == [str(i) for i in range(6)], first.stderr
    assert "committed at iteration" in first.stderr
    again = gpusnap("run", "--dir", "d", "count.py", cwd=work)
    assert again.returncode == 0, again.stderr
    assert "ran to its end last time: starting from the beginning" in again.stderr
    assert again.stdout.split() == [str(i) for i in range(6)]
    # Explicit restart continues from the snapshot: only the iterations after it print again.
    cont = gpusnap("restart", "d", cwd=work)
    assert cont.returncode == 0, cont.stderr
    assert "resuming from snapshot" in cont.stderr and len(cont.stdout.split()) < 6


def test_directory_of_another_command_is_refused(work):
    (work / "other.py").write_text("pass\n")
    assert gpusnap("run", "--dir", "d", "ok.py", "--a", cwd=work).returncode == 0
    assert gpusnap("run", "--dir", "d", "ok.py", "--a", cwd=work).returncode == 0  # same command: reused
    r = gpusnap("run", "--dir", "d", "other.py", "--a", cwd=work)
    assert r.returncode == 3
    assert first_line(r) == (
        f"gpusnap: {work / 'd'} belongs to another command: the script differs "
        f"({str(work / 'ok.py')!r} there, {str(work / 'other.py')!r} here)")
    r = gpusnap("run", "--dir", "d", "ok.py", "--b", cwd=work)
    assert r.returncode == 3
    assert "the argument list differs (['--a'] there, ['--b'] here)" in first_line(r)


def test_a_foreign_directory_is_refused(work):
    (work / "d").mkdir()
    (work / "d" / "notes.txt").write_text("mine")
    r = gpusnap("run", "--dir", "d", "ok.py", cwd=work)
    assert r.returncode == 3
    assert first_line(r) == f"gpusnap: {work / 'd'} is a non-empty directory that is not a gpusnap run directory"
    assert os.listdir(work / "d") == ["notes.txt"]


def test_unwritable_directory_is_refused(work):
    if os.geteuid() == 0:
        # Root passes every mode check; sysfs refuses mkdir even to root.
        target = "/sys/gpusnap-test/run"
        expected = "gpusnap: cannot write /sys/gpusnap-test: Operation not permitted"
    else:
        (work / "ro").mkdir(mode=0o500)
        target = str(work / "ro" / "run")
        expected = f"gpusnap: cannot create run directory {target}: {work / 'ro'} is not writable"
    r = gpusnap("run", "--dir", target, "ok.py", cwd=work)
    assert r.returncode == 3
    assert first_line(r) == expected
    assert not os.path.exists(target)


def test_read_only_run_directory_is_refused_even_to_root(work):
    assert gpusnap("run", "--dir", "d", "ok.py", cwd=work).returncode == 0
    os.chmod(work / "d", 0o500)
    try:
        r = gpusnap("run", "--dir", "d", "ok.py", cwd=work)
    finally:
        os.chmod(work / "d", 0o700)
    assert r.returncode == 3
    assert first_line(r) in (f"gpusnap: {work / 'd'} is read-only (mode 0500)",
                             f"gpusnap: cannot write to run directory {work / 'd'}: {work / 'd'} is not writable")


def test_snap_without_an_active_run(work):
    r = gpusnap("snap", "nowhere", cwd=work)
    assert r.returncode == 3
    assert first_line(r) == f"gpusnap: no run directory {work / 'nowhere'}"
    assert gpusnap("run", "--dir", "d", "ok.py", cwd=work).returncode == 0
    r = gpusnap("snap", "d", cwd=work)
    assert r.returncode == 3
    assert r.stderr.splitlines() == [
        f"gpusnap: no run is active in {work / 'd'}",
        "hint: start the program with `gpusnap run --dir DIR ...`, or continue it with `gpusnap restart DIR`",
    ]
    # A supervisor that died without cleaning up.
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (work / "d" / "supervisor.json").write_text(json.dumps({"pid": dead.pid, "socket": "/nonexistent", "started": 0}))
    r = gpusnap("snap", "d", cwd=work)
    assert r.returncode == 3
    assert first_line(r) == f"gpusnap: no run is active in {work / 'd'} (its supervisor, pid {dead.pid}, is gone)"
    # A distributed run's nodes each say where they listen; none of them on this host.
    (work / "d" / "supervisor.json").unlink()
    (work / "d" / "supervisor-node7.json").write_text(json.dumps({"pid": 1, "socket": "/x", "started": 0, "host": "node7"}))
    r = gpusnap("snap", "d", cwd=work)
    assert r.returncode == 3
    assert r.stderr.splitlines() == [
        f"gpusnap: no node of the run in {work / 'd'} runs on this host (its nodes: node7)",
        "hint: run `gpusnap snap DIR` on one of them: a snapshot asked of one node is global"]


def test_restart_needs_a_snapshot(work):
    assert gpusnap("run", "--dir", "d", "ok.py", cwd=work).returncode == 0
    r = gpusnap("restart", "d", cwd=work)
    assert r.returncode == 4
    assert first_line(r) == f"gpusnap: {work / 'd'} has no snapshot to restart from"
    r = gpusnap("restart", "ok.py", cwd=work)
    assert r.returncode == 3
    assert first_line(r) == f"gpusnap: {work / 'ok.py'} is not a gpusnap run directory"


def test_help_explains_options_exit_codes_and_examples(work):
    r = gpusnap("run", "--help", cwd=work)
    assert r.returncode == 0
    for needle in ("--every", "--signal", "--on-term", "--grace", "--keep", "--instrument", "--at", "--resume",
                   "-m MODULE", "Examples:", "Exit status:", "75", "76", "Snapshots are taken:", "gpusnap snap"):
        assert needle in r.stdout, needle


def test_launcher_never_imports_torch():
    code = ("import sys, gpusnap.cli, gpusnap.cli.run, gpusnap.launch.supervisor, gpusnap.launch.control, "
            "gpusnap.launch.options, gpusnap.store.rundir, gpusnap.atomic; gpusnap.cli._register(); "
            "bad = sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')); "
            "assert not bad, bad")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
