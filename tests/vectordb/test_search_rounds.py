"""A large batch at a large ``max_postings`` under the tightest memory budget: each query's
lists are more than the budget's read buffer, so a chunk reads them in rounds that each fit
it (search_chunk) and the batch is searched in slices of ``batch_queries`` (search.py). The
answers are those of an index without a budget (exact scoring of the same lists), and no
read buffer larger than the budget's is ever made. Real io_uring and files."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np

from tests.vectordb.helpers import clustered
from tests.vectordb.test_memory_budget_callers import _BufferWatch
from vectordb import IndexConfig, SearchParams, SpannIndex
from vectordb import search as search_module

DIM = 96
BUDGET = 9 << 20  # the read buffer at its floor (1 MiB), no list cache


def test_tight_batch_reads_in_rounds_and_answers_as_unbudgeted(
    tmp_path: Path, monkeypatch: Any
) -> None:
    vectors = clustered(6000, DIM, seed=91, clusters=30)
    queries = clustered(300, DIM, seed=92, clusters=30)
    batch_sizes: list[int] = []
    run_batch = search_module.run_batch

    async def counted(index: Any, prepared: np.ndarray, *args: Any, **kwargs: Any) -> Any:
        batch_sizes.append(len(prepared))
        return await run_batch(index, prepared, *args, **kwargs)

    async def main() -> None:
        async with await SpannIndex.create(tmp_path / "i", IndexConfig(dim=DIM)) as index:
            await index.build(None, vectors)
            heads = index.stats()["n_heads"]
            # shared lists off: a query scores exactly its own lists, however they are read
            params = SearchParams(max_postings=min(heads, 120), shared_postings=0)
            lists = index.store.read_pages(np.arange(heads)) * 4096
            assert lists > 2 << 20  # a query's lists: more than two read buffers
            alone = (await index.search(queries, 10, params)).ids
        async with await SpannIndex.open(tmp_path / "i", memory_budget_bytes=BUDGET) as index:
            stats = index.stats()
            read = stats["read_buffer_bytes"]
            assert read == 1 << 20 and stats["read_buffers_in_flight"] == 1
            watch = _BufferWatch(index.store)
            monkeypatch.setattr(search_module, "run_batch", counted)
            tight = (await index.search(queries, 10, params)).ids
            slice_queries = index.stats()["gathered_batch_queries_max"]
        np.testing.assert_array_equal(tight, alone)
        assert 0 < watch.peak_bytes <= read  # rounds in one buffer: never a larger one
        assert slice_queries < len(queries) and max(batch_sizes) == slice_queries
        assert sum(batch_sizes) == len(queries)

    asyncio.run(main())
