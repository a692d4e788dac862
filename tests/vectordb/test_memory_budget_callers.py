"""Many concurrent one-query callers under a tight memory budget: the index keeps to the split
it reports -- one read buffer in flight, the process's anonymous memory growing by no more than
the read buffers and scratch ``stats()`` accounts for -- and answers as well as alone.

The read buffers are watched through the store's own ``take_buffer`` (each buffer's memory
followed until it is freed); RSS is the process's ``RssAnon``, sampled from another thread.
Real io_uring, LMDB and allocator."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
import weakref
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.vectordb.helpers import brute_force, clustered, recall
from vectordb import IndexConfig, SpannIndex
from vectordb.metric import Metric

DIM = 32
BUDGET = 9 << 20  # heads ~0.1 MB: the read buffer at its floor (1 MiB), no list cache
CALLERS = 64
# what a search may take beside the split's buffers and scratch: 64 callers' tasks and
# queries, a batch's bookkeeping, the allocator's rounding (measured ~0.5 MiB here)
OTHER_BYTES = 3 << 20

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc/self/status")


def _anon_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no RssAnon")


class _BufferWatch:
    """Bytes of the store's read buffers alive at once (a buffer counts until its memory is
    freed, wherever it went: kept as a spare, or dropped)."""

    def __init__(self, store: Any) -> None:
        self.live_bytes = self.peak_bytes = 0
        self._owners: set[int] = set()  # ids of the arrays owning a counted buffer's memory
        take = store.take_buffer

        def watched(size_bytes: int) -> np.ndarray:
            buffer = take(size_bytes)
            owner = buffer.base if buffer.base is not None else buffer
            if id(owner) not in self._owners:  # a recycled spare is counted once
                self._owners.add(id(owner))
                weakref.finalize(owner, self._freed, id(owner), len(buffer))
                self.live_bytes += len(buffer)
                self.peak_bytes = max(self.peak_bytes, self.live_bytes)
            return buffer

        store.take_buffer = watched

    def _freed(self, owner: int, size_bytes: int) -> None:
        self._owners.discard(owner)
        self.live_bytes -= size_bytes


def test_many_callers_keep_to_the_budget_split(tmp_path: Path) -> None:
    # ~260 lists of a page or two: 64 callers' lists fill a 1 MiB buffer several times over
    vectors = clustered(4000, DIM, seed=81, clusters=40)
    queries = clustered(256, DIM, seed=82, clusters=40)
    truth, _ = brute_force(Metric.L2, np.arange(len(vectors)), vectors, queries, 10)

    async def main() -> tuple[np.ndarray, np.ndarray, dict[str, Any], int, int, int]:
        async with await SpannIndex.create(tmp_path / "i", IndexConfig(dim=DIM)) as index:
            await index.build(None, vectors)
            alone = np.concatenate([(await index.search(q, 10)).ids for q in queries])
        async with await SpannIndex.open(tmp_path / "i", memory_budget_bytes=BUDGET) as index:
            watch = _BufferWatch(index.store)
            await index.search(queries[0], 10)  # first-use costs (kernels, threads) first
            found = np.full((len(queries), 10), -1, np.int64)
            todo = iter(range(len(queries)))
            before = peak = _anon_bytes()
            done = False

            def sample() -> None:
                nonlocal peak
                while not done:
                    peak = max(peak, _anon_bytes())
                    time.sleep(0.0005)

            async def caller() -> None:
                for row in todo:
                    found[row] = (await index.search(queries[row], 10)).ids[0]

            sampler = threading.Thread(target=sample)
            sampler.start()
            try:
                await asyncio.gather(*(caller() for _ in range(CALLERS)))
            finally:
                done = True
                sampler.join()
            return alone, found, index.stats(), watch.peak_bytes, before, peak

    alone, found, stats, peak_buffers, before, peak = asyncio.run(main())
    assert recall(found, truth) >= recall(alone, truth) - 0.01  # unbudgeted, one by one
    assert stats["gathered_batches"] > 0 and stats["gathered_queries"] > CALLERS
    assert not stats["memory_over_budget"] and stats["list_cache_capacity_bytes"] == 0
    read, in_flight = stats["read_buffer_bytes"], stats["read_buffers_in_flight"]
    assert in_flight == 1  # the floor: one chunk, one buffer at a time
    split = stats["memory_fixed_bytes"] + in_flight * read + stats["memory_scratch_bytes"]
    assert split + stats["memory_slack_bytes"] == stats["memory_split_bytes"] <= BUDGET
    assert 0 < peak_buffers <= in_flight * read  # never a second buffer beside the first
    grown = peak - before
    assert grown <= in_flight * read + stats["memory_scratch_bytes"] + OTHER_BYTES, grown
