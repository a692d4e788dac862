"""The systems a budget worker (``_budget_worker.py``) measures, behind one small interface.

Each system answers three calls, every one over a list of queries and one knob value:
``batch`` (all queries in one call), ``single`` (one query per call, one caller) and
``concurrent`` (``callers`` callers, each taking the next query when its last one is answered).
Each returns (ids [Q, k], per-call latencies in seconds). The one-query modes take no new query
after ``deadline`` (a ``time.perf_counter`` value): under a tight limit a thrashing system can
take minutes per pass; rows never searched stay -1 and the worker scores only the others.
``cold`` closes the index, drops its files from the page cache and opens it again (untimed:
opening is excluded for every system). Ours opens once per worker (``keep_open``, all plans
but smoke: at 2M an opening rebuilds a 165k-head HNSW navigator, and at 13.7 MiB each
reopening left more anonymous memory) and a cold start empties its list cache and drops its
files from the page cache instead: as cold for the data, its heads (like faiss's quantizer,
read back at its reopening) resident either way.

Concurrency follows each library's own way of serving callers: ours is an asyncio API, so N
callers are N tasks on one event loop, each awaiting ``index.search`` of one query; faiss
releases the GIL inside ``search``, so N callers are N Python threads, each calling
``index.search`` on one query. faiss runs 2 OpenMP threads per call (the machine's cores);
ours uses its runtime's defaults.
"""

from __future__ import annotations

import asyncio
import gc
import inspect
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from benchmarks.vectordb._common import drop_page_cache, stdout_to_stderr
from vectordb import IndexConfig, SearchParams, SpannIndex

THREADS = 2
Timed = tuple[np.ndarray, list[float]]


def budget_supported() -> bool:
    """Whether this commit's ``SpannIndex.open`` takes ``memory_budget_bytes``."""
    return "memory_budget_bytes" in inspect.signature(SpannIndex.open).parameters


class Ours:
    knob = "max_postings"

    def __init__(
        self, directory: str, memory_budget_bytes: int | None, keep_open: bool = False
    ) -> None:
        self.directory = directory
        self.keep_open = keep_open
        self.options: dict[str, Any] = {}
        if memory_budget_bytes is not None and budget_supported():
            self.options["memory_budget_bytes"] = memory_budget_bytes
        self.runner = asyncio.Runner()
        self.index = self.runner.run(SpannIndex.open(directory, **self.options))
        # the pass at this value runs with SearchParams() as a user calls it (the index's
        # default: a quarter more lists for a lone query than for a batch, search.py)
        self.default_value = int(self.index.stats()["default_max_postings"])

    def cold(self) -> None:
        if self.keep_open:  # no list cached, no page of its files in the page cache
            self.runner.run(self.index.memory.empty_cache(self.index))
            drop_page_cache(self.index.data_files())
            gc.collect()
            return
        # reopening also empties the index's own list cache: every pass starts cold
        self.runner.run(self.index.aclose())
        drop_page_cache(self.index.data_files())
        del self.index  # as faiss's is: the old index's memory is free before the new one's
        gc.collect()
        self.index = self.runner.run(SpannIndex.open(self.directory, **self.options))

    def stats(self) -> dict[str, Any]:
        return dict(self.index.stats())

    def batch(self, queries: np.ndarray, k: int, value: int) -> Timed:
        start = time.perf_counter()
        ids, _ = self.runner.run(self.index.search(queries, k=k, params=self._params(value)))
        return ids, [time.perf_counter() - start]

    def batch_within(self, queries: np.ndarray, k: int, value: int, limit_s: float) -> Timed:
        """``batch``: ours' batch is awaited to its end (a worker the parent kills meanwhile
        reports nothing for it)."""
        return self.batch(queries, k, value)

    def single(self, queries: np.ndarray, k: int, value: int, deadline: float) -> Timed:
        return self.concurrent(queries, k, value, 1, deadline)

    def concurrent(
        self, queries: np.ndarray, k: int, value: int, callers: int, deadline: float
    ) -> Timed:
        return self.runner.run(self._callers(queries, k, self._params(value), callers, deadline))

    async def _callers(
        self, queries: np.ndarray, k: int, params: SearchParams, callers: int, deadline: float
    ) -> Timed:
        ids = np.full((len(queries), k), -1, np.int64)
        latencies: list[float] = []
        todo = iter(range(len(queries)))  # shared: a caller takes the next query when free

        async def caller() -> None:
            for row in todo:
                start = time.perf_counter()
                if start > deadline:
                    return
                found, _ = await self.index.search(queries[row : row + 1], k=k, params=params)
                latencies.append(time.perf_counter() - start)
                ids[row] = found[0]

        await asyncio.gather(*(caller() for _ in range(callers)))
        return ids, latencies

    def _params(self, value: int) -> SearchParams:
        return SearchParams() if value == self.default_value else SearchParams(max_postings=value)

    def close(self) -> None:
        self.runner.run(self.index.aclose())
        self.runner.close()


