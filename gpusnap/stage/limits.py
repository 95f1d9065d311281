"""How much host memory the staging arena may use: the host's and the job's memory cgroup's.

A batch job usually runs under a memory cgroup whose limit is far below the host's RAM, and
the arena's pages (shmem) are charged to it: an arena sized by host memory alone would get the
trainee killed by the cgroup's OOM killer, not refused. So both are read, and the tighter wins.

The cgroup is found as the kernel describes it: ``/proc/self/cgroup`` names this process's
group in each hierarchy (v2: the ``0::`` line; v1: the line whose controllers include
``memory``), ``/proc/self/mountinfo`` says where that hierarchy is mounted (and which of its
groups is the mount's root, inside a container), and the group and each of its ancestors up
to the mount may set a limit (v2 ``memory.max``, v1 ``memory.limit_in_bytes``): the smallest
holds. Every path is read under ``root`` so that tests can point it at a tree of their own.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from gpusnap import knobs

UNLIMITED_V1 = 1 << 62  # v1 reports "no limit" as a huge page-rounded number (2**63 - 4096)


@dataclass(frozen=True)
class Limit:
    """A ceiling on the arena: ``nbytes`` in all, of which ``used_bytes`` are taken already."""

    nbytes: int
    used_bytes: int
    what: str  # says where the figure comes from, for messages

    @property
    def room_bytes(self) -> int:
        return max(0, self.nbytes - self.used_bytes)

    @property
    def usable_bytes(self) -> float:
        """What gpusnap may take of the room: ``GPUSNAP_HEADROOM_FRACTION`` of it (the fork's
        copy-on-write worst case, the arena's growth, a writer's own pack windows)."""
        return self.room_bytes * knobs.HEADROOM_FRACTION


def host_memory(root: str = "/") -> Limit:
    """The host's RAM, and what of it is not available (``/proc/meminfo``)."""
    fields = {}
    with open(os.path.join(root, "proc/meminfo")) as meminfo:
        for line in meminfo:
            name, _, rest = line.partition(":")
            fields[name] = int(rest.split()[0]) * 1024
    total = fields["MemTotal"]
    return Limit(total, total - fields.get("MemAvailable", fields.get("MemFree", 0)), "host memory")


def tightest(root: str = "/") -> Limit:
    """Of host memory and the cgroup's limit, the one with the least room left."""
    found = [host_memory(root)]
    cgroup = cgroup_memory(root)
    if cgroup is not None:
        found.append(cgroup)
    return min(found, key=lambda limit: limit.room_bytes)


def cgroup_memory(root: str = "/") -> Limit | None:
    """The tightest memory limit of this process's cgroups (v2 and v1), or None when no
    group on the way up sets one (or there is no cgroup file system to read)."""
    try:
        with open(os.path.join(root, "proc/self/cgroup")) as f:
            groups = [line.rstrip("\n").split(":", 2) for line in f if line.count(":") >= 2]
        with open(os.path.join(root, "proc/self/mountinfo")) as f:
            mounts = [_mount(line) for line in f]
    except OSError:
        return None
    found = []
    for _, controllers, path in groups:
        if controllers == "":
            wanted, files = ("cgroup2", None), ("memory.max", "memory.current")
        elif "memory" in controllers.split(","):
            wanted, files = ("cgroup", "memory"), ("memory.limit_in_bytes", "memory.usage_in_bytes")
        else:
            continue
        for fstype, options, mount_root, mount_point in mounts:
            if fstype == wanted[0] and (wanted[1] is None or wanted[1] in options):
                found += _limits_up(os.path.join(root, mount_point.lstrip("/")), _relative(path, mount_root), files)
    return min(found, key=lambda limit: limit.room_bytes, default=None)


def _mount(line: str) -> tuple[str, set[str], str, str]:
    """(fstype, super options, root, mount point) of one /proc/self/mountinfo line."""
    fields = line.split()
    dash = fields.index("-")
    return fields[dash + 1], set(fields[dash + 3].split(",")) if len(fields) > dash + 3 else set(), fields[3], fields[4]


def _relative(path: str, mount_root: str) -> str:
    """The group's path under the mount: in a container the mount's root is the group itself."""
    if mount_root != "/" and (path == mount_root or path.startswith(mount_root.rstrip("/") + "/")):
        path = path[len(mount_root.rstrip("/")) :]
    return path.strip("/")


def _limits_up(mount_dir: str, group: str, files: tuple[str, str]) -> list[Limit]:
    limits = []
    parts = group.split("/") if group else []
    for depth in range(len(parts), -1, -1):
        where = os.path.join(mount_dir, *parts[:depth])
        limit_file, usage_file = (os.path.join(where, name) for name in files)
        nbytes = _read_bytes(limit_file)
        if nbytes is None or nbytes >= UNLIMITED_V1:
            continue
        used = max(0, (_read_bytes(usage_file) or 0) - _inactive_file(os.path.join(where, "memory.stat")))
        limits.append(Limit(nbytes, used, f"the memory cgroup limit ({limit_file})"))
    return limits


def _inactive_file(stat_path: str) -> int:
    """Page cache the kernel drops before it would kill anything: counted in the group's usage
    (the snapshots' own pack writes fill it), not in what it holds (``docker stats`` does the same)."""
    fields = {}
    try:
        with open(stat_path) as f:
            for line in f:
                name, _, value = line.partition(" ")
                fields[name] = int(value)
    except (OSError, ValueError):
        return 0
    return fields.get("total_inactive_file", fields.get("inactive_file", 0))  # v1 (with subgroups), v2


def _read_bytes(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    if text == "max":
        return None
    try:
        return int(text)
    except ValueError:
        return None
