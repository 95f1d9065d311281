"""Every way a program changes its files, one kind per step, and a check that they are as the
last step left them: OUT STEPS. The program's files are under OUT/work; after each step it
writes a digest of that tree to OUT/trees/STEP.json (excluded from gpusnap's care by the test),
and each step first compares the tree with the previous step's record. A restart from the
boundary after step S must find the tree as step S left it: the run exits 3 naming the first
difference otherwise. Setup appends to a log and rewrites a settings file, as the replay does
again.
"""

import json
import logging
import mmap
import os
import shutil
import sys
import tempfile

from pace import OUT, finish, progress

WORK = os.path.join(OUT, "work")
TREES = os.path.join(OUT, "trees")


def tree() -> dict:
    out = {}
    for root, dirs, files in os.walk(WORK):
        for name in dirs:
            out[os.path.relpath(os.path.join(root, name), WORK) + "/"] = None
        for name in files:
            with open(os.path.join(root, name), "rb") as f:
                out[os.path.relpath(os.path.join(root, name), WORK)] = f.read().hex()
    return out


def step_ops(step: int) -> None:
    w = lambda name: os.path.join(WORK, name)  # noqa: E731
    kind = step % 12
    if kind == 0:
        with open(w("a.txt"), "w") as f:
            f.write(f"a written at step {step}\n" * (step + 1))
    elif kind == 1:
        with open(w("appended.txt"), "a") as f:
            f.write(f"line {step}\n")
    elif kind == 2:
        with open(w("results.json"), "w") as f:
            json.dump({"step": step, "history": list(range(step))}, f)
    elif kind == 3:
        fd = os.open(w("raw.bin"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.write(fd, bytes(range(256)) * (step % 5 + 2))
        os.close(fd)
    elif kind == 4:
        from pathlib import Path

        Path(w("p.txt")).write_text(f"pathlib at {step}\n")
    elif kind == 5:
        with open(w("state.json.tmp"), "w") as f:
            json.dump({"step": step}, f)
        os.replace(w("state.json.tmp"), w("state.json"))
    elif kind == 6:
        os.makedirs(w(f"d{step}/inner"), exist_ok=True)
        for i in range(3):
            with open(w(f"d{step}/inner/{i}.txt"), "w") as f:
                f.write(f"{step}:{i}\n")
    elif kind == 7:
        for name in os.listdir(WORK):
            if name.startswith("d") and name != f"d{step - 1}":
                shutil.rmtree(w(name))
    elif kind == 8:
        if os.path.exists(w("a.txt")):
            os.remove(w("a.txt"))
        if os.path.exists(w("p.txt")):
            os.rename(w("p.txt"), w(f"q{step}.txt"))
    elif kind == 9:
        if os.path.exists(w("raw.bin")):
            os.truncate(w("raw.bin"), 300)
    elif kind == 10:
        if os.path.exists(w("raw.bin")):
            with open(w("raw.bin"), "r+b") as f, mmap.mmap(f.fileno(), 0) as m:
                m[:4] = step.to_bytes(4, "little")
    elif kind == 11:
        with tempfile.NamedTemporaryFile("w", dir=WORK, delete=False) as f:
            f.write(f"made through a temporary file at {step}\n")
        os.replace(f.name, w("final.txt"))


def main(steps: int) -> None:
    os.makedirs(WORK, exist_ok=True)
    os.makedirs(TREES, exist_ok=True)
    logging.basicConfig(filename=os.path.join(WORK, "run.log"), level=logging.INFO, format="%(message)s")
    logging.info("starting")
    with open(os.path.join(WORK, "settings.json"), "w") as f:
        json.dump({"steps": steps}, f)
    for step in range(steps):
        if step:
            with open(os.path.join(TREES, f"{step - 1}.json")) as f:
                recorded = json.load(f)
            now = tree()
            if now != recorded:
                differ = sorted(k for k in set(now) | set(recorded) if now.get(k, "?") != recorded.get(k, "?"))
                print(f"files differ from the end of step {step - 1}: {differ}", file=sys.stderr)
                raise SystemExit(3)
        step_ops(step)
        logging.info("step %d", step)
        with open(os.path.join(TREES, f"{step}.json"), "w") as f:
            json.dump(tree(), f)
        progress(step + 1)
    finish(tree=tree())


if __name__ == "__main__":
    main(int(sys.argv[2]))
