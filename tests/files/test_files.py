"""The parts of gpusnap/files on real paths: which paths are excluded, what the audit hook
records (in a subprocess: a hook cannot be removed once added), and the options' refusals.
The end-to-end behaviour (kill, restart, every file compared) is tests/e2e/test_e2e_files.py."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from harness import REPO, gpusnap

from gpusnap.files import record
from gpusnap.files.paths import DEFAULT_EXCLUDES, Excludes


def test_exclusion_patterns_match_names_anywhere_and_paths_with_what_is_under_them(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("SCRATCH", str(tmp_path / "scratch"))
    monkeypatch.delenv("HF_HOME", raising=False)
    ex = Excludes([*DEFAULT_EXCLUDES, "*.lock", "./outputs/tmp", "$SCRATCH", "/data/*/cache", "$UNSET_FOR_TEST/x"], str(tmp_path),
                  always=["/runs/r1"])
    excluded = {
        f"{tmp_path}/home/.cache/huggingface/datasets/x.arrow": True,  # ~/.cache
        f"{tmp_path}/proj/__pycache__/m.cpython-311.pyc": True,  # a name anywhere
        f"{tmp_path}/proj/data/cache-1a2b.arrow": True,
        f"{tmp_path}/proj/ckpt/train.lock": True,
        f"{tmp_path}/outputs/tmp/a/b.txt": True,  # relative to the working directory, and under it
        f"{tmp_path}/outputs/tmpfile.txt": False,  # a prefix of a name is not the directory
        f"{tmp_path}/scratch/big.bin": True,
        "/data/imagenet/cache/0.npy": True,
        "/data/imagenet/train/0.npy": False,
        "/runs/r1/snapshots/000001.json": True,
        "/dev/null": True,
        "/proc/self/status": True,
        f"{tmp_path}/proj/metrics.csv": False,
    }
    assert {path: ex(path) for path in excluded} == excluded
    assert not any(p.startswith("$") for p in ex.prefixes + ex.globs), "an unset variable's pattern is dropped"
    assert Excludes.from_saved(ex.saved())(f"{tmp_path}/outputs/tmp/a") is True


WATCHED = """
import json, mmap, multiprocessing.util, os, shutil, sqlite3, sys, tempfile
from pathlib import Path
from gpusnap.files import watch
from gpusnap.files.paths import Excludes
work = sys.argv[1]
os.chdir(work)
watch.install(os.path.join(work, "journal.jsonl"), Excludes(["skip"], work, always=[os.path.join(work, "journal.jsonl")]))
with open("new.txt", "w") as f: f.write("a")
with open("new.txt", "w") as f: f.write("b")              # a non-empty file rewritten
with open("log.txt", "a") as f: f.write("line")
Path("p.txt").write_text("p")
os.close(os.open("raw.bin", os.O_WRONLY | os.O_CREAT, 0o644))
os.makedirs("d/e")
os.rename("p.txt", "d/q.txt")
with open("pre.txt", "a") as f: f.write("x")
os.truncate("log.txt", 1)
shutil.rmtree("d")
os.makedirs("skip/inner"); open("skip/inner/x", "w").close()
fd, name = tempfile.mkstemp(prefix="own", dir=work); os.close(fd)
os.replace(name, "final.txt")                               # the program's temporary file renamed onto a kept name
os.environ["TMPDIR"] = work; tempfile.tempdir = None
library = multiprocessing.util.get_temp_dir()               # a library's scratch: pymp-*
open(os.path.join(library, "socket.txt"), "w").close()
own = tempfile.mkdtemp(prefix="own-dir", dir=work)          # the program's own scratch: its state
open(os.path.join(own, "kept.txt"), "w").close()
open(os.path.join(work, "read.txt")).close()               # a read: not the program's writes
db = sqlite3.connect("metrics.db")                          # native writes, by the path it is opened by
db.execute("CREATE TABLE t (a)"); db.commit(); db.close()
sqlite3.connect(":memory:").close()
notes = {os.path.relpath(p, work): {"kinds": sorted(n.kinds), "made": n.made, "before": n.before is not None}
         for p, n in watch.notes.items()}
