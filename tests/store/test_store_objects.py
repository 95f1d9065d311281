"""Run directories on an object store, against real HTTP servers that this module starts on
127.0.0.1 at free ports, once each: moto's server mode for s3://, Azurite for az://. Clients are
configured only through the standard variables (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID,
AWS_SECRET_ACCESS_KEY, AWS_REGION, AWS_ALLOW_HTTP; AZURE_STORAGE_USE_EMULATOR,
AZURITE_BLOB_STORAGE_URL). gs:// has no emulator that serves obstore's GCS client (GS_UNTESTED):
only its credential errors, which come before any request, are tested."""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import email.utils
import hashlib
import hmac
import json
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from gpusnap import atomic
from gpusnap.store.local import LocalBackend
from gpusnap.store.memory import MemoryBackend
from harness import PROGRAMS, REPO, Run, as_host, assert_same, gpusnap, load_final, progress, request_snapshot, wait_for

obstore = pytest.importorskip("obstore", reason="run directories on an object store need obstore: pip install 'gpusnap[s3]'")

BUCKET = "gpusnap-tests"  # an S3 bucket, an Azure container
GS_UNTESTED = ("no GCS emulator from the package registries serves obstore's GCS client, which speaks GCS's XML API: "
               "gcp-storage-emulator answers its list, HEAD and DELETE with 501, fake-gcs-server 1.54 its PUT with 400")
SCHEMES = ["s3", "az", pytest.param("gs", marks=pytest.mark.skip(reason=GS_UNTESTED))]
# Azurite's well-known development account, as its documentation gives it.
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _serve(argv: list[str], port: int, log: Path, extra_env: dict | None = None):
    """The server ``argv`` on 127.0.0.1:``port``, once it answers; yields its endpoint."""
    server = subprocess.Popen(argv, stdout=log.open("w"), stderr=subprocess.STDOUT, cwd=log.parent,
                              env={**os.environ, **(extra_env or {})})
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(endpoint, timeout=2).read()
                break
            except urllib.error.HTTPError:  # it answers, if only to refuse
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise AssertionError(f"{Path(argv[0]).name} did not start: {log.read_text()}")
                time.sleep(0.2)
        yield endpoint
    finally:
        server.terminate()
        server.wait(timeout=30)


@contextlib.contextmanager
def _moto(log: Path, extra_env: dict | None = None):
    """A moto server holding BUCKET (with ``extra_env``: holding nothing); yields its endpoint."""
    for module in ("moto.server", "flask"):
        pytest.importorskip(module, reason="the s3:// tests need a local moto server: pip install 'moto[server]'")
    port = _free_port()
    with _serve([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], port, log, extra_env) as endpoint:
        if not extra_env:
            urllib.request.urlopen(urllib.request.Request(f"{endpoint}/{BUCKET}", method="PUT"), timeout=10).read()
        yield endpoint


def _create_container(endpoint: str, name: str) -> None:
    """Create Blob Storage's container ``name``, a request signed with the account key (SharedKey)."""
    headers = {"x-ms-date": email.utils.formatdate(usegmt=True), "x-ms-version": "2021-08-06"}
    signed = ("PUT\n" + "\n" * 11 + "".join(f"{k}:{v}\n" for k, v in sorted(headers.items()))
              + f"/{AZURITE_ACCOUNT}/{AZURITE_ACCOUNT}/{name}\nrestype:container")
    mac = hmac.new(base64.b64decode(AZURITE_KEY), signed.encode(), hashlib.sha256).digest()
    headers["Authorization"] = f"SharedKey {AZURITE_ACCOUNT}:{base64.b64encode(mac).decode()}"
    request = urllib.request.Request(f"{endpoint}/{AZURITE_ACCOUNT}/{name}?restype=container", method="PUT", headers=headers)
    urllib.request.urlopen(request, timeout=10).read()


