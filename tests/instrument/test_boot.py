"""`python -m gpusnap.boot` in real subprocesses: the program must see what plain `python` gives
it (argv, sys.path, __main__, exit status, tracebacks), with its loops instrumented."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest
import xxhash


@pytest.fixture
def env(tmp_path):
    e = dict(os.environ)
    e["GPUSNAP_CACHE_DIR"] = str(tmp_path / "gpusnap-cache")
    e.pop("GPUSNAP_BOOT", None)
    e.pop("PYTHONDONTWRITEBYTECODE", None)
    return e


def _write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def _python(args, cwd, env, boot, config=None, **kw):
    cmd = [sys.executable, *(["-m", "gpusnap.boot"] if boot else []), *args]
    if config is not None:
        env = dict(env, GPUSNAP_BOOT=json.dumps(config))
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=60, **kw)


def _both(args, cwd, env, **kw):
    return _python(args, cwd, env, False, **kw), _python(args, cwd, env, True, **kw)


REPORT = """\
import json, sys
import sib
from pkg import rel
info = {
    "argv": sys.argv,
    "path0": sys.path[0],
    "name": __name__,
    "file": __file__,
    "spec": None if __spec__ is None else [__spec__.name, __spec__.origin],
    "package": __package__,
    "cached": __cached__,
    "builtins": type(__builtins__).__name__,
    "loader": type(__loader__).__name__ if __loader__ is not None else None,
    "keys": [k for k in globals() if k != "__gpusnap_loops__"],
    "doc": __doc__,
    "sib": sib.value(),
    "rel": rel.value(),
    "main_is_module": sys.modules["__main__"].__dict__ is globals(),
    "stdin": sys.stdin.read(),
}
print(json.dumps(info))
"""


@pytest.fixture
def project(tmp_path):
    root = tmp_path / "proj"
    _write(root / "train.py", REPORT)
    _write(root / "sib.py", "def value():\n    t = 0\n    for i in range(4):\n        t += i\n    return t\n")
    _write(root / "pkg" / "__init__.py", "")
    _write(root / "pkg" / "rel.py", "from . import helper\ndef value():\n    return helper.X\n")
    _write(root / "pkg" / "helper.py", "X = 'helped'\n")
    _write(root / "pkg" / "__main__.py", "import sys\nfrom . import rel\n" + REPORT.replace("import json, sys\n", "import json\n"))
    return root


def test_script_sees_what_plain_python_gives(project, env, tmp_path):
    for cwd, script in ((project, "train.py"), (tmp_path, "proj/train.py"), (tmp_path, str(project / "train.py"))):
        plain, boot = _both([script, "a", "--b=1", ""], cwd, env, input="fed to stdin")
        assert plain.returncode == 0, plain.stderr
        assert boot.returncode == 0, boot.stderr
        assert json.loads(boot.stdout) == json.loads(plain.stdout)
        assert boot.stderr == plain.stderr == ""


def test_module_sees_what_plain_python_gives(project, env):
    _write(project / "mod_main.py", REPORT)
    for target in ("pkg", "pkg.__main__", "mod_main"):
        plain, boot = _both(["-m", target, "x", "-y"], project, env, input="")
        assert plain.returncode == 0, plain.stderr
        assert boot.returncode == 0, boot.stderr
        p, b = json.loads(plain.stdout), json.loads(boot.stdout)
        assert b.pop("loader") == "InstrumentingLoader" or target == "mod_main"
        p.pop("loader")
        assert b == p


def test_module_errors_match(project, env):
    _write(project / "nomain" / "__init__.py", "")
    for target in ("no_such_module", "nomain", "pkg.nope"):
        plain, boot = _both(["-m", target], project, env)
        assert (boot.returncode, boot.stderr) == (plain.returncode, plain.stderr)
    plain, boot = _both(["missing.py"], project, env)
    assert (boot.returncode, boot.stderr) == (plain.returncode, plain.stderr) == (2, plain.stderr)


LOOPS_PROBE = """\
import json, sys
from gpusnap.instrument import loops, importer
seen = []
loops.pending = True
loops.on_boundary = lambda loop: seen.append([loop.loop_id, loop.index, loop.code.co_filename])
import sib, extmod, sitemod
sib.value(); extmod.value(); sitemod.value()
i = 0
while i < 2:
    i += 1
