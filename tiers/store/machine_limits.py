"""What this machine can hold: host memory, one NUMA node's memory, one filesystem's size.

The configuration refuses tier capacities above these (tiers.store.config_fit), so a capacity is a
promise the machine can keep, not one that fails with ENOMEM at open or with the OOM killer once
the tier fills. Host memory is ``MemTotal`` of /proc/meminfo, or the memory limit of this
process's cgroup when that is lower: cgroup v2 ``memory.max`` or v1 ``memory.limit_in_bytes``,
the lowest found from the process's own cgroup up to the root (a container may not see its own
cgroup's directory, only an ancestor's). A NUMA node holds its ``MemTotal`` (tiers.memory.numa); a
filesystem its size in blocks (``statvfs``), however much of it is free.

Concurrency: every function reads /proc, /sys or statvfs afresh (limits change at run time);
thread-safe. Invariants: a Limit's ``bytes`` is positive and ``source`` says where it came from.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from tiers.io.errors import map_os_errors
from tiers.memory.numa import NODE_ROOT, numa_nodes

__all__ = ["Limit", "cgroup_memory_limit", "filesystem_size", "host_memory", "node_memory"]

_V1_FILE = "memory.limit_in_bytes"
_V2_FILE = "memory.max"


@dataclass(frozen=True, slots=True)
class Limit:
    """At most ``bytes`` can be had; ``source`` says what sets that (for error messages)."""

    bytes: int
    source: str


def host_memory(proc_root: str = "/proc", cgroup_root: str = "/sys/fs/cgroup") -> Limit | None:
    """The host memory this process may use, or None where /proc/meminfo is missing."""
    try:
        with open(os.path.join(proc_root, "meminfo")) as f:
            match = re.search(r"^MemTotal:\s+(\d+)\s*kB", f.read(), re.MULTILINE)
    except OSError:
        return None
    total = Limit(int(match.group(1)) * 1024, "MemTotal") if match else None
    cgroup = cgroup_memory_limit(proc_root, cgroup_root)
    if total is None or (cgroup is not None and cgroup.bytes < total.bytes):
        return cgroup
    return total


def cgroup_memory_limit(
    proc_root: str = "/proc", cgroup_root: str = "/sys/fs/cgroup"
) -> Limit | None:
    """The lowest memory limit on the way from this process's cgroups to the root, or None."""
    try:
        with open(os.path.join(proc_root, "self", "cgroup")) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    found: list[Limit] = []
    for line in lines:
        hierarchy, controllers, path = [*line.split(":", 2), "", ""][:3]
        if hierarchy == "0" and not controllers:
            found.extend(_limits_up_the_tree(cgroup_root, path, _V2_FILE))
        elif "memory" in controllers.split(","):
            found.extend(_limits_up_the_tree(os.path.join(cgroup_root, "memory"), path, _V1_FILE))
    return min(found, key=lambda limit: limit.bytes, default=None)


def node_memory(node: int, root: str = NODE_ROOT) -> Limit | None:
    """The memory of NUMA ``node``, or None where the node is not online."""
    for online in numa_nodes(root):
        if online.node == node and online.mem_total_bytes > 0:
            return Limit(online.mem_total_bytes, f"NUMA node {node}'s MemTotal")
    return None


def filesystem_size(path: str) -> Limit:
    """The size of the filesystem holding ``path`` (an existing directory or file)."""
    with map_os_errors(path):
        stat = os.statvfs(path)
    return Limit(stat.f_blocks * stat.f_frsize, f"the size of the filesystem holding {path!r}")


def _limits_up_the_tree(mount: str, cgroup_path: str, name: str) -> list[Limit]:
    limits = []
    parts = [part for part in cgroup_path.split("/") if part]
    for depth in range(len(parts), -1, -1):
        path = os.path.join(mount, *parts[:depth], name)
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue  # not visible from here (another namespace), or no memory controller
        if text.isdigit() and int(text) > 0:  # v2 says "max" when there is no limit
            limits.append(Limit(int(text), f"the cgroup memory limit in {path}"))
    return limits