@contextlib.contextmanager
def _azurite(log: Path):
    """Azurite's Blob service, in memory, holding the container BUCKET; yields its endpoint."""
    local = REPO / ".ci" / "node" / "node_modules" / ".bin" / "azurite-blob"
    program = str(local) if local.exists() else shutil.which("azurite-blob")
    if program is None:
        pytest.skip("the az:// tests need Azurite: npm install --prefix .ci/node azurite (the version .ci/run pins)")
    port = _free_port()
    # --skipApiVersionCheck: a newer obstore may send a newer x-ms-version than this Azurite knows.
    argv = [program, "--blobHost", "127.0.0.1", "--blobPort", str(port), "--inMemoryPersistence",
            "--disableTelemetry", "--skipApiVersionCheck"]
    with _serve(argv, port, log) as endpoint:
        _create_container(endpoint, BUCKET)
        yield endpoint


@contextlib.contextmanager
def _exported(env: dict):
    """``env`` in this process's environment too (its own clients: the backend contract below)."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield env
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture(scope="module")
def s3_env(tmp_path_factory):
    """The environment that reaches a fresh moto server holding BUCKET."""
    with _moto(tmp_path_factory.mktemp("moto") / "server.log") as endpoint:
        with _exported({"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                        "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true"}) as env:
            yield env


@pytest.fixture(scope="module")
def az_env(tmp_path_factory):
    """The environment that reaches a fresh Azurite holding the container BUCKET."""
    with _azurite(tmp_path_factory.mktemp("azurite") / "server.log") as endpoint:
        with _exported({"AZURE_STORAGE_USE_EMULATOR": "true", "AZURITE_BLOB_STORAGE_URL": endpoint}) as env:
            yield env


@dataclasses.dataclass
class Store:
    scheme: str
    env: dict

    def url(self, name: str) -> str:
        return f"{self.scheme}://{BUCKET}/{name}-{random.randrange(1 << 30):08x}"


@pytest.fixture(scope="module", params=SCHEMES)
def store(request) -> Store:
    """Each scheme's server, started once for the module."""
    return Store(request.param, request.getfixturevalue(f"{request.param}_env"))


# -- the interface: every backend does the same thing ---------------------------------------


@pytest.fixture(params=["memory", "local", *SCHEMES])
def backend(request, tmp_path):
    if request.param == "memory":
        return MemoryBackend()
    if request.param == "local":
        return LocalBackend(tmp_path / "run")
    from gpusnap.store.objects import ObjectBackend

    return ObjectBackend(Store(request.param, request.getfixturevalue(f"{request.param}_env")).url("contract"))


def test_every_backend_keeps_the_same_contract(backend):
    with pytest.raises(FileNotFoundError):
        backend.get("snapshots/000001.json")
    with pytest.raises(FileNotFoundError):
        backend.list("snapshots")
    data = os.urandom(3 << 20)
    assert backend.put("packs/ab/ab12.pack", [data[:100], data[100:]]) == len(data)
    assert backend.get("packs/ab/ab12.pack") == data
    with backend.open("packs/ab/ab12.pack") as r:
        assert r.size == len(data)
        assert r.read(1 << 20, 77) == data[1 << 20 : (1 << 20) + 77]
        assert r.read(len(data) - 5, 100) == data[-5:]  # fewer only at the end
    backend.commit("snapshots/000001.json", b'{"a": 1}')
    with pytest.raises(atomic.FileExists):  # the store decides: a commit never replaces
        backend.commit("snapshots/000001.json", b'{"a": 2}')
    assert backend.get("snapshots/000001.json") == b'{"a": 1}'
    assert sorted(backend.list("")) == ["packs", "snapshots"]
    assert backend.list("packs") == ["ab"] and backend.list("packs/ab") == ["ab12.pack"]
    backend.append("log.jsonl", b"one\n")
    backend.append("log.jsonl", b"two\n")
    assert backend.get("log.jsonl") == b"one\ntwo\n"
    backend.delete("packs/ab/ab12.pack")
    backend.delete("packs/ab/ab12.pack")  # gone already: no error
    assert not backend.exists("packs/ab/ab12.pack") and backend.exists("snapshots/000001.json")


# -- the levels' copy of the file journal ---------------------------------------------------


class _Recording(MemoryBackend):
    """A store that remembers the order of its puts and commits."""

    def __init__(self) -> None:
        super().__init__("memory://store")
        self.order: list[str] = []

    def put(self, key, parts, *, direct=False):
        self.order.append(key)
        return super().put(key, parts, direct=direct)

    def commit(self, key, data):
        self.order.append(key)
        return super().commit(key, data)


