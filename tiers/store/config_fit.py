"""Whether a store configuration fits this machine: tier capacities against the memory and disk
there are, and CXL placement against the NUMA nodes there are.

Each tier draws on one pool, and the capacities drawing on a pool must add up to no more than
it holds (tiers.store.machine_limits); the first tier that crosses the line is named, with the
others on the pool:

* host memory (MemTotal, or the cgroup limit when lower): DRAM tiers, HBM tiers on device
  "cpu", and CXL tiers whose arena is bound to no NUMA node (emulated CXL in ordinary memory);
* one NUMA node's memory: CXL tiers bound to that node (the first CPU-less node by default);
* one filesystem's size: NVMe tiers whose directories it holds. The size, not the free space:
  extent files grow as records are written (tiers.nvme.space), so a tier may promise more than
  is free today, and its puts fail with NoSpaceError if the disk fills first.

An HBM tier on a CUDA device (or with no device, which is CUDA where torch has it) is checked
against the device's memory by HbmTier itself when the store opens, since that needs torch. The
extent files of an NVMe tier stay open, so a full tier may not need more than half of the
process's open-file limit (RLIMIT_NOFILE).

Concurrency: reads /proc, /sys, statvfs and rlimits; thread-safe. Invariants: nothing is
changed; a configuration that passes can be opened without asking for more than there is.
"""

from __future__ import annotations

import os
import resource
from decimal import Decimal
from typing import Any

from tiers.io.errors import ConfigError, EngineUnavailableError
from tiers.memory.cxl import cxl_placement
from tiers.memory.numa import numa_nodes
from tiers.nvme.space import MAX_EXTENT_FILES, default_file_bytes
from tiers.store.machine_limits import Limit, filesystem_size, host_memory, node_memory

__all__ = ["check_fit", "human_bytes"]

_Pool = tuple[str, Any]  # ("host", None), ("node", 1) or ("filesystem", st_dev)


def check_fit(specs: list[dict[str, Any]]) -> None:
    """Raise ConfigError where the checked tier ``specs`` (tiers[i] = ``specs[i]``) ask for
    more than this machine has."""
    drawn: dict[_Pool, list[int]] = {}
    limits: dict[_Pool, Limit | None] = {}
    for index, spec in enumerate(specs):
        pool = _pool_of(spec, f"tiers[{index}]", limits)
        if pool is None:
            continue
        drawn.setdefault(pool, []).append(index)
        limit = limits[pool]
        total = sum(specs[i]["capacity"] for i in drawn[pool])
        if limit is not None and total > limit.bytes:
            raise ConfigError(_too_much(specs, drawn[pool], limit), f"tiers[{index}].capacity")
        if spec["kind"] == "nvme":
            _check_open_files(spec, f"tiers[{index}].extent_file_bytes")


def human_bytes(size_bytes: int) -> str:
    """``size_bytes`` in the largest binary unit it reaches: ``"23.54 GiB"``."""
    for shift, unit in ((40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")):
        if size_bytes >= 1 << shift:  # Decimal: exact for sizes far beyond any float
            return f"{Decimal(size_bytes) / (1 << shift):.4g} {unit}"
    return f"{size_bytes} B"


def _pool_of(spec: dict[str, Any], where: str, limits: dict[_Pool, Limit | None]) -> _Pool | None:
    kind = spec["kind"]
    if kind == "nvme":
        pool: _Pool = ("filesystem", os.stat(spec["path"]).st_dev)
        if pool not in limits:
            limits[pool] = filesystem_size(spec["path"])
        return pool
    if kind == "hbm" and spec.get("device") != "cpu":
        return None  # a CUDA device: HbmTier checks it against the device's memory
    node = _cxl_node(spec, where) if kind == "cxl" else None
    pool = ("host", None) if node is None else ("node", node)
    if pool not in limits:
        limits[pool] = host_memory() if node is None else node_memory(node)
    return pool


def _cxl_node(spec: dict[str, Any], where: str) -> int | None:
    """The NUMA node a CXL tier's arena will be bound to, as CxlTier will choose it."""
    node = spec.get("node")
    if node is not None:
        online = [n.node for n in numa_nodes()]
        if node not in online:
            raise ConfigError(f"NUMA node {node} is not online (online: {online})", f"{where}.node")
    try:
        return cxl_placement(node, spec.get("emulate"))[0]
    except EngineUnavailableError as exc:
        raise ConfigError(
            "false needs CXL memory (a CPU-less NUMA node) or a node; this machine has no "
            "CPU-less node: leave emulate unset or true",
            f"{where}.emulate",
        ) from exc


def _too_much(specs: list[dict[str, Any]], indexes: list[int], limit: Limit) -> str:
    *others, last = indexes
    spec = specs[last]
    what = f"{human_bytes(spec['capacity'])} for {spec['kind']} tier {spec['name']!r}"
    if others:
        named = ", ".join(f"tiers[{i}] ({specs[i]['name']!r})" for i in others)
        held = sum(specs[i]["capacity"] for i in others)
        what += f", with the {human_bytes(held)} of {named},"
    return f"{what} is more than there is: {human_bytes(limit.bytes)} ({limit.source})"


def _check_open_files(spec: dict[str, Any], where: str) -> None:
    """A full tier's extent files must fit half the open-file limit (the other half is the
    process's own) and half the files an ExtentSpace can address (padding needs room too)."""
    capacity = spec["capacity"]
    file_bytes = min(spec.get("extent_file_bytes") or default_file_bytes(capacity), capacity)
    files = -(-capacity // file_bytes)
    open_files = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if open_files == resource.RLIM_INFINITY:
        open_files = MAX_EXTENT_FILES
    budget = min(open_files, MAX_EXTENT_FILES) // 2
    if files > budget:
        raise ConfigError(
            f"a full {human_bytes(capacity)} tier in {human_bytes(file_bytes)} files keeps "
            f"{files} files open; at most {budget} may be (RLIMIT_NOFILE {open_files}, "
            f"{MAX_EXTENT_FILES} extent files at most): use at least "
            f"{human_bytes(-(-capacity // (budget << 20)) << 20)}",
            where,
        )