loops.pending = False
print(json.dumps({
    "files": sorted({s[2] for s in seen}),
    "seen": seen,
    "sources": importer.SOURCES,
    "main_code": loops.MAIN_CODE.co_filename == __file__ and loops.MAIN_GLOBALS is globals(),
    "torch": "torch" in sys.modules,
}))
"""


def test_instruments_main_and_user_modules_only(project, env, tmp_path):
    loop_fn = "def value():\n    for i in range(2):\n        pass\n"
    _write(project / "probe.py", LOOPS_PROBE)
    _write(tmp_path / "elsewhere" / "extmod.py", loop_fn)
    _write(project / "venv" / "lib" / "python3" / "site-packages" / "sitemod.py", loop_fn)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path / "elsewhere"), str(project / "venv/lib/python3/site-packages")])
    probe, sib = str(project / "probe.py"), str(project / "sib.py")
    ext, site = str(tmp_path / "elsewhere" / "extmod.py"), str(project / "venv/lib/python3/site-packages/sitemod.py")

    out = _python(["probe.py"], project, env, True)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["files"] == sorted([probe, sib])
    assert ["3:4", 1, sib] in got["seen"]  # sib's `for`, at its line and column
    assert ["9:0", 2, probe] in got["seen"]  # the main script's while, at its last condition check
    assert got["main_code"] is True and got["torch"] is False
    for path in (probe, sib):
        with open(path, "rb") as f:
            assert got["sources"][path] == xxhash.xxh3_128_hexdigest(f.read())
    assert ext not in got["sources"] and site not in got["sources"]

    # --instrument by module name and by path reach modules outside the script's directory
    for entry in ("extmod", str(tmp_path / "elsewhere"), site):
        out = _python(["probe.py"], project, env, True, config={"instrument": [entry]})
        assert out.returncode == 0, out.stderr
        files = json.loads(out.stdout)["files"]
        assert (ext in files) == (entry != site) and (site in files) == (entry == site)


AGENT_PROBE = """\
import json, os, sys
from gpusnap.capture.trainee import agent
from gpusnap.instrument import importer, loops
calls = []
def fake_install(config, note_source):
    calls.append({
        "config": config,
        "argv": sys.argv,
        "path0": sys.path[0],
        "hooked": any(isinstance(f, importer.InstrumentFinder) for f in sys.meta_path),
        "main_ready": sys.modules["__main__"].__dict__ is loops.MAIN_GLOBALS
                      and loops.MAIN_CODE.co_filename == os.path.abspath(sys.argv[0]),
        "user_code_ran": "ran" in loops.MAIN_GLOBALS,
    })
agent.install = fake_install
agent.resuming = lambda: None
import gpusnap.boot
try:
    gpusnap.boot.main(sys.argv[1:])
finally:
    print(json.dumps(calls))