def _uploading(rd, shared=None):
    """(store, uploader): ``rd`` uploaded once to ``shared`` (a new recording store unless given)."""
    from gpusnap.store import levels

    shared = shared if shared is not None else _Recording()
    levels.ensure_run(shared, rd)
    up = levels.Uploader(rd, shared)
    up.sync()
    return shared, up


def test_the_journal_reaches_the_store_before_its_snapshot_and_says_when_it_is_whole(tmp_path):
    """The uploader puts the file journal (with the marker the snapshot wrote) before each
    snapshot's manifest, again only when it grew, each copy ending with a `copied` line, closed
    in the copy it makes once the run has ended. A restart on a machine whose local level is
    older than the store takes the store's journal with the snapshot (its own cannot hold the
    snapshot's marker), before the manifest it commits there."""
    from gpusnap.store import levels
    from gpusnap.store.rundir import RunDir
    from store_helpers import make_run

    rd, snaps = make_run(tmp_path, n=3)
    ids = [sid for sid, _, _ in snaps]
    stale = tmp_path / "stale"
    shutil.copytree(rd.path, stale)
    for sid in ids[1:]:
        (stale / "snapshots" / f"{sid}.json").unlink()
    (stale / "files.jsonl").write_text(json.dumps({"snapshot": ids[0], "token": "t1"}) + "\n")
    lines = [json.dumps({"snapshot": sid, "token": f"t{n}", "pid": 1}) for n, sid in enumerate(ids, 1)]
    (rd.path / "files.jsonl").write_text("\n".join(lines) + "\n" + '{"path": "/w/half')  # a line being written

    shared, up = _uploading(rd)
    for sid in ids:
        assert shared.order.index("files.jsonl") < shared.order.index(f"snapshots/{sid}.json")
    copy = shared.get("files.jsonl").decode().splitlines()
    assert copy[:-1] == lines and json.loads(copy[-1])["closed"] is False
    puts = shared.order.count("files.jsonl")
    up.sync()
    assert shared.order.count("files.jsonl") == puts  # nothing new: not put again
    up.stop()
    assert json.loads(shared.get("files.jsonl").decode().splitlines()[-1])["closed"] is True

    store = RunDir.open("memory://store", backend=shared)
    fetched = levels.fetch(store, stale)
    assert fetched.snapshot_ids() == [ids[0], ids[-1]]  # the store's newest, beside what it had
    assert (stale / "files.jsonl").read_bytes() == shared.get("files.jsonl")


def test_a_restart_on_a_machine_with_a_stale_run_log_keeps_every_line_of_both(tmp_path):
    """Machine A ran, its log reached the store; machine B restarted from the store and appended
    to the store's log; A appended one line it never sent. When A restarts again, its local log
    gets B's lines and keeps its own, in time order, and the uploader, which copies the log
    whole, then puts all of it back: no machine's lines are lost."""
    from gpusnap.store import levels
    from gpusnap.store.rundir import RunDir
    from store_helpers import make_run

    def line(t, event):
        return json.dumps({"t": t, "source": "supervisor", "event": event}).encode() + b"\n"

    rd, _ = make_run(tmp_path, n=1)
    log = rd.path / "log.jsonl"
    log.write_bytes(line(1.0, "start") + line(2.0, "committed"))
    shared, up = _uploading(rd)
    up.stop()
    assert shared.get("log.jsonl") == log.read_bytes()
    on_b = line(3.0, "start") + line(4.0, "committed")
    shared.put("log.jsonl", [shared.get("log.jsonl") + on_b])  # machine B's run, copied by its uploader
    with log.open("ab") as f:
        f.write(line(5.0, "signal") + b'{"t": 6.0, "ev')  # A's last line, and one cut short by a kill

    store = RunDir.open("memory://store", backend=shared)
    levels.fetch(store, rd.path)
    assert log.read_bytes() == line(1.0, "start") + line(2.0, "committed") + on_b + line(5.0, "signal")
    _, up = _uploading(RunDir.open(rd.path), shared)
    up.stop()
    assert shared.get("log.jsonl") == log.read_bytes()

    # A machine whose log is the store's older copy takes the store's as it is, and the other way round.
    assert levels.merge_logs(line(1.0, "start"), log.read_bytes()) == log.read_bytes()
    assert levels.merge_logs(log.read_bytes(), line(1.0, "start")) == log.read_bytes()