lines = [json.loads(l) for l in open(os.path.join(work, "journal.jsonl"))]
print(json.dumps({"notes": notes, "lines": len(lines)}))
"""


def _watched(tmp_path, text: str) -> dict:
    """What the script ``text``, run in a process of its own in ``tmp_path``, prints as JSON."""
    script = tmp_path / "watched.py"
    script.write_text(textwrap.dedent(text))
    done = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, timeout=60,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_hook_records_each_write_with_what_was_there_before(tmp_path):
    (tmp_path / "pre.txt").write_text("existing")
    (tmp_path / "read.txt").write_text("read")
    seen = _watched(tmp_path, WATCHED)
    notes = seen["notes"]
    assert notes["new.txt"] == {"kinds": ["rewrite", "write"], "made": True, "before": False}
    assert notes["log.txt"] == {"kinds": ["append", "rewrite"], "made": True, "before": False}  # truncated
    assert notes["pre.txt"] == {"kinds": ["append"], "made": False, "before": True}
    assert notes["p.txt"] == {"kinds": ["moved", "write"], "made": True, "before": False}
    # rmtree removes what it holds through directory descriptors: seen too.
    assert notes["d/q.txt"]["kinds"] == ["remove", "replaced"] and notes["d"]["kinds"] == ["mkdir", "remove"]
    assert notes["d/e"]["made"] and notes["raw.bin"]["kinds"] == ["write"]
    assert notes["final.txt"]["kinds"] == ["replaced"]
    own_file = next(name for name in notes if name.startswith("own") and "dir" not in name)
    assert notes[own_file] == {"kinds": ["moved", "write"], "made": True, "before": False}
    own_dir = next(name for name in notes if name.startswith("own-dir") and "/" not in name)
    assert notes[own_dir]["kinds"] == ["mkdir"] and notes[f"{own_dir}/kept.txt"]["kinds"] == ["write"]
    assert notes["metrics.db"] == {"kinds": ["write"], "made": True, "before": False}
    assert notes["metrics.db-wal"]["kinds"] == notes["metrics.db-shm"]["kinds"] == ["write"]  # (where it keeps a log)
    assert not any(name.startswith(("skip", "pymp-", "read", "journal", ":memory:")) for name in notes), notes
    # One line per path and kind of touch, and nothing else.
    assert seen["lines"] == sum(len(n["kinds"]) for n in notes.values())


STAGED = """
import gzip, json, os, sys
from gpusnap.files import record, watch
from gpusnap.files.paths import Excludes
work = sys.argv[1]
os.chdir(work)
watch.install(os.path.join(work, "journal.jsonl"), Excludes([], work, always=[os.path.join(work, "journal.jsonl")]))
record.install(1 << 20)
log = open("metrics.txt", "w")                              # a line per step, never flushed by hand
for step in range(3):
    log.write(f"step {step}\\n")
