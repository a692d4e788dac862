"""NUMA placement: find the machine's NUMA nodes, bind memory to one, and check where pages are.

Linux exposes CXL Type-3 memory (once onlined as system RAM) as a NUMA node with memory and no
CPUs, so finding CXL memory means finding CPU-less nodes under /sys/devices/system/node. Binding
uses the ``mbind`` system call and checking uses ``move_pages``, both through ctypes (no package):
mbind a fresh mapping before its first touch, then touch it, and its pages come from that node.

Concurrency: every function is thread-safe (sysfs reads and system calls only).
Invariants: ``bind_to_node`` either binds the whole page-rounded range with MPOL_BIND or raises;
node ids are the kernel's.
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from tiers.io.buffers import PAGE_SIZE_BYTES
from tiers.io.errors import EngineUnavailableError, InvalidArgumentError, error_from_errno

__all__ = [
    "NODE_ROOT",
    "NumaNode",
    "bind_to_node",
    "cpuless_nodes",
    "numa_nodes",
    "pages_on_node",
    "parse_cpulist",
]

NODE_ROOT = "/sys/devices/system/node"
MPOL_BIND = 2
MPOL_MF_STRICT = 1  # fail if pages already in the range sit on another node ...
MPOL_MF_MOVE = 2  # ... unless they can be moved there (pages mapped only by this process)
# (mbind, move_pages) system call numbers; they differ per architecture.
_SYSCALLS = {"x86_64": (237, 279), "aarch64": (235, 239), "arm64": (235, 239)}


@dataclass(frozen=True, slots=True)
class NumaNode:
    """One online NUMA node: its id, its CPUs and its memory."""

    node: int
    cpus: tuple[int, ...]
    mem_total_bytes: int

    @property
    def cpuless(self) -> bool:
        """Memory without CPUs: how CXL Type-3 memory (and HBM-as-NUMA) appears."""
        return not self.cpus and self.mem_total_bytes > 0


def parse_cpulist(text: str) -> tuple[int, ...]:
    """CPUs of a sysfs cpulist such as ``"0-3,8,10-11"`` (empty for a CPU-less node)."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        first, _, last = part.partition("-")
        cpus.extend(range(int(first), int(last or first) + 1))
    return tuple(cpus)


def _mem_total_bytes(path: str) -> int:
    with open(path) as f:
        match = re.search(r"MemTotal:\s+(\d+)\s*kB", f.read())
    return int(match.group(1)) * 1024 if match else 0


def numa_nodes(root: str = NODE_ROOT) -> list[NumaNode]:
    """The online NUMA nodes, by id; empty where the kernel exposes none (not Linux)."""
    if not os.path.isdir(root):
        return []
    nodes = []
    for name in os.listdir(root):
        if not re.fullmatch(r"node\d+", name):
            continue
        path = os.path.join(root, name)
        with open(os.path.join(path, "cpulist")) as f:
            cpus = parse_cpulist(f.read())
        nodes.append(NumaNode(int(name[4:]), cpus, _mem_total_bytes(os.path.join(path, "meminfo"))))
    return sorted(nodes, key=lambda n: n.node)


def cpuless_nodes(root: str = NODE_ROOT) -> list[int]:
    """Ids of the nodes with memory and no CPUs (candidate CXL memory), lowest first."""
    return [n.node for n in numa_nodes(root) if n.cpuless]


def _syscall_numbers() -> tuple[int, int]:
    numbers = _SYSCALLS.get(platform.machine())
    if numbers is None or not os.path.isdir(NODE_ROOT):
        raise EngineUnavailableError(
            "numa", f"mbind/move_pages are wired up for Linux on {sorted(_SYSCALLS)} only"
        )
    return numbers


@functools.cache
def _syscall() -> Any:  # a ctypes function pointer
    syscall = ctypes.CDLL(None, use_errno=True).syscall
    syscall.restype = ctypes.c_long
    return syscall


def _page_range(address: int, size_bytes: int) -> tuple[int, int]:
    if address % PAGE_SIZE_BYTES or size_bytes < 0:
        raise InvalidArgumentError(
            f"NUMA placement needs a page-aligned address and a size >= 0, got {address:#x}"
        )
    return address, -(-size_bytes // PAGE_SIZE_BYTES) * PAGE_SIZE_BYTES


def bind_to_node(address: int, size_bytes: int, node: int) -> None:
    """Bind the pages of ``[address, address + size_bytes)`` to NUMA ``node`` (MPOL_BIND).

    Call it before the memory is first touched: pages are then allocated on ``node``. Pages
    already present are moved there when they can be (MPOL_MF_MOVE), else the call fails.

    Raises:
        InvalidArgumentError: the address is not page-aligned or ``node`` is not an online node.
        StorageError: the kernel refused (errno kept: EINVAL, EIO for unmovable pages, EPERM).
        EngineUnavailableError: not Linux on x86_64/aarch64.
    """
    mbind_nr, _ = _syscall_numbers()
    online = [n.node for n in numa_nodes()]
    if node not in online:
        raise InvalidArgumentError(f"NUMA node {node} is not online (online nodes: {online})")
    address, length = _page_range(address, size_bytes)
    if not length:
        return
    bits = ctypes.sizeof(ctypes.c_ulong) * 8
    mask = (ctypes.c_ulong * (node // bits + 1))()
    mask[node // bits] = 1 << (node % bits)
    # The kernel reads maxnode - 1 bits (a historical off-by-one), hence the + 1.
    max_node = len(mask) * bits + 1
    ret = _syscall()(
        ctypes.c_long(mbind_nr),
        ctypes.c_void_p(address),
        ctypes.c_ulong(length),
        ctypes.c_long(MPOL_BIND),
        mask,
        ctypes.c_ulong(max_node),
        ctypes.c_ulong(MPOL_MF_STRICT | MPOL_MF_MOVE),
    )
    if ret != 0:
        raise error_from_errno(ctypes.get_errno(), f"mbind to NUMA node {node}")


def pages_on_node(
    address: int, size_bytes: int, *, sample_pages: int | None = None
) -> dict[int, int]:
    """Where the pages of a range live: node id -> page count (``move_pages`` query, no move).

    Negative keys count pages without a node, as ``-errno`` (``-ENOENT``: never touched).
    ``sample_pages`` checks that many evenly spread pages instead of all of them.
    """
    _, move_pages_nr = _syscall_numbers()
    address, length = _page_range(address, size_bytes)
    pages = np.arange(address, address + length, PAGE_SIZE_BYTES, dtype=np.uint64)
    if sample_pages is not None and 0 < sample_pages < len(pages):
        pages = pages[np.linspace(0, len(pages) - 1, sample_pages).astype(np.int64)]
    if not len(pages):
        return {}
    status = np.full(len(pages), -1, dtype=np.int32)
    ret = _syscall()(
        ctypes.c_long(move_pages_nr),
        ctypes.c_long(0),  # this process
        ctypes.c_ulong(len(pages)),
        ctypes.c_void_p(pages.ctypes.data),
        ctypes.c_void_p(None),  # no target nodes: only report where each page is
        ctypes.c_void_p(status.ctypes.data),
        ctypes.c_long(0),
    )
    if ret < 0:
        raise error_from_errno(ctypes.get_errno(), "move_pages")
    nodes, counts = np.unique(status, return_counts=True)
    return {int(n): int(c) for n, c in zip(nodes, counts, strict=True)}