def test_what_a_restart_from_a_store_unpickles_is_checked_where_it_is_read(tmp_path):
    """An object has no owner or mode to check: opening the store trusted checks nothing there
    (its bucket policy is the owner's part). The local level a restart fetches into, and reads
    from, is made 0700 and checked as any local run directory."""
    from gpusnap.errors import RunDirPermission
    from gpusnap.store import levels
    from gpusnap.store.rundir import RunDir
    from store_helpers import make_run

    rd, snaps = make_run(tmp_path, n=1)
    shared = MemoryBackend("memory://store")
    levels.ensure_run(shared, rd)
    levels.Uploader(rd, shared).sync()
    store = RunDir.open("memory://store", backend=shared, trusted=True)
    level = tmp_path / "levels" / "s3" / "bucket" / "run"
    levels.fetch(store, level)
    assert (level.stat().st_mode & 0o777) == 0o700 and RunDir.open(level, trusted=True).snapshot_ids() == [snaps[0][0]]
    level.chmod(0o770)
    with pytest.raises(RunDirPermission, match="can be written by its group"):
        RunDir.open(level, trusted=True)


# -- a run on the store -----------------------------------------------------------------------------


def _store_ids(url: str, env: dict, cwd: Path) -> list[str]:
    r = gpusnap("ls", url, "--json", cwd=cwd, env=env)
    assert r.returncode == 0, r.stderr
    return [s["id"] for s in json.loads(r.stdout) if "shared" in s["level"]]


@pytest.mark.slow
def test_drill_a_reclaimed_vm_restarts_from_the_store_on_a_fresh_machine(store, tmp_path):
    """kill -9 with the whole local tree gone (the program's copy, the cache, its output), then
    `gpusnap restart s3://...` from a fresh copy of the program in another directory: the run
    ends byte for byte as an uninterrupted one, and the store verifies."""
    url = store.url("drill")
    first, second = tmp_path / "vm1", tmp_path / "vm2"
    for vm in (first, second):
        vm.mkdir()
    ref = tmp_path / "ref"
    ref.mkdir()
    reference = subprocess.Popen([sys.executable, str(PROGRAMS / "style_a.py"), str(ref), "0", "3"], cwd=tmp_path,
                                 env={**os.environ, "PYTHONPATH": str(REPO), "TEST_STEP_SLEEP_S": "0"})
    shutil.copytree(PROGRAMS, first / "progs", ignore=shutil.ignore_patterns("__pycache__"))
    (first / "out").mkdir()
    env1 = {**store.env, "GPUSNAP_LEVEL_DIR": str(first / "cache"), "TEST_STEP_SLEEP_S": "0.05"}
    run = Run("run", "--dir", url, "progs/style_a.py", "out", 0, 3, cwd=first, env=env1)
    wait_for(lambda: progress(first / "out") >= 8, "step 8", proc=run)
    # The program waits from the fork until the store lists the snapshot: on a loaded machine it
    # ended before that (the copy and the listing took longer than its last 50 paced steps).
    level = wait_for(lambda: next((first / "cache").rglob("log.jsonl"), None), "the run's local level", proc=run).parent
    request_snapshot(run, level, hold=first / "out" / "hold", committed=lambda: _store_ids(url, env1, first))
    at = progress(first / "out")
    wait_for(lambda: progress(first / "out") >= at + 3, "three more steps", proc=run)
    run.kill_group()
    assert not (first / "out" / "final.pt").exists(), "the program finished before it was killed"
    shutil.rmtree(first)  # the VM's disk: program, output, cache

    shutil.copytree(PROGRAMS, second / "progs", ignore=shutil.ignore_patterns("__pycache__"))
    (second / "out").mkdir()
    env2 = {**store.env, "GPUSNAP_LEVEL_DIR": str(second / "cache")}
    restarted = gpusnap("restart", url, cwd=second, env=env2)
    assert restarted.returncode == 0, restarted.stderr
    assert f"fetched snapshot 000001 from {url}" in restarted.stderr
    assert "restored snapshot 000001" in restarted.stderr
    assert not first.exists()  # nothing went back to the old machine's paths
    assert reference.wait(timeout=240) == 0
    assert_same(load_final(ref), load_final(second / "out"))
    # The restarted run's snapshots reach the store as well; the levels say where each is.
    listed = gpusnap("ls", url, cwd=second, env=env2)
    assert listed.returncode == 0 and listed.stdout.splitlines()[0].split()[-1] == "LEVEL", listed.stdout
    assert "local+shared" in listed.stdout
    # each row's level under the LEVEL column, the last
    assert all(line.split()[-1] in ("local", "shared", "local+shared") for line in listed.stdout.splitlines()[1:]), listed.stdout
    verified = gpusnap("verify", url, cwd=second, env=env2)
    assert verified.returncode == 0, verified.stdout + verified.stderr


