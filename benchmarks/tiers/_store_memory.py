"""Memory tiers (DRAM, HBM on the CPU, CXL) against ``np.copyto``, and the cost of a DRAM hit.

Per round and object size, the physical limit is measured first: ``np.copyto`` between two
preallocated arrays of that size. Then each tier, back to back: puts (overwrites alternating
between two keys, so every put allocates, copies and frees like a steady-state put), gets of one
key into a caller buffer (``into=``, the same destination array the copy used), and for DRAM gets
that return a new array. Throughput comes from a block of n ops timed as a whole, p50/p99 from a
second loop of n ops each timed on its own (``perf_counter_ns``, about 0.1 us per read here).

The hit cost (``hit_overhead``) times loops of gets of 4 KiB objects (1024 keys, shuffled order)
against a loop of bare 4 KiB ``np.copyto``; the difference per op is the bookkeeping.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from benchmarks.common.measure import KIB, MIB
from tiers.io import EngineUnavailableError
from tiers.memory import CxlTier, DramTier, HbmTier
from tiers.storage import Tier
from tiers.store import TieredStore

SIZES = (4 * KIB, 64 * KIB, MIB, 16 * MIB)
HIT_OBJECT_BYTES = 4 * KIB
Timing = tuple[np.ndarray, int]
HIT_KEYS = 1024
POLICIES = ("lru", "lfu", "cost")


@dataclass(frozen=True)
class OpSample:
    """One timed series of one op on one tier at one size in one round."""

    tier: str  # "memcpy", "dram", "hbm", "cxl", "fio", "nvme"
    op: str  # "copy", "put", "get" (into=), "get_new" (no into), "randread" (fio)
    size_bytes: int
    round_index: int
    gbps: float  # 10^9 bytes per second
    p50_us: float
    p99_us: float
    ops: int


def summarize(
    tier: str, op: str, size: int, round_index: int, latencies_ns: Any, gbps: float | None = None
) -> OpSample:
    """An OpSample from per-op latencies; ``gbps`` defaults to size / mean latency."""
    lat = np.asarray(latencies_ns, dtype=np.float64)
    p50, p99 = np.percentile(lat, [50, 99]) / 1e3
    if gbps is None:
        gbps = size / (lat.mean() / 1e9) / 1e9
    return OpSample(tier, op, size, round_index, float(gbps), float(p50), float(p99), len(lat))


def op_count(size: int, budget_bytes: int, lo: int, hi: int) -> int:
    return max(lo, min(hi, budget_bytes // size))


def size_label(size: int) -> str:
    return f"{size // MIB}mib" if size >= MIB else f"{size // KIB}kib"


# ---------------------------------------------------------------------- timed loops
# Each returns (per-op latencies, ns for a block of n ops timed as a whole): a clock read costs
# about 0.1 us in this VM, so throughput comes from the block, percentiles from the per-op loop.
def _time_copy(dst: np.ndarray, src: np.ndarray, n: int, warm: int) -> Timing:
    clock = time.perf_counter_ns
    for _ in range(warm):
        np.copyto(dst, src)
    start = clock()
    for _ in range(n):
        np.copyto(dst, src)
    block = clock() - start
    lat = np.empty(n, np.int64)
    for i in range(n):
        start = clock()
        np.copyto(dst, src)
        lat[i] = clock() - start
    return lat, block


async def _time_get(tier: Tier, key: str, into: Any, n: int, warm: int) -> Timing:
    clock = time.perf_counter_ns
    for _ in range(warm):
        await tier.get(key, into=into)
    start = clock()
    for _ in range(n):
        await tier.get(key, into=into)
    block = clock() - start
    lat = np.empty(n, np.int64)
    for i in range(n):
        start = clock()
        await tier.get(key, into=into)
        lat[i] = clock() - start
    return lat, block


async def _time_get_new(tier: Tier, key: str, n: int, warm: int) -> Timing:
    clock = time.perf_counter_ns
    for _ in range(warm):
        await tier.get(key)
    start = clock()
    for _ in range(n):
        await tier.get(key)  # the result is dropped at once, as by a caller that consumed it
    block = clock() - start
    lat = np.empty(n, np.int64)
    for i in range(n):
        start = clock()
        out = await tier.get(key)
        lat[i] = clock() - start
        del out
    return lat, block


async def _time_put(tier: Tier, src: np.ndarray, n: int, warm: int) -> Timing:
    """Overwrites alternating between two keys: each allocates a new extent, copies, frees the
    old one, so a put's destination is rarely the cache-warm one the copy reference reuses."""
    keys = ("a", "b")
    clock = time.perf_counter_ns
    for i in range(warm):
        await tier.put(keys[i & 1], src)
    start = clock()
    for i in range(n):
        await tier.put(keys[i & 1], src)
    block = clock() - start
    lat = np.empty(n, np.int64)
    for i in range(n):
        start = clock()
        await tier.put(keys[i & 1], src)
        lat[i] = clock() - start
    return lat, block


def _timed(tier: str, op: str, size: int, round_index: int, timing: Timing) -> OpSample:
    lat, block_ns = timing
    return summarize(tier, op, size, round_index, lat, size * len(lat) / block_ns)