"""


def test_agent_installed_before_user_code(project, env):
    _write(project / "agent_probe.py", AGENT_PROBE)
    _write(project / "user.py", "ran = True\n")
    config = {"instrument": [], "run_dir": None, "other": [1, 2]}
    # `python agent_probe.py user.py z` stands in for `python -m gpusnap.boot user.py z`
    out = _python(["agent_probe.py", "user.py", "z"], project, env, False, config=config)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [{
        "config": config, "argv": ["user.py", "z"], "path0": str(project), "hooked": True,
        "main_ready": True, "user_code_ran": False,
    }]
    bad = _python(["user.py"], project, dict(env, GPUSNAP_BOOT="[1]"), True)
    assert bad.returncode == 2 and "GPUSNAP_BOOT" in bad.stderr


EXITS = {
    "int": "import sys\nsys.exit(3)\n",
    "str": "import sys\nprint('out')\nsys.exit('bye')\n",
    "none": "import sys\nsys.exit()\n",
    "obj": "raise SystemExit([1, 2])\n",
    "error": """\
        import sib
        def inner(n):
            for i in range(n):
                if i == 2:
                    return sib.fail(i)
        def outer():
            k = 0
            while k < 3:
                k += 1
                inner(k)
        try:
            int("x")
        except ValueError:
            outer()
    """,
    "syntax": "def f(:\n    pass\n",
    "import_syntax": "import sib\nimport badsyntax\n",
    "import_error": "import rtmod\n",
    "keyboard": "print('x', flush=True)\nfor i in range(3):\n    if i == 1:\n        raise KeyboardInterrupt\n",
    "hook": """\
        import sys
        def hook(t, v, tb):
            n = 0
            while tb is not None:
                n += 1
                tb = tb.tb_next
            print('HOOK', t.__name__, v, n)
        sys.excepthook = hook
        raise RuntimeError('boom')
    """,
    "atexit": """\
        import atexit
        atexit.register(print, 'bye from atexit')
        raise KeyboardInterrupt
    """,
}


@pytest.mark.parametrize("case", sorted(EXITS))
def test_exit_status_and_traceback_match_plain_python(case, project, env):
    _write(project / "sib.py", "def fail(i):\n    for c in 'ab':\n        pass\n    raise ZeroDivisionError(i)\n")
    _write(project / "badsyntax.py", "x = 1\nwhile x:\n    x -= 1\nfor i in (:\n    pass\n")
    _write(project / "rtmod.py", "import sib\nfor i in range(3):\n    if i == 1:\n        sib.fail(i)\n")
    _write(project / "prog.py", EXITS[case])
    plain, boot = _both(["prog.py"], project, env)
    assert boot.returncode == plain.returncode
    assert boot.stdout == plain.stdout
    assert boot.stderr == plain.stderr
    if case == "keyboard":
        assert boot.returncode == -signal.SIGINT
    if case == "error":
        assert "gpusnap" not in boot.stderr and 'line 5, in inner' in boot.stderr


def test_module_traceback_has_no_boot_frames(project, env):
    _write(project / "pkg" / "boom.py", "def f():\n    for i in range(2):\n        1 / i\n")
    _write(project / "pkg" / "__main__.py", "from .boom import f\nf()\n")
    plain, boot = _both(["-m", "pkg"], project, env)
    assert boot.returncode == plain.returncode == 1
    # python -m shows runpy's frames; boot shows only the program's
    assert boot.stderr == "".join(line for line in plain.stderr.splitlines(True) if "<frozen runpy>" not in line)


def test_plain_python_never_loads_instrumented_bytecode(project, env):
    check = "import sib\nprint('__gpusnap_loops__' in sib.value.__code__.co_names, '__gpusnap_loops__' in vars(sib))\n"
    _write(project / "check.py", check)
    pycache = project / "__pycache__"
    out = _python(["check.py"], project, env, True)
    assert out.stdout == "True True\n", out.stderr
    assert not pycache.exists()  # boot neither reads nor writes the user's .pyc files
    out = _python(["check.py"], project, env, False)
    assert out.stdout == "False False\n"
    pyc = {p.name: p.read_bytes() for p in pycache.iterdir()}
    assert any(name.startswith("sib.") for name in pyc)
    out = _python(["check.py"], project, env, True)
    assert out.stdout == "True True\n"
    assert {p.name: p.read_bytes() for p in pycache.iterdir()} == pyc
    out = _python(["check.py"], project, env, False)
    assert out.stdout == "False False\n"


def test_warm_cache_and_future_imports(project, env, tmp_path):
    _write(project / "fut.py", """\
        from __future__ import annotations
        import sib
        def f(x: NotDefined) -> None:
            while False:
                pass
        print(f.__annotations__, sib.value())
    """)
    first = _python(["fut.py"], project, env, True)
    assert first.returncode == 0, first.stderr
    entries = sorted(p.name for p in (tmp_path / "gpusnap-cache" / "code").rglob("*") if p.is_file())
    assert len(entries) == 2 and not any(e.endswith(".tmp") for e in entries)
    second = _python(["fut.py"], project, env, True)
    assert second.stdout == first.stdout == "{'x': 'NotDefined', 'return': 'None'} 6\n"
    # a changed source is recompiled, not served stale
    _write(project / "sib.py", "def value():\n    return 'changed'\n")
    third = _python(["fut.py"], project, env, True)
    assert third.stdout.endswith("changed\n")


def test_usage(env, tmp_path):
    out = _python([], tmp_path, env, True)
    assert out.returncode == 2 and "usage" in out.stderr
