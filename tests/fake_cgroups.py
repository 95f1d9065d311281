"""A fake root for the memory-limit tests: /proc and cgroup files laid out as / lays them out."""

from __future__ import annotations

from pathlib import Path


def fake_root(tmp_path: Path, cgroup: str, mountinfo: list[str], files: dict[str, str], ram_kib: int = 16 << 20) -> str:
    """A tree of real files laid out as / is: /proc/meminfo, /proc/self/{cgroup,mountinfo} and
    whatever cgroup files ``files`` names."""
    (tmp_path / "proc/self").mkdir(parents=True)
    (tmp_path / "proc/meminfo").write_text(f"MemTotal: {ram_kib} kB\nMemFree: 1 kB\nMemAvailable: {ram_kib // 2} kB\n")
    (tmp_path / "proc/self/cgroup").write_text(cgroup)
    (tmp_path / "proc/self/mountinfo").write_text("".join(line + "\n" for line in mountinfo))
    for path, text in files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    return str(tmp_path)


V2_MOUNT = "31 23 0:27 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate"
V1_MOUNT = "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory"