class Faiss:
    """faiss IVF-Flat OnDisk (``kind="ondisk"``), or IVF-Flat / HNSW32 in RAM."""

    def __init__(self, kind: str, path: str, data_path: str | None) -> None:
        faiss.omp_set_num_threads(THREADS)
        self.kind, self.path, self.data_path = kind, path, data_path
        self.knob = "efSearch" if kind == "hnsw" else "nprobe"
        self.default_value = 16 if kind == "hnsw" else 1  # faiss's own defaults
        self.index = self._open()

    def _open(self) -> faiss.Index:
        flags = faiss.IO_FLAG_ONDISK_SAME_DIR if self.kind == "ondisk" else 0
        with stdout_to_stderr():  # faiss reports the SAME_DIR path rewrite with printf
            return faiss.read_index(self.path, flags)

    def cold(self) -> None:
        if self.kind != "ondisk":
            return  # in RAM: nothing is read from disk while searching
        del self.index  # unmaps .ivfdata: the kernel does not drop pages still mapped
        drop_page_cache([str(self.data_path)])
        self.index = self._open()

    def stats(self) -> dict[str, Any]:
        return {"file_bytes": Path(self.path).stat().st_size}

    def _search(self, queries: np.ndarray, k: int, value: int) -> np.ndarray:
        if self.kind == "hnsw":
            params: faiss.SearchParameters = faiss.SearchParametersHNSW(efSearch=max(value, k))
        else:
            params = faiss.SearchParametersIVF(nprobe=int(value))
        _, ids = self.index.search(queries, k, params=params)
        return ids

    def batch(self, queries: np.ndarray, k: int, value: int) -> Timed:
        start = time.perf_counter()
        ids = self._search(queries, k, value)
        return ids, [time.perf_counter() - start]

    def batch_within(self, queries: np.ndarray, k: int, value: int, limit_s: float) -> Timed | None:
        """``batch``, or None when it has not returned after ``limit_s`` (faiss's search
        cannot be stopped: it goes on in a daemon thread, and the worker must end without
        touching the index again: _budget_worker)."""
        out: list[Timed] = []
        worker = threading.Thread(target=lambda: out.append(self.batch(queries, k, value)))
        worker.daemon = True
        worker.start()
        worker.join(max(limit_s, 0.0))
        return out[0] if out else None

    def single(self, queries: np.ndarray, k: int, value: int, deadline: float) -> Timed:
        ids = np.full((len(queries), k), -1, np.int64)
        latencies = []
        for row in range(len(queries)):
            start = time.perf_counter()
            if start > deadline:
                break
            ids[row] = self._search(queries[row : row + 1], k, value)[0]
            latencies.append(time.perf_counter() - start)
        return ids, latencies

    def concurrent(
        self, queries: np.ndarray, k: int, value: int, callers: int, deadline: float
    ) -> Timed:
        ids = np.full((len(queries), k), -1, np.int64)
        latencies: list[float] = []
        todo, lock = iter(range(len(queries))), threading.Lock()

        def caller() -> None:
            while True:
                with lock:  # the shared iterator: a thread takes the next query when free
                    row = next(todo, None)
                start = time.perf_counter()
                if row is None or start > deadline:
                    return
                ids[row] = self._search(queries[row : row + 1], k, value)[0]
                latencies.append(time.perf_counter() - start)  # list.append is atomic

        with ThreadPoolExecutor(callers) as pool:
            for done in [pool.submit(caller) for _ in range(callers)]:
                done.result()
        return ids, latencies

    def close(self) -> None:
        del self.index


def warm_up(system: str, dim: int) -> None:
    """Run the system's code once on a tiny throwaway index of its own, so that what a process
    needs before it holds any data -- compiled kernels, runtime threads, rings, allocator arenas
    -- is in the baseline every system's limit starts from, not charged to its data budget."""
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((2000, dim)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    if system == "ours":
        asyncio.run(_warm_ours(vectors))
        return
    faiss.omp_set_num_threads(THREADS)
    if system == "faiss_hnsw":
        index: faiss.Index = faiss.IndexHNSWFlat(dim, 32, faiss.METRIC_INNER_PRODUCT)
    else:
        index = faiss.IndexIVFFlat(faiss.IndexFlatIP(dim), dim, 8, faiss.METRIC_INNER_PRODUCT)
        index.train(vectors)
    index.add(vectors)
    index.search(vectors[:32], 10)
    for row in range(8):
        index.search(vectors[row : row + 1], 10)


async def _warm_ours(vectors: np.ndarray) -> None:
    with tempfile.TemporaryDirectory() as directory:
        config = IndexConfig(dim=vectors.shape[1], metric="ip")
        async with await SpannIndex.create(directory, config) as index:
            await index.build(None, vectors)
            await index.search(vectors[:32], 10)
            await asyncio.gather(*(index.search(v, 10) for v in vectors[:8]))


def make(
    system: str, paths: dict[str, str], memory_budget_bytes: int | None, keep_open: bool = False
) -> Any:
    """The system named ``system`` ("ours", "faiss_ondisk", "faiss_ivf", "faiss_hnsw")."""
    if system == "ours":
        return Ours(paths["index"], memory_budget_bytes, keep_open)
    kind = system.removeprefix("faiss_")
    return Faiss(kind, paths["index"], paths.get("data"))
