"""A Zipf get workload over a working set 4x the DRAM tier: hit rate and throughput per variant.

Objects have sizes drawn from {4 KiB (50%), 64 KiB (40%), 1 MiB (10%)} until they add up to 4x
the DRAM capacity; popularity is Zipf(s) over a random permutation of the keys (independent of
size), and one seeded trace of warm-up + measured gets is replayed for every variant:

* ``lru``, ``lfu``, ``cost``: ``TieredStore([DramTier, NvmeTier], policy)``, write-through (the
  default with an NVMe tier), every object on NVMe at the start, promoted on hit;
* ``plain-lru``: a minimal OrderedDict LRU cache of the same capacity in front of the NvmeTier
  (copy into it on every miss, synchronously): the peer for the store's own LRU;
* ``nvme-only``: ``TieredStore([NvmeTier])``, every get from NVMe.

Gets run ``CONCURRENCY`` at a time (tasks sharing the trace) in batches of ``BATCH``; after each
batch ``store.drain()`` waits for the background promotions, inside the timed window, so
throughput pays for migration. The NVMe directory is filled once and reopened per variant.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common.measure import KIB, MIB
from tiers.io import IORuntime
from tiers.memory import DramTier
from tiers.nvme import NvmeTier
from tiers.store import TieredStore

ZIPF_SIZES = (4 * KIB, 64 * KIB, MIB)
ZIPF_SIZE_WEIGHTS = (0.5, 0.4, 0.1)
VARIANTS = ("nvme-only", "plain-lru", "lru", "lfu", "cost")
POLICY_VARIANTS = ("lru", "lfu", "cost")
CONCURRENCY = 8
BATCH = 128


@dataclass(frozen=True)
class Workload:
    keys: list[str]
    sizes: np.ndarray  # bytes per key
    popularity: np.ndarray  # probability per key
    trace: np.ndarray  # key indices, warm-up first
    warmup_ops: int
    dram_bytes: int
    zipf_s: float


@dataclass(frozen=True)
class ZipfSample:
    variant: str
    round_index: int
    hit_rate: float  # gets served from DRAM / gets (measured part)
    byte_hit_rate: float
    gets_per_s: float
    mb_per_s: float  # 10^6 B/s of objects returned
    p50_us: float
    p99_us: float
    drain_share: float  # fraction of the window spent in store.drain()
    nvme_reads_per_miss: float  # NvmeTier gets / gets served from NVMe (promotion re-reads)


def make_workload(dram_bytes: int, warmup_ops: int, measure_ops: int, zipf_s: float, seed: int):
    rng = np.random.default_rng(seed)
    draws = rng.choice(ZIPF_SIZES, size=1 << 20, p=ZIPF_SIZE_WEIGHTS)
    count = int(np.searchsorted(np.cumsum(draws), 4 * dram_bytes)) + 1
    sizes = draws[:count].astype(np.int64)
    by_rank = 1.0 / np.arange(1, count + 1, dtype=np.float64) ** zipf_s
    by_rank /= by_rank.sum()
    popularity = np.empty(count)
    popularity[rng.permutation(count)] = by_rank
    trace = rng.choice(count, size=warmup_ops + measure_ops, p=popularity)
    keys = [f"z{i:06d}" for i in range(count)]
    return Workload(keys, sizes, popularity, trace, warmup_ops, dram_bytes, zipf_s)


def nvme_capacity(work: Workload) -> int:
    return int(work.sizes.sum()) * 2 + 64 * MIB


async def populate(directory: Path, runtime: IORuntime, work: Workload) -> float:
    """Write every object to a fresh NvmeTier in ``directory``; returns seconds taken."""
    tier = await NvmeTier.open("nvme", nvme_capacity(work), directory, runtime=runtime, create=True)
    payload = np.random.default_rng(5).integers(0, 256, max(ZIPF_SIZES), dtype=np.uint8)
    pending = iter(range(len(work.keys)))

    async def worker() -> None:
        for i in pending:
            await tier.put(work.keys[i], payload[: int(work.sizes[i])])

    started = time.perf_counter()
    try:
        await asyncio.gather(*(worker() for _ in range(16)))
    finally:
        await tier.aclose()
    return time.perf_counter() - started


class PlainLru:
    """The simplest DRAM cache: an OrderedDict of copies, byte-bounded, filled on every miss."""

    def __init__(self, nvme: NvmeTier, capacity_bytes: int) -> None:
        self.nvme = nvme
        self.capacity_bytes = capacity_bytes
        self.used_bytes = 0
        self.hits = self.hit_bytes = 0
        self._objects: OrderedDict[str, np.ndarray] = OrderedDict()

    async def get(self, key: str, *, into: Any) -> Any:
        cached = self._objects.get(key)
        if cached is not None:
            self._objects.move_to_end(key)
            into[: cached.size] = cached
            self.hits += 1
            self.hit_bytes += cached.size
            return into
        size = self.nvme.size_of(key)
        if await self.nvme.get(key, into=into) is None or size is None:
            return None
        if key not in self._objects and size <= self.capacity_bytes:
            while self.used_bytes + size > self.capacity_bytes:
                _, old = self._objects.popitem(last=False)
                self.used_bytes -= old.size
            self._objects[key] = into[:size].copy()
            self.used_bytes += size
        return into


def _dram_counts(store: Any) -> tuple[int, int]:
    """(gets served from DRAM, bytes served from DRAM) so far."""
    if isinstance(store, PlainLru):
        return store.hits, store.hit_bytes
    if len(store.tiers) == 1:
        return 0, 0
    return store.counters[0].hits, store.tiers[0].stats()["bytes_read"]


async def _replay(
    get: Any, drain: Any, work: Workload, trace: np.ndarray, buffers: list[np.ndarray]
) -> tuple[float, float, list[int]]:
    """(seconds, seconds in drain, per-get latencies) for ``trace``."""
    lat: list[int] = []
    clock = time.perf_counter_ns
    keys = work.keys

    async def worker(pending: Any, into: np.ndarray) -> None:
        for index in pending:
            start = clock()
            if await get(keys[index], into=into) is None:
                raise RuntimeError(f"zipf: {keys[index]} is missing")
            lat.append(clock() - start)

    drain_s = 0.0
    started = time.perf_counter()
    for first in range(0, len(trace), BATCH):
        pending = iter(trace[first : first + BATCH].tolist())
        await asyncio.gather(*(worker(pending, into) for into in buffers))
        if drain is not None:
            mark = time.perf_counter()
            await drain()
            drain_s += time.perf_counter() - mark
    return time.perf_counter() - started, drain_s, lat


async def run_variant(
    variant: str, directory: Path, runtime: IORuntime, work: Workload, round_index: int
) -> tuple[ZipfSample, dict[str, Any]]:
    nvme = await NvmeTier.open("nvme", nvme_capacity(work), directory, runtime=runtime, create=True)
    cache: Any
    if variant == "plain-lru":
        cache, drain = PlainLru(nvme, work.dram_bytes), None
    elif variant == "nvme-only":
        cache = TieredStore([nvme], "lru")
        drain = cache.drain
    else:
        cache = TieredStore([DramTier("dram", work.dram_bytes), nvme], variant)
        drain = cache.drain
    buffers = [np.empty(max(ZIPF_SIZES), np.uint8) for _ in range(CONCURRENCY)]
    try:
        warm, measured = work.trace[: work.warmup_ops], work.trace[work.warmup_ops :]
        await _replay(cache.get, drain, work, warm, buffers)
        hits0, hit_bytes0 = _dram_counts(cache)
        nvme_gets0 = nvme.counters["gets"]
        elapsed, drain_s, lat = await _replay(cache.get, drain, work, measured, buffers)
        hits, hit_bytes = _dram_counts(cache)
        nvme_gets = nvme.counters["gets"] - nvme_gets0
        extra = cache.stats() if isinstance(cache, TieredStore) else {}
    finally:
        if isinstance(cache, TieredStore):
            await cache.aclose()  # closes its tiers; the runtime stays ours
        else:
            await nvme.aclose()
    total_bytes = int(work.sizes[measured].sum())
    hits -= hits0
    misses = len(measured) - hits
    p50, p99 = np.percentile(np.asarray(lat, np.float64), [50, 99]) / 1e3
    sample = ZipfSample(
        variant=variant,
        round_index=round_index,
        hit_rate=hits / len(measured),
        byte_hit_rate=(hit_bytes - hit_bytes0) / total_bytes,
        gets_per_s=len(measured) / elapsed,
        mb_per_s=total_bytes / elapsed / 1e6,
        p50_us=float(p50),
        p99_us=float(p99),
        drain_share=drain_s / elapsed,
        nvme_reads_per_miss=nvme_gets / misses if misses else float("nan"),
    )
    return sample, extra


# ---------------------------------------------------------------------- offline references
def simulated_lru_hit_rate(work: Workload) -> float:
    """Hit rate of a textbook byte-bounded LRU on the same trace (admit on every miss)."""
    cache: OrderedDict[int, int] = OrderedDict()
    used = hits = 0
    sizes = work.sizes.tolist()
    for step, index in enumerate(work.trace.tolist()):
        if index in cache:
            cache.move_to_end(index)
            hits += step >= work.warmup_ops
            continue
        while used + sizes[index] > work.dram_bytes:
            _, size = cache.popitem(last=False)
            used -= size
        cache[index] = sizes[index]
        used += sizes[index]
    return hits / (len(work.trace) - work.warmup_ops)


def static_oracle_hit_rate(work: Workload) -> float:
    """Hit rate of the measured gets if DRAM held, fixed, the keys of highest popularity/size."""
    order = np.argsort(-work.popularity / work.sizes)
    fits = np.cumsum(work.sizes[order]) <= work.dram_bytes
    held = np.zeros(len(work.keys), bool)
    held[order[fits]] = True
    return float(held[work.trace[work.warmup_ops :]].mean())
