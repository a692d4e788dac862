"""The store under Zipf(0.99) against the cache a user would write by hand.

10,000 objects of 64 KiB (fewer in smoke mode), popularity Zipf(0.99) over a random permutation
of the keys, DRAM holding 10% of the bytes. One seeded trace of warm-up + measured gets:

* ``store-<policy>``: ``TieredStore([DramTier, NvmeTier], policy)``, every object on NVMe at the
  start, ``CONCURRENCY`` tasks pulling gets from the trace into their own buffers, promotions in
  the background (``drain()`` at the end, inside the timed window);
* ``naive-lru``: a dict of copies ordered by an OrderedDict, byte-bounded, filled on every miss
  by a synchronous O_DIRECT ``os.preadv`` of the object from one flat file (the objects back to
  back), one get at a time: what a plain Python cache in front of a file does.

``zipf_gets_vs_naive_lru`` is the best policy's gets/s over naive-lru's in the same round. The
policies: "lru", "lfu", "cost" (promote on every miss) and "tinylfu" (promote a miss into the
full DRAM tier only when the key was asked more often than the coldest resident: fewer misses,
and no copy or eviction for a one-off cold read). The naive cache is the same in every case.
"""

from __future__ import annotations

import asyncio
import mmap
import os
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmarks.common.measure import KIB
from tiers.io import IORuntime
from tiers.memory import DramTier
from tiers.nvme import NvmeTier
from tiers.store import TieredStore

OBJECT_BYTES = 64 * KIB
ZIPF_S = 0.99
DRAM_SHARE = 0.10
CONCURRENCY = 8
POLICIES = ("lru", "lfu", "cost", "tinylfu")


@dataclass(frozen=True)
class PeerWork:
    count: int
    trace: np.ndarray  # key indices, warm-up first
    warmup_ops: int

    @property
    def dram_bytes(self) -> int:
        return int(self.count * OBJECT_BYTES * DRAM_SHARE)


def peer_work(mode: str, seed: int = 21) -> PeerWork:
    count, warmup, measured = {
        "smoke": (200, 200, 400),
        "quick": (10_000, 10_000, 20_000),
        "full": (10_000, 20_000, 60_000),
    }[mode]
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, count + 1, dtype=np.float64) ** ZIPF_S
    popularity = np.empty(count)
    popularity[rng.permutation(count)] = weights / weights.sum()
    return PeerWork(count, rng.choice(count, warmup + measured, p=popularity), warmup)


def _key(index: int) -> str:
    return f"o{index:06d}"


def _object(index: int) -> np.ndarray:
    return np.full(OBJECT_BYTES, index % 251, np.uint8)


async def populate_peer(directory: Path, work: PeerWork, runtime: IORuntime) -> None:
    """The NvmeTier (``directory/tier``) and the flat file (``directory/flat.dat``)."""
    directory.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240  (once, before timing)
    tier = await NvmeTier.open(
        "nvme", _capacity(work), directory / "tier", runtime=runtime, create=True
    )
    fd = os.open(directory / "flat.dat", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for first in range(0, work.count, 128):
            batch = {_key(i): _object(i) for i in range(first, min(work.count, first + 128))}
            await tier.put_many(batch)
            os.pwrite(fd, b"".join(v.tobytes() for v in batch.values()), first * OBJECT_BYTES)
        os.fsync(fd)
    finally:
        os.close(fd)
        await tier.aclose()


def _capacity(work: PeerWork) -> int:
    return work.count * OBJECT_BYTES * 2 + (64 << 20)


async def store_gets_per_s(
    directory: Path, work: PeerWork, policy: str, runtime: IORuntime
) -> tuple[float, float]:
    """(gets/s of the measured part, DRAM hit rate)."""
    nvme = await NvmeTier.open("nvme", _capacity(work), directory / "tier", runtime=runtime)
    store = TieredStore([DramTier("dram", work.dram_bytes), nvme], policy)
    try:
        keys = [_key(i) for i in range(work.count)]

        async def replay(trace: np.ndarray) -> float:
            pending = iter(trace.tolist())

            async def worker() -> None:
                into = np.empty(OBJECT_BYTES, np.uint8)
                for index in pending:
                    if await store.get(keys[index], into=into) is None:
                        raise RuntimeError(f"zipf: {keys[index]} is missing")

            started = time.perf_counter()
            await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
            await store.drain()
            return time.perf_counter() - started

        await replay(work.trace[: work.warmup_ops])
        hits0 = store.counters[0].hits
        elapsed = await replay(work.trace[work.warmup_ops :])
        measured = len(work.trace) - work.warmup_ops
        return measured / elapsed, (store.counters[0].hits - hits0) / measured
    finally:
        await store.aclose()


class NaiveLru:
    """A dict of copies + an OrderedDict for recency, over O_DIRECT preads of a flat file."""

    def __init__(self, path: Path, capacity_bytes: int) -> None:
        self.fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        self.capacity_bytes = capacity_bytes
        self.used_bytes = 0
        self.hits = 0
        self.cache: dict[int, np.ndarray] = {}
        self.order: OrderedDict[int, None] = OrderedDict()
        self._staging = mmap.mmap(-1, OBJECT_BYTES)  # page-aligned, as O_DIRECT needs
        self._view = np.frombuffer(self._staging, np.uint8)

    def get(self, index: int, into: np.ndarray) -> np.ndarray:
        cached = self.cache.get(index)
        if cached is not None:
            self.order.move_to_end(index)
            into[:] = cached
            self.hits += 1
            return into
        if os.preadv(self.fd, [self._staging], index * OBJECT_BYTES) != OBJECT_BYTES:
            raise RuntimeError("naive-lru: short read")
        while self.used_bytes + OBJECT_BYTES > self.capacity_bytes and self.order:
            old, _ = self.order.popitem(last=False)
            del self.cache[old]
            self.used_bytes -= OBJECT_BYTES
        self.cache[index] = self._view.copy()
        self.order[index] = None
        self.used_bytes += OBJECT_BYTES
        into[:] = self._view
        return into

    def close(self) -> None:
        os.close(self.fd)
        del self._view
        self._staging.close()


def naive_gets_per_s(directory: Path, work: PeerWork) -> tuple[float, float]:
    """(gets/s of the measured part, hit rate) of NaiveLru on the same trace."""
    cache = NaiveLru(directory / "flat.dat", work.dram_bytes)
    into = np.empty(OBJECT_BYTES, np.uint8)
    try:
        for index in work.trace[: work.warmup_ops].tolist():
            cache.get(index, into)
        hits0 = cache.hits
        measured = work.trace[work.warmup_ops :].tolist()
        started = time.perf_counter()
        for index in measured:
            cache.get(index, into)
        elapsed = time.perf_counter() - started
        return len(measured) / elapsed, (cache.hits - hits0) / len(measured)
    finally:
        cache.close()
