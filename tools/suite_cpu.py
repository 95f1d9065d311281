"""What the test suite costs CI's cores, by file and by test, from a GPUSNAP_TEST_CPU_LOG.

    GPUSNAP_TEST_CPU_LOG=/tmp/cpu.log python -m pytest -q -n 4 --dist worksteal
    python tools/suite_cpu.py /tmp/cpu.log [--top 30]

Each line of the log is one test: CPU seconds (the test process's and the processes it reaped:
`gpusnap run`, restarts; the forkserver's reference runs are not in it), wall seconds, node id.
"""

from __future__ import annotations

import argparse
from collections import defaultdict


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("log")
    parser.add_argument("--top", type=int, default=30, help="the costliest tests to list")
    args = parser.parse_args()
    tests = []
    with open(args.log) as log:
        for line in log:
            cpu, wall, nodeid = line.rstrip("\n").split(" ", 2)
            tests.append((float(cpu), float(wall), nodeid))
    by_file: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
    for cpu, wall, nodeid in tests:
        entry = by_file[nodeid.split("::")[0]]
        entry[0] += cpu
        entry[1] += wall
        entry[2] += 1
    total_cpu = sum(t[0] for t in tests)
    print(f"{len(tests)} tests: {total_cpu:.0f} s of CPU, {sum(t[1] for t in tests):.0f} s of wall summed")
    print(f"{'cpu_s':>8} {'share':>6} {'wall_s':>8} {'tests':>5}  file")
    for name, (cpu, wall, n) in sorted(by_file.items(), key=lambda kv: -kv[1][0]):
        print(f"{cpu:8.0f} {cpu / total_cpu:6.1%} {wall:8.0f} {n:5d}  {name}")
    print(f"\n{'cpu_s':>8} {'wall_s':>8}  test (the {args.top} costliest)")
    for cpu, wall, nodeid in sorted(tests, reverse=True)[: args.top]:
        print(f"{cpu:8.1f} {wall:8.1f}  {nodeid}")


if __name__ == "__main__":
    main()