def _metrics_run(url: str, vm: Path, env: dict, **kw) -> Run:
    """metrics_file.py (a log line appended every step, metrics.csv rewritten every 5) in ``vm``,
    writing into vm/out, with its directory on the store."""
    shutil.copytree(PROGRAMS, vm / "progs", ignore=shutil.ignore_patterns("__pycache__"))
    (vm / "out").mkdir()
    return Run("run", "--dir", url, "progs/notorch/metrics_file.py", "out", 40, 5, 4096, cwd=vm, env=env, **kw)


def _metrics_reference(tmp_path: Path) -> Path:
    ref = tmp_path / "ref"
    ref.mkdir()
    done = subprocess.run([sys.executable, str(PROGRAMS / "notorch" / "metrics_file.py"), str(ref), "40", "5", "4096"],
                          env={**os.environ, "TEST_STEP_SLEEP_S": "0"}, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return ref


def _snapshot_then_kill(run: Run, url: str, out: Path, env: dict, more: int) -> None:
    """A snapshot after step 8 that reaches the store, ``more`` steps after it, then kill -9."""
    wait_for(lambda: progress(out) >= 8, "step 8", proc=run)
    run.signal(__import__("signal").SIGUSR1)
    wait_for(lambda: _store_ids(url, env, out.parent), "a snapshot in the store", proc=run)
    at = progress(out)
    wait_for(lambda: progress(out) >= at + more, f"{more} more steps", proc=run)
    run.kill_group()
    assert not (out / "final.json").exists(), "the program finished before it was killed"


@pytest.mark.slow
def test_drill_the_programs_files_come_back_on_a_machine_of_another_name(s3_env, tmp_path):
    """A program that appends to its log every step and rewrites its metrics file every five,
    killed -9 with its machine's disk after a snapshot reached the store, restarted on a machine
    of another name from a fresh copy: its files come back as they were at the snapshot, and end
    byte for byte as an uninterrupted run's. (The files table names the host that recorded it,
    and a restart on another host once left the files alone, and said it restored.)"""
    other = as_host("the-next-vm")
    if other is None:
        pytest.skip("needs unshare --uts (root, or user namespaces) to restart under another host name")
    url = Store("s3", s3_env).url("drill-files")
    first, second = tmp_path / "vm1", tmp_path / "vm2"
    first.mkdir()
    second.mkdir()
    ref = _metrics_reference(tmp_path)
    lease = {"GPUSNAP_STORE_LEASE_S": "3"}  # the dead machine's lock: its lease ends soon
    env1 = {**s3_env, **lease, "GPUSNAP_LEVEL_DIR": str(first / "cache"), "TEST_STEP_SLEEP_S": "0.1"}
    _snapshot_then_kill(_metrics_run(url, first, env1), url, first / "out", env1, more=6)
    shutil.rmtree(first)  # the VM's disk: program, output, cache

    shutil.copytree(PROGRAMS, second / "progs", ignore=shutil.ignore_patterns("__pycache__"))
    (second / "out").mkdir()
    env2 = {**os.environ, **s3_env, **lease, "GPUSNAP_LEVEL_DIR": str(second / "cache"), "PYTHONPATH": str(REPO)}
    restarted = subprocess.run([*other, sys.executable, "-m", "gpusnap", "restart", url], cwd=second, env=env2,
                               capture_output=True, text=True, timeout=240)
    assert restarted.returncode == 0, restarted.stderr
    assert "gpusnap: files back to snapshot 000001: 3 restored" in restarted.stderr.splitlines()
    for name in ("train.log", "metrics.csv", "final.json"):
        assert (second / "out" / name).read_bytes() == (ref / name).read_bytes(), name
    assert not first.exists()


@pytest.mark.slow
def test_a_journal_cut_short_with_the_files_still_there_refuses_unless_forced(s3_env, tmp_path):
    """The local level is lost but the program's files are not (a node-local cache, the program
    on a shared file system): the store's copy of the journal ends where the uploader last
    copied it, and what the program first wrote after that cannot be known, so the restart
    refuses (exit 6) before it changes anything. With --force it puts back what the snapshot
    holds, and this program (whose files the snapshot all holds) ends as an uninterrupted run."""
    url = Store("s3", s3_env).url("cut")
    vm = tmp_path / "vm"
    vm.mkdir()
    ref = _metrics_reference(tmp_path)
    env1 = {**s3_env, "GPUSNAP_LEVEL_DIR": str(tmp_path / "cache1"), "TEST_STEP_SLEEP_S": "0.1"}
    _snapshot_then_kill(_metrics_run(url, vm, env1), url, vm / "out", env1, more=4)
    shutil.rmtree(tmp_path / "cache1")
    out = vm / "out"
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    env2 = {**s3_env, "GPUSNAP_LEVEL_DIR": str(tmp_path / "cache2")}
    refused = gpusnap("restart", url, cwd=vm, env=env2)
    assert refused.returncode == 6, refused.stderr
    said = refused.stderr.splitlines()
    assert re.fullmatch(r"gpusnap: cannot put the program's files back as they were at snapshot 000001: the run's file "
                        r"journal reached the store last at \S+Z, so what the program first wrote since is unknown, and "
                        rf"its files outlived the machine that wrote them \({re.escape(str(out))}/\S+ is here\)", said[-2]), said
    assert said[-1].startswith("hint: restart with --force to put back what is known")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before, "the refusal changed files"

    forced = gpusnap("restart", url, "--force", cwd=vm, env=env2)
    assert forced.returncode == 0, forced.stderr
    assert "gpusnap: warning: files the program first wrote after snapshot 000001 may be left as they are (--force)" in forced.stderr
    for name in ("train.log", "metrics.csv", "final.json"):
        assert (out / name).read_bytes() == (ref / name).read_bytes(), name
    # What the restart moved aside is the program's only copy of the killed run's files: the
    # store holds it too, under the same keys, so losing the local level does not lose it.
    from gpusnap.store.objects import open_backend

    aside = tmp_path / "cache2" / "s3" / url.split("://", 1)[1] / "after-000001"
    local = {str(p.relative_to(aside)): p.read_bytes() for p in aside.rglob("*") if p.is_file()}
    assert any(name.endswith("/out/train.log") for name in local), sorted(local)
    store = open_backend(url)
    assert {key: store.get(f"after-000001/{key}") for key in store.list_tree("after-000001")} == local


# -- faults ------------------------------------------------------------------------------------


def test_a_throttled_or_dropped_request_is_retried_with_backoff_and_counted(monkeypatch):
    from gpusnap.errors import StoreError
    from gpusnap.store import retry

    seed = random.randrange(1 << 30)
    print(f"seed {seed}")
    rnd = random.Random(seed)
    failures = [rnd.choice(["503 SlowDown: please reduce your request rate", "error sending request: connection reset"])
                for _ in range(rnd.randint(1, 4))]
    waited = []
    monkeypatch.setattr(retry, "_sleep", waited.append)

    class Flaky(MemoryBackend):
        def get(self, key):
            if failures:
                raise StoreError(failures.pop())
            return super().get(key)

    inner = Flaky()
    inner.put("run.json", [b"{}"])
    expected = {"throttled": sum("SlowDown" in f for f in failures), "dropped": sum("reset" in f for f in failures)}
    b = retry.RetryBackend(inner)
    assert b.get("run.json") == b"{}"
    assert {k: b.counts[k] for k in expected} == expected and len(waited) == sum(expected.values())
    with pytest.raises(FileNotFoundError):  # not worth a retry
        b.get("nothing")

    class Refused(MemoryBackend):  # as store.objects raises it: obstore's whole text is the cause
        def get(self, key):
            cause = RuntimeError("Server returned non-2xx status code: 403 Forbidden: RequestId:e8e3e319-5030-4d76\n\n"
                                 "Debug source:\n    retry_timeout: 180s,")
            raise StoreError(f"az://b/{key}: 403 Forbidden") from cause

    waited.clear()
    with pytest.raises(StoreError):
        retry.RetryBackend(Refused()).get("run.json")
    assert waited == []  # neither the request id's digits nor the client's retry settings are a reason


def test_a_connection_that_drops_mid_upload_leaves_nothing_half_committed(store, tmp_path):
    """The upload of a snapshot fails at a random request: the store shows no part of that
    snapshot as committed (its manifest is the commit), and the next pass copies it whole."""
    from gpusnap.errors import StoreError
    from gpusnap.store import levels, location
    from gpusnap.store.objects import open_backend
    from store_helpers import make_run

    seed = random.randrange(1 << 30)
    print(f"seed {seed}")
    rd, snaps = make_run(tmp_path, n=2)
    url = store.url("drop")
    shared = open_backend(url)
    puts = {"n": 0, "fail_at": random.Random(seed).randint(1, 4)}
    real_put = shared.inner.put

    def dropping_put(key, parts, **kw):
        puts["n"] += 1
        if puts["n"] == puts["fail_at"]:
            raise StoreError(f"{url}/{key}: unexpected EOF: the connection dropped")
        return real_put(key, parts, **kw)

    shared.inner.put = dropping_put
    from gpusnap import knobs

    knobs_retries, knobs.STORE_RETRIES = knobs.STORE_RETRIES, 0  # the drop reaches the uploader
    try:
        up = levels.Uploader(rd, shared)
        levels.ensure_run(shared, rd)
        up.sync()
        assert up.report["failures"] == 1
        # Committed in the store: only whole snapshots, every chunk readable.
        store = location.open_shared(url)
        assert store.verify() == []
        assert len(store.snapshot_ids()) < len(snaps)
        up.sync()
    finally:
        knobs.STORE_RETRIES = knobs_retries
    store = location.open_shared(url)
    assert store.snapshot_ids() == [sid for sid, _, _ in snaps] and store.verify() == []
    for sid, recs, bufs in snaps:
        for name, rec in recs.items():
            assert store.read_buffer(rec) == bufs[name]


NO_BUCKET = {
    "s3": ["gpusnap: s3://no-such-bucket/r1: the bucket does not exist",
           "hint: create it first (aws s3 mb s3://BUCKET), or check the URL"],
    "az": ["gpusnap: az://no-such-bucket/r1: the container does not exist",
           "hint: create it first (az storage container create --name CONTAINER), or check the URL"],
    "gs": ["gpusnap: gs://no-such-bucket/r1: the bucket does not exist",
           "hint: create it first (gcloud storage buckets create gs://BUCKET), or check the URL"],
}


def test_a_missing_bucket_is_one_line_before_anything_is_created(store, tmp_path):
    (tmp_path / "ok.py").write_text("print('ran')\n")
    env = {**store.env, "GPUSNAP_LEVEL_DIR": str(tmp_path / "cache")}
    r = gpusnap("run", "--dir", f"{store.scheme}://no-such-bucket/r1", "ok.py", cwd=tmp_path, env=env)
    assert r.returncode == 3, r.stderr
    assert r.stderr.splitlines() == NO_BUCKET[store.scheme]
    assert r.stdout == "" and not (tmp_path / "cache").exists()


def test_gc_on_the_store_keeps_the_newest_and_frees_the_rest(store, tmp_path):
    from gpusnap.store import levels, location
    from gpusnap.store.objects import open_backend
    from gpusnap.store.pack import list_packs
    from store_helpers import make_run

    rd, snaps = make_run(tmp_path, n=3)
    url = store.url("gc")
    shared = open_backend(url)
    levels.ensure_run(shared, rd)
    levels.Uploader(rd, shared).sync()
    before = {pid for pid, _ in list_packs(shared)}
    r = gpusnap("gc", url, "--keep", "1", cwd=tmp_path, env=store.env)
    assert r.returncode == 0, r.stderr
    store = location.open_shared(url)
    sid, recs, bufs = snaps[-1]
    assert store.snapshot_ids() == [sid] and store.verify() == []
    assert {pid for pid, _ in list_packs(shared)} < before  # the packs only older snapshots needed are gone
    for name, rec in recs.items():
        assert store.read_buffer(rec) == bufs[name]
    assert not shared.exists("lock")  # gc took the store's lock and gave it back


HINTS = {
    "s3": "hint: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and AWS_ENDPOINT_URL for a server other than AWS)",
    "az": "hint: set AZURE_STORAGE_ACCOUNT_NAME and AZURE_STORAGE_ACCOUNT_KEY (or AZURE_STORAGE_USE_EMULATOR=true for Azurite)",
    "gs": "hint: set GOOGLE_APPLICATION_CREDENTIALS or GOOGLE_SERVICE_ACCOUNT (a service account's key file)",
}


@contextlib.contextmanager
def _credentials(scheme: str, request, tmp_path: Path):
    """(the environment with wrong credentials, what the store's variables are without any, what
    the wrong ones are told)."""
    if scheme == "s3":  # a moto that checks signatures (INITIAL_NO_AUTH_ACTION_COUNT=0)
        with _moto(tmp_path / "server.log", {"INITIAL_NO_AUTH_ACTION_COUNT": "0"}) as endpoint:
            base = {"AWS_ENDPOINT_URL": endpoint, "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true"}
            yield ({**base, "AWS_ACCESS_KEY_ID": "AKIANOTAKEY", "AWS_SECRET_ACCESS_KEY": "wrong"}, base,
                   "the store refused the credentials (")
    elif scheme == "az":  # Azurite checks every request's signature
        yield ({**request.getfixturevalue("az_env"), "AZURE_STORAGE_ACCOUNT_KEY": base64.b64encode(b"not the key").decode()},
               {}, "the store refused the credentials (")
    else:  # a key file whose key is no key: refused before any request, no server needed
        key = tmp_path / "key.json"
        key.write_text(json.dumps({"type": "service_account", "client_email": "run@p.iam.gserviceaccount.com",
                                   "private_key_id": "1", "private_key": "-----BEGIN PRIVATE KEY-----\nbm8=\n-----END PRIVATE KEY-----\n"}))
        yield {"GOOGLE_APPLICATION_CREDENTIALS": str(key)}, {}, "the credentials could not be used ("


@pytest.mark.parametrize("scheme", ["s3", "az", "gs"])
def test_wrong_or_missing_credentials_are_one_line_with_a_hint_naming_the_variables(scheme, request, tmp_path):
    """Wrong keys are refused before anything runs or is created; no keys at all are said as such
    (Azure's client needs an account before any request; S3's and GCS's search ends at the
    instance metadata, which this machine does not serve)."""
    (tmp_path / "ok.py").write_text("print('ran')\n")
    url = f"{scheme}://{BUCKET}/r1"
    cache = {"GPUSNAP_LEVEL_DIR": str(tmp_path / "cache")}
    with _credentials(scheme, request, tmp_path) as (wrong, missing, refused):
        for args in (["ls", url], ["run", "--dir", url, "ok.py"]):
            r = gpusnap(*args, cwd=tmp_path, env={**wrong, **cache}, timeout=120)
            lines = r.stderr.splitlines()
            assert r.returncode == 3 and len(lines) == 2, r.stderr
            assert lines[0].startswith(f"gpusnap: {url}: {refused}") and lines[1] == HINTS[scheme]
            assert "ran" not in r.stdout and not (tmp_path / "cache").exists()
        # HOME: no credential files of this machine's user (~/.aws, ~/.config/gcloud).
        bare = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "AZURE_", "AZURITE_", "GOOGLE_"))}
        r = subprocess.run([sys.executable, "-m", "gpusnap", "ls", url], cwd=tmp_path, capture_output=True, text=True,
                           timeout=120, env={**bare, **missing, **cache, "HOME": str(tmp_path), "PYTHONPATH": str(REPO)})
        lines = r.stderr.splitlines()
        assert r.returncode == 3 and len(lines) == 2, r.stderr
        assert lines[0].startswith(f"gpusnap: {url}: no credentials for the store (") and lines[1] == HINTS[scheme]