raw = open("raw.bin", "wb")
raw.write(b"x" * 100)
packed = gzip.open("events.gz", "wt")                       # a subclass: its compressor keeps its bytes
packed.write("event\\n" * 50)
job = record.stage("000001", work)
sizes = {e["path"].rsplit("/", 1)[1]: e.get("size") for e in job.entries}
packed.close()
print(json.dumps({"sizes": sizes, "on_disk": os.path.getsize("metrics.txt")}))
"""


def test_a_snapshot_flushes_what_the_program_s_buffered_files_hold_and_leaves_a_compressor_s(tmp_path):
    """buffered_log.py wrote a line per step into a file it never flushed: the lines its buffer
    held at the snapshot were not in the file the snapshot kept, and the restart said "verified"
    without them. The stall flushes open()'s buffered files; a GzipFile's flush would change the
    bytes it compresses, so only the file under it is flushed (its header, nothing more)."""
    seen = _watched(tmp_path, STAGED)
    assert seen["sizes"]["metrics.txt"] == seen["on_disk"] == len("step 0\n") * 3
    assert seen["sizes"]["raw.bin"] == 100
    # gzip's header alone (10 bytes, the file's name and a NUL): the deflate stream is still the compressor's
    assert seen["sizes"]["events.gz"] == 10 + len("events") + 1


RENAMED_DIR = """
import json, os, sys
from gpusnap.files import record, watch
from gpusnap.files.paths import Excludes
work = sys.argv[1]
os.chdir(work)
os.makedirs("data/set")
open("data/set/a.txt", "w").write("there before")            # a directory of the run's inputs
watch.install(os.path.join(work, "journal.jsonl"), Excludes([], work, always=[os.path.join(work, "journal.jsonl")]))
record.install(1 << 20)
os.makedirs("ckpt.tmp")                                      # an atomic save: written aside, renamed into place
open("ckpt.tmp/meta.txt", "w").write("epoch 0")
os.rename("ckpt.tmp", "ckpt")
os.symlink("data/set", "latest")                             # a link to a directory: not the program's to walk
os.replace("latest", "current")
job = record.stage("000001", work)
print(json.dumps({"entries": {os.path.relpath(e["path"], work): e.get("kind") for e in job.entries},
                  "read": {os.path.relpath(p, work): d.decode() for p, d in job.read.items()}}))
