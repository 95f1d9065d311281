"""Starts a process (multiprocessing's fork context) that waits for work that never comes, then
ends it with terminate() and join(), as a Pool's terminate() ends its idle workers; writes the
child's pid once it runs, and its exit code at the end (result.json).
usage: terminated_child.py OUT   (the test creates OUT/go when the child is to be ended)"""
import json
import multiprocessing
import os
import sys
import time


def wait_for_work(ready):
    ready.set()
    while True:
        time.sleep(0.1)


def main():
    out = sys.argv[1]
    context = multiprocessing.get_context("fork")
    ready = context.Event()
    child = context.Process(target=wait_for_work, args=(ready,))
    child.start()
    ready.wait(30)
    with open(os.path.join(out, "child.pid"), "w") as f:
        f.write(str(child.pid))
    while not os.path.exists(os.path.join(out, "go")):
        time.sleep(0.05)
    child.terminate()
    child.join(20)
    result = {"exitcode": child.exitcode}
    if child.is_alive():
        child.kill()
        child.join()
    with open(os.path.join(out, "result.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
