"""The vector-index part of ``tierkit demo``: build, search, update and reopen a SpannIndex.

Data: a generated mixture of clusters (so the demo runs anywhere); recall is measured against an
exact brute-force search of the same data, in the same run. numba's search kernels are compiled
(or loaded from numba's cache) before anything is timed: a first compile inside the timed search
would report an index ten times slower than it is.
"""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any

import numpy as np

from tierkit.tables import table
from vectordb import IndexConfig, SpannIndex, dot_kernel, head_scan
from vectordb.metric import Metric, pairwise_distances, prepare

__all__ = ["run_vectordb_demo"]


def _mixture(n: int, dim: int, seed: int) -> np.ndarray:
    """Clusters in a 16-d latent space, projected to ``dim``: embeddings have a low intrinsic
    dimension, and isotropic high-dimensional noise would make every neighbour a near tie."""
    rng = np.random.default_rng(0)  # the same clusters and projection for base and queries
    centres = rng.normal(size=(64, 16)) * 3
    projection = rng.normal(size=(16, dim))
    rng = np.random.default_rng(seed)
    latent = centres[rng.integers(64, size=n)] + rng.normal(size=(n, 16))
    noise = 0.1 * rng.normal(size=(n, dim))
    return (latent @ projection + noise).astype(np.float32)


def _recall(metric: Metric, ids: np.ndarray, vectors: np.ndarray, queries: np.ndarray,
            found: np.ndarray, k: int) -> float:  # fmt: skip
    dist = pairwise_distances(metric, prepare(metric, queries), prepare(metric, vectors))
    truth = ids[np.argsort(dist, axis=1)[:, :k]]
    hits = [len(set(f) & set(t)) for f, t in zip(found.tolist(), truth.tolist(), strict=True)]
    return float(np.mean(hits)) / k


def ready_kernels(step: str) -> float:
    """Compile numba's search kernels, or load them from numba's cache (and import torch where
    the head scan uses it), as an index does when it opens, but here in the open, untimed.
    Returns the seconds it took."""
    print(f"{step} vector index: compiling numba's search kernels (first run only, then cached)")
    start = time.perf_counter()
    dot_kernel.warm_up(np.dtype(np.float32))
    if head_scan.bfloat16_is_native():
        head_scan.warm_up()
    elapsed = time.perf_counter() - start
    print(f"{step} vector index: kernels ready in {elapsed:.1f} s")
    return elapsed


@dataclass(frozen=True)
class _Data:
    vectors: np.ndarray
    ids: np.ndarray
    queries: np.ndarray
    extra: np.ndarray  # inserted after the first search
    extra_ids: np.ndarray

    @classmethod
    def make(cls, n: int, dim: int) -> _Data:
        extra = _mixture(n // 10, dim, seed=3)
        ids = np.arange(n + len(extra), dtype=np.int64)
        return cls(_mixture(n, dim, seed=1), ids[:n], _mixture(200, dim, seed=2), extra, ids[n:])

    @property
    def doomed(self) -> np.ndarray:  # deleted after the insert
        return self.ids[: len(self.ids) // 10]


async def run_vectordb_demo(
    directory: str, step: str, n: int = 20_000, dim: int = 96
) -> dict[str, Any]:
    """Prints each phase as it starts (prefixed ``step``), then a table; returns the summary's
    figures."""
    kernels_s = ready_kernels(step)
    data = _Data.make(n, dim)
    print(f"{step} vector index: building a SPANN index of {n:,} x {dim} cosine vectors on disk...")
    figures = await _measure(os.path.join(directory, "vectors"), data, step)
    _report(data, figures, kernels_s)
    return {
        "vectordb_recall_at_10": round(figures["recall"], 3),
        "vectordb_recall_after_updates": round(figures["recall_after"], 3),
        "vectordb_qps": round(len(data.queries) / figures["search_s"]),
        "vectordb_resident_fraction": round(figures["stats"]["resident_fraction"], 3),
        "vectordb_kernels_ready_s": round(kernels_s, 2),
    }


async def _measure(path: str, data: _Data, step: str) -> dict[str, Any]:
    """Build, search, insert, delete; reopen and search again."""
    out: dict[str, Any] = {}
    index = await SpannIndex.create(path, IndexConfig(dim=data.vectors.shape[1], metric="cosine"))
    try:
        out["build_s"], _ = await _timed(index.build(data.ids, data.vectors))
        print(
            f"{step} vector index: searching {len(data.queries)} queries, inserting "
            f"{len(data.extra):,}, deleting {len(data.doomed):,}, reopening..."
        )
        before = index.stats()["pages_read"]
        out["search_s"], (found, _) = await _timed(index.search(data.queries, 10))
        out["pages"] = (index.stats()["pages_read"] - before) / len(data.queries)
        out["recall"] = _recall(Metric.COSINE, data.ids, data.vectors, data.queries, found, 10)
        out["insert_s"], _ = await _timed(index.insert(data.extra_ids, data.extra))
        await index.delete(data.doomed)
    finally:
        await index.aclose()
    index = await SpannIndex.open(path)
    try:
        out["reopened_s"], (found, _) = await _timed(index.search(data.queries, 10))
        out["stats"] = index.stats()
    finally:
        await index.aclose()
    kept = len(data.doomed)
    live_ids = np.concatenate([data.ids[kept:], data.extra_ids])
    live = np.concatenate([data.vectors[kept:], data.extra])
    out["recall_after"] = _recall(Metric.COSINE, live_ids, live, data.queries, found, 10)
    return out


def _report(data: _Data, f: dict[str, Any], kernels_s: float) -> None:
    n, dim = data.vectors.shape
    queries, extra, stats = len(data.queries), len(data.extra), f["stats"]
    rows = [
        (f"build {n:,} vectors", f"{f['build_s']:.2f} s", f"{n / f['build_s']:,.0f} vectors/s",
         "-"),
        (f"search {queries} queries", f"{f['search_s']:.2f} s",
         f"{queries / f['search_s']:,.0f} queries/s", f"{f['recall']:.3f}"),
        (f"insert {extra:,} vectors", f"{f['insert_s']:.2f} s",
         f"{extra / f['insert_s']:,.0f} vectors/s", "-"),
        (f"delete {len(data.doomed):,}, reopen, search", f"{f['reopened_s']:.2f} s", "-",
         f"{f['recall_after']:.3f}"),
    ]  # fmt: skip
    title = f"\nvector index: SPANN on disk, {n:,} x {dim} cosine vectors"
    print(table(title, ("step", "time", "rate", "recall@10"), rows))
    print(f"  {f['pages']:.0f} pages of 4 KiB read per query, O_DIRECT: from disk, not page cache")
    print(
        f"  {stats['n_heads']:,} heads in memory = {stats['resident_fraction']:.1%} of the raw "
        f"vectors; {stats['splits']} list splits; kernels ready in {kernels_s:.1f} s, untimed\n"
    )


async def _timed(work: Awaitable[Any]) -> tuple[float, Any]:
    """(seconds, result) of awaiting ``work``."""
    start = time.perf_counter()
    result = await work
    return time.perf_counter() - start, result