"""


def test_a_directory_renamed_into_place_is_kept_with_what_it_holds(tmp_path):
    """A checkpoint written into `ckpt.tmp/` and renamed onto `ckpt/`: its files were in no
    snapshot's table (only a directory the program made with mkdir was searched), and the
    restart after the next epoch's save refused (corpus/zip_archive.py, 2 of 3). What a rename
    puts in place is searched as a made directory is; a link to a directory is not followed."""
    seen = _watched(tmp_path, RENAMED_DIR)
    entries, read = seen["entries"], seen["read"]
    assert entries["ckpt"] == "dir" and entries["ckpt/meta.txt"] == "file" and read["ckpt/meta.txt"] == "epoch 0"
    assert entries["current"] == "link" and not any(path.startswith(("current/", "data")) for path in entries), entries


COMMANDS = """
import json, os, subprocess, sys
from gpusnap.files import record, watch
from gpusnap.files.paths import Excludes
work = sys.argv[1]
os.chdir(work)
open("val.bin", "wb").write(b"v" * 1000)                    # an input the child reads, there before the run
watch.install(os.path.join(work, "journal.jsonl"), Excludes([], work, always=[os.path.join(work, "journal.jsonl")]))
record.install(1 << 20)
open("eval.py", "w").write("import sys; print('line', file=open(sys.argv[2], 'a'))")
os.mkdir("data")
subprocess.run([sys.executable, "eval.py", "val.bin", "results.txt", "3"], check=True)
subprocess.run("cat val.bin > copy.bin && echo done >>shell.log", shell=True, check=True)
subprocess.run(["cp", "--no-clobber", "val.bin", f"--target-directory=data"], check=True)
os.system("echo x > sys.txt")
subprocess.run([sys.executable, "-c", "open('hidden.txt', 'w').write('unseen')"], check=True)
job = record.stage("000001", work)
entries = {os.path.relpath(e["path"], work): {k: e.get(k) for k in ("child", "why", "made")} for e in job.entries}
notes = {os.path.relpath(p, work): sorted(n.kinds) for p, n in watch.notes.items()}
print(json.dumps({"entries": entries, "notes": notes, "kept": sorted(os.path.relpath(p, work) for p in job.read)}))
"""


def test_the_files_a_started_process_is_handed_are_the_program_s_and_an_unchanged_input_costs_nothing(tmp_path):
    """A process started by exec runs without the audit hook: an evaluator appending to the
    results file it was handed wrote that line twice across a restart, "verified"
    (corpus/eval_subprocess.py). The paths its command line names are the program's files: an
    argument, a shell's redirection, an option's value, a file the child makes. One the child
    only read, unchanged, is recorded by its length (its content is not kept), and a directory
    or the command itself is not recorded; a file named nowhere on the command line stays unseen."""
    seen = _watched(tmp_path, COMMANDS)
    entries, notes = seen["entries"], seen["notes"]
    for made in ("results.txt", "copy.bin", "shell.log", "sys.txt"):
        assert notes[made] == ["child"] and entries[made]["made"] and made in seen["kept"], (made, entries)
    assert entries["val.bin"] == {"child": True, "why": record.CHILD_UNCHANGED, "made": False}
    assert "val.bin" not in seen["kept"]
    assert entries["eval.py"]["child"] and notes["eval.py"] == ["child", "write"]  # the program wrote it too: kept
    assert notes["data"] == ["mkdir"]  # the program made it; a directory on a command line is not taken
    assert "hidden.txt" not in notes and "cp" not in notes and not any("python" in n for n in notes)


@pytest.mark.parametrize("value", ["12 parsecs", "-1", "1.5x"])
def test_a_malformed_files_max_is_refused_before_anything_runs(tmp_path, value):
    (tmp_path / "train.py").write_text("print('never')\n")
    done = gpusnap("run", "--dir", "d", "--files-max", value, "train.py", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [f"gpusnap: malformed size {value!r} for --files-max",
                                        "hint: write a size as 512MB, 2GB, 100k or plain bytes (0 keeps no file content)"]
    assert not (tmp_path / "d").exists()


def test_a_file_several_ranks_wrote_is_put_back_once_as_the_lowest_rank_recorded_it(tmp_path):
    """Two ranks' tables name one shared log, each with the length it saw at its snapshot (ranks
    snapshot at the same iteration, not at the same instant): the plan cuts it back once, to
    rank 0's length; each rank's own file is put back from its own table."""
    from gpusnap.files import watch
    from gpusnap.files.rollback import Source, rollback

    shared = tmp_path / "shared.log"
    shared.write_text("0123456789abcdefXYZ")  # 10 bytes at rank 0's snapshot, 12 at rank 1's, more since
    own = tmp_path / "rank1.log"
    own.write_text("one\ntwo\nthree\n")
    st, own_st = shared.stat(), own.stat()

    def entry(path, st, size):
        return {"path": str(path), "kind": "file", "mode": st.st_mode, "made": True, "size": size, "mtime_ns": 1, "ctime_ns": 1,
                "ino": st.st_ino, "why": "too large", "tail": watch.tail_digest(str(path), size)}

    tables = [{"entries": [entry(shared, st, 10)]}, {"entries": [entry(shared, st, 12), entry(own, own_st, 8)]}]
    sources = [Source("000004", table, {}, None) for table in tables]
    # A restart's own --files-exclude leaves a path alone.
    assert rollback(sources, str(tmp_path / "run" / "after-000004"), force=False, leave=lambda p: p == str(own)).cuts == [(str(shared), 10)]
    plan = rollback(sources, str(tmp_path / "run" / "after-000004"), force=False)
    assert plan.cuts == [(str(shared), 10), (str(own), 8)] and not plan.problems
    plan.apply()
    assert shared.read_text() == "0123456789" and own.read_text() == "one\ntwo\n"
    assert [to for _, to in plan.copied] == [f"{tmp_path}/run/after-000004{shared}", f"{tmp_path}/run/after-000004{own}"]


def test_a_directory_two_ranks_touched_after_the_snapshot_goes_back_as_the_first_one_found_it(tmp_path):
    """Accelerate's save_state on two ranks after the snapshot: rank 1 made `checkpoint_3/` and
    wrote its RNG states there, rank 0 then found the directory and wrote the model beside them.
    Decided by rank 0's journal (the lowest rank), the directory had been there before: its files
    went aside and it stayed, empty, and the replay's setup took it for the newest checkpoint
    (refused, FileNotFoundError, 2 of 2). The rank that touched a path first after the snapshot
    says what was there then; a file in a rank's table goes back by the table, whichever rank's
    journal touched it."""
    from gpusnap.files import watch
    from gpusnap.files.rollback import Source, rollback

    made = tmp_path / "checkpoints" / "checkpoint_3"
    made.mkdir(parents=True)
    (made / "random_states_1.pkl").write_bytes(b"rank 1")
    (made / "model.safetensors").write_bytes(b"rank 0")
    log = tmp_path / "train.log"
    log.write_text("one\ntwo\nthree\n")
    dir_state = watch.state_of(str(made))
    entry = {"path": str(log), "kind": "file", "mode": log.stat().st_mode, "made": True, "size": 8, "mtime_ns": 1,
             "ctime_ns": 1, "ino": log.stat().st_ino, "why": "too large", "tail": watch.tail_digest(str(log), 8)}

    def journal(*records):
        return _lines({"snapshot": "000002", "token": "t", "pid": 1}, *records)

    rank0 = journal({"path": str(made), "kind": "mkdir", "pid": 1, "before": dir_state, "at": 200},
                    {"path": str(made / "model.safetensors"), "kind": "write", "pid": 1, "before": None, "at": 201},
                    {"path": str(log), "kind": "append", "pid": 1, "before": watch.state_of(str(log)), "at": 202})
    rank1 = journal({"path": str(made), "kind": "mkdir", "pid": 2, "before": None, "at": 100},
                    {"path": str(made / "random_states_1.pkl"), "kind": "write", "pid": 2, "before": None, "at": 101})
    sources = [Source("000002", {"token": "t"}, {}, None, rank0), Source("000002", {"token": "t", "entries": [entry]}, {}, None, rank1)]
    plan = rollback(sources, str(tmp_path / "run" / "after-000002"), force=False)
    assert not plan.problems and plan.cuts == [(str(log), 8)]
    plan.apply()
    assert not made.exists() and sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == []
    assert (tmp_path / "run" / f"after-000002{made}" / "model.safetensors").read_bytes() == b"rank 0"
    assert log.read_text() == "one\ntwo\n"


def _lines(*records) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in records)


def test_the_journal_says_what_followed_a_snapshot_and_whether_a_copy_of_it_was_cut_short():
    """A store's copy of the journal ends with a `copied` line, `closed` only once the run had
    ended; one that is not closed, after the snapshot's marker and before a restart settled it,
    is a cut: what the program first wrote after it is unknown. So is a journal without the
    snapshot's marker. No journal at all (a verify's scratch copy) says nothing."""
    from gpusnap.files import journal

    marker = {"snapshot": "000002", "token": "t2", "pid": 1}
    before = {"path": "/w/old.txt", "kind": "write", "pid": 1, "before": None}
    new = {"path": "/w/new.txt", "kind": "write", "pid": 1, "before": None}
    again = {"path": "/w/new.txt", "kind": "append", "pid": 1}
    cut = {"copied": "2026-11-28T10:00:00Z", "closed": False}
    closed = {"copied": "2026-11-28T10:05:00Z", "closed": True}
    later = {"path": "/w/later.txt", "kind": "write", "pid": 9, "before": [33188, 3, 1, 7, None]}

    whole = journal.after(_lines(before, marker, new, again) + b'{"path": "/w/torn', "t2")
    assert whole.paths == {"/w/new.txt": None} and whole.cut is None
    assert journal.after(_lines(marker, new, closed), "t2").cut is None
    assert journal.after(_lines(marker, new, cut), "t2").cut == "the run's file journal reached the store last at 2026-11-28T10:00:00Z"
    # A closed copy later (the refused restart's run ended) does not fill the earlier cut ...
    assert journal.after(_lines(marker, new, cut, closed), "t2").cut is not None
    # ... a restart that put the files back does; what followed it is known again.
    settled = journal.after(_lines(marker, new, cut, {"restarted": "000002", "pid": 9}, later), "t2")
    assert settled.cut is None and settled.paths == {"/w/new.txt": None, "/w/later.txt": later["before"]}
    assert journal.after(_lines(before, new), "t2").cut == "the run's file journal does not hold the snapshot's marker"
    assert journal.after(None, "t2") == journal.After() and journal.after(_lines(before), None) == journal.After()


def test_a_cut_journal_refuses_where_the_runs_files_outlived_its_machine(tmp_path):
    """With the journal cut short, the restart cannot know what the program first wrote after
    the cut: where the run's files are here (they outlived the machine), it refuses before
    changing anything unless --force; where none is (they were lost with it, as on a new VM),
    it puts back what the snapshot holds and goes on."""
    from gpusnap.errors import FilesNotRestorable
    from gpusnap.files.rollback import Source, rollback

    log = tmp_path / "out" / "train.log"
    entry = {"path": str(log), "kind": "file", "mode": 0o100644, "made": True, "size": 4, "mtime_ns": 1, "ctime_ns": 1,
             "ino": 1, "buffer": "file/0"}
    cut = _lines({"snapshot": "000001", "token": "t1", "pid": 1}, {"copied": "2026-11-28T10:00:00Z", "closed": False})
    data = b"one\n"
    source = Source("000001", {"token": "t1", "entries": [entry]}, {"file/0": {"chunks": []}}, lambda record: data, cut)
    after = str(tmp_path / "run" / "after-000001")

    plan = rollback([source], after, force=False)  # a new machine: nothing of the run is here
    assert [w[0] for w in plan.writes] == [str(log)] and [(why, here) for _, why, here in plan.cut] == [
        ("the run's file journal reached the store last at 2026-11-28T10:00:00Z", None)]

    log.parent.mkdir()
    log.write_bytes(b"one\ntwo\n")  # the files outlived the machine: what else did it write?
    with pytest.raises(FilesNotRestorable) as refused:
        rollback([source], after, force=False)
    assert str(refused.value.message) == (
        "cannot put the program's files back as they were at snapshot 000001: the run's file journal reached the store "
        f"last at 2026-11-28T10:00:00Z, so what the program first wrote since is unknown, and its files outlived the "
        f"machine that wrote them ({log} is here)")
    plan = rollback([source], after, force=True)
    assert plan.report()["cut"] and [str(log), plan.cut[0][1]] in plan.report()["left"]


def test_a_restart_on_an_object_store_moves_aside_under_a_name_the_store_does_not_hold_yet(tmp_path):
    """Another machine's restart from the same snapshot put its after-000001/ in the store: this
    machine's goes to after-000001-2, locally and in the store, so neither overwrites the other."""
    from gpusnap.files.rollback import after_dir
    from gpusnap.store.memory import MemoryBackend
    from gpusnap.store.rundir import RunDir

    rd = RunDir.create(tmp_path / "run", {"command": {"kind": "script", "target": "t.py", "args": []}, "cwd": "/w"})
    store = MemoryBackend()
    assert after_dir(rd, "000001", store) == str(tmp_path / "run" / "after-000001")
    store.put("after-000001/home/ann/out/train.log", [b"x"])
    assert after_dir(rd, "000001", store) == str(tmp_path / "run" / "after-000001-2")
    (tmp_path / "run" / "after-000001-2").mkdir()
    assert after_dir(rd, "000001", store) == str(tmp_path / "run" / "after-000001-3")
    assert after_dir(rd, "000002") == str(tmp_path / "run" / "after-000002")