# ---------------------------------------------------------------------- tiers
def make_memory_tiers(capacity: int) -> tuple[list[tuple[str, Tier]], dict[str, Any]]:
    """(label, tier) for DRAM, HBM (device cpu) and CXL, and notes on how each was built."""
    made: list[tuple[str, Tier]] = [("dram", DramTier("dram", capacity))]
    notes: dict[str, Any] = {"dram_pinned": made[0][1].pinned}
    try:
        hbm = HbmTier("hbm", capacity, device="cpu")
        made.append(("hbm", hbm))
        notes["hbm_device"] = str(hbm.device)
    except EngineUnavailableError as exc:
        notes["hbm_device"] = f"unavailable: {exc}"
    cxl = CxlTier("cxl", capacity)
    made.append(("cxl", cxl))
    notes["cxl_emulated"] = cxl.emulated
    notes["cxl_model"] = (
        f"+{cxl.added_latency_s * 1e9:.0f} ns/access, {cxl.bandwidth_bytes_per_s / 1e9:.0f} GB/s"
    )
    return made, notes


async def memory_round(
    round_index: int, budget_bytes: int, lo: int, hi: int
) -> tuple[list[OpSample], dict[str, Any]]:
    """One round over every size: copy, then each memory tier's put, get and (DRAM) get_new."""
    samples: list[OpSample] = []
    notes: dict[str, Any] = {}
    rng = np.random.default_rng(round_index)
    for size in SIZES:
        n = op_count(size, budget_bytes, lo, hi)
        warm = max(3, n // 10)
        src = rng.integers(0, 256, size, dtype=np.uint8)
        copy_src = src.copy()
        dst = np.zeros(size, np.uint8)
        samples.append(
            _timed("memcpy", "copy", size, round_index, _time_copy(dst, copy_src, n, warm))
        )
        tiers, notes = make_memory_tiers(max(4 * size, MIB))
        try:
            for label, tier in tiers:
                timing = await _time_put(tier, src, n, warm)
                samples.append(_timed(label, "put", size, round_index, timing))
                timing = await _time_get(tier, "a", dst, n, warm)
                samples.append(_timed(label, "get", size, round_index, timing))
                if not np.array_equal(dst, src):
                    raise RuntimeError(f"{label}: get returned the wrong bytes")
                if label == "dram":
                    timing = await _time_get_new(tier, "a", n, warm)
                    samples.append(_timed(label, "get_new", size, round_index, timing))
            for label, tier in tiers:
                if label == "cxl":
                    notes["cxl_emulated_wait_s"] = tier.stats()["emulated_wait_s"]
        finally:
            for _, tier in tiers:
                await tier.aclose()
    return samples, notes


# ---------------------------------------------------------------------- hit cost
async def _loop_tier(tier: Any, order: list[str], dst: np.ndarray) -> int:
    start = time.perf_counter_ns()
    for key in order:
        await tier.get(key, into=dst)
    return time.perf_counter_ns() - start


async def _loop_copy(order: list[str], src: np.ndarray, dst: np.ndarray) -> int:
    start = time.perf_counter_ns()
    for _key in order:
        np.copyto(dst, src)
    return time.perf_counter_ns() - start


async def hit_overhead(repeats: int, loop_ops: int) -> dict[str, list[float]]:
    """Per repeat: us per op of the bare copy, and each hit path's us per op minus that copy.

    Paths: ``tier`` (DramTier.get) and ``store_<policy>`` (TieredStore([DramTier]).get, a hit in
    DRAM; the hit path is the same with an NVMe tier below). 1024 objects of 4 KiB, gets in a
    shuffled order of all keys, repeated to ``loop_ops``.
    """
    rng = np.random.default_rng(7)
    src = rng.integers(0, 256, HIT_OBJECT_BYTES, dtype=np.uint8)
    dst = np.zeros(HIT_OBJECT_BYTES, np.uint8)
    keys = [f"obj-{i:05d}" for i in range(HIT_KEYS)]
    order = [keys[i] for i in rng.integers(0, HIT_KEYS, loop_ops)]
    capacity = 4 * MIB
    tier = DramTier("hit", capacity)
    stores = {p: TieredStore([DramTier(f"hit-{p}", capacity)], p) for p in POLICIES}
    for key in keys:
        await tier.put(key, src)
        for store in stores.values():
            await store.put(key, src)
    out: dict[str, list[float]] = {"copy_us": [], "tier": []}
    out.update({f"store_{p}": [] for p in POLICIES})
    try:
        for _ in range(2):  # warm-up: caches, branch predictors, the policies' heaps
            await _loop_tier(tier, order, dst)
            for store in stores.values():
                await _loop_tier(store, order, dst)
        for _ in range(repeats):
            copy_us = await _loop_copy(order, src, dst) / 1e3 / loop_ops
            out["copy_us"].append(copy_us)
            out["tier"].append(await _loop_tier(tier, order, dst) / 1e3 / loop_ops - copy_us)
            for policy, store in stores.items():
                store_us = await _loop_tier(store, order, dst) / 1e3 / loop_ops
                out[f"store_{policy}"].append(store_us - copy_us)
        for store in stores.values():
            if store.stats()["tiers"][0]["misses"]:
                raise RuntimeError("a hit-cost get missed DRAM")
    finally:
        await tier.aclose()
        for store in stores.values():
            await store.aclose()
    return out
