"""The update phase (SPFresh side of issue 4), on debian-minilm.

A random 90% of the base is built into an index (cached like the main build, then copied so every
run starts from the same state); the held-out 10% is then inserted and a random 10% of the built
ids deleted, interleaved in ``steps`` equal slices (insert a slice, delete a slice, search). After
every step the 500 queries run at the default SearchParams and recall@10 is scored against the
exact top-10 of the *live* set (brute force with faiss ``knn`` over the live rows). Insert and
delete throughput count only the time inside ``insert``/``delete`` (durable when they return: the
write-ahead log is written first). At the end: ``checkpoint`` is timed, the index is closed,
reopened (the WAL replay path) and searched once more.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from benchmarks.vectordb._common import log, recall_at
from benchmarks.vectordb._data import Dataset
from benchmarks.vectordb._ours import cached_build
from vectordb import SpannIndex


@dataclass
class UpdateResult:
    steps: list[dict] = field(default_factory=list)  # per step: counts, rates, recall
    insert_s: float = 0.0
    delete_s: float = 0.0
    inserted: int = 0
    deleted: int = 0
    checkpoint_s: float = float("nan")
    recall_after_reopen: float = float("nan")
    final_stats: dict = field(default_factory=dict)

    @property
    def insert_rate(self) -> float:
        return self.inserted / self.insert_s if self.insert_s else float("nan")

    @property
    def delete_rate(self) -> float:
        return self.deleted / self.delete_s if self.delete_s else float("nan")

    @property
    def min_recall(self) -> float:
        return min(s["recall"] for s in self.steps)

    @property
    def final_recall(self) -> float:
        return self.steps[-1]["recall"]


def _live_truth(ds: Dataset, live: np.ndarray, k: int) -> np.ndarray:
    rows = np.ascontiguousarray(ds.base[live], dtype=np.float32)
    _, found = faiss.knn(ds.queries, rows, k, metric=ds.faiss_metric)
    return live[found]


async def _phase(
    directory: Path,
    ds: Dataset,
    built: np.ndarray,
    held: np.ndarray,
    doomed: np.ndarray,
    steps: int,
) -> UpdateResult:
    result = UpdateResult()
    live = np.zeros(len(ds.base), bool)
    live[built] = True
    index = await SpannIndex.open(directory)
    try:
        ids, _ = await index.search(ds.queries, k=10)
        recall = recall_at(ids, _live_truth(ds, np.flatnonzero(live), 10))
        result.steps.append({"step": 0, "live": int(live.sum()), "recall": recall})
        log(f"update: step 0 (built {len(built):,}): recall@10 {recall:.4f}")
        for step, (add, drop) in enumerate(
            zip(np.array_split(held, steps), np.array_split(doomed, steps), strict=True), 1
        ):
            start = time.perf_counter()
            await index.insert(add, ds.base[add])
            insert_s = time.perf_counter() - start
            start = time.perf_counter()
            await index.delete(drop)
            delete_s = time.perf_counter() - start
            live[add], live[drop] = True, False
            ids, _ = await index.search(ds.queries, k=10)
            recall = recall_at(ids, _live_truth(ds, np.flatnonzero(live), 10))
            result.insert_s += insert_s
            result.delete_s += delete_s
            result.inserted += len(add)
            result.deleted += len(drop)
            stats = index.stats()
            result.steps.append(
                {
                    "step": step,
                    "live": int(live.sum()),
                    "insert_per_s": len(add) / insert_s,
                    "delete_per_s": len(drop) / delete_s,
                    "recall": recall,
                    "splits": stats["splits"],
                    "merges": stats["merges"],
                    "reassigned": stats["reassigned"],
                }
            )
            log(
                f"update: step {step}/{steps}: +{len(add)} in {insert_s:.2f} s, -{len(drop)} in "
                f"{delete_s:.2f} s, recall@10 {recall:.4f}, splits {stats['splits']}"
            )
            if np.isin(ids, drop).any():
                raise AssertionError("a deleted id was returned by search")
        start = time.perf_counter()
        await index.checkpoint()
        result.checkpoint_s = time.perf_counter() - start
        result.final_stats = index.stats()
    finally:
        await index.aclose()
    index = await SpannIndex.open(directory)
    try:
        ids, _ = await index.search(ds.queries, k=10)
        result.recall_after_reopen = recall_at(ids, _live_truth(ds, np.flatnonzero(live), 10))
    finally:
        await index.aclose()
    return result


def update_phase(
    runner: asyncio.Runner,
    ds: Dataset,
    cache_dir: Path,
    steps: int,
    overrides: dict[str, Any] | None = None,
) -> UpdateResult:
    rng = np.random.default_rng(7)
    order = rng.permutation(len(ds.base))
    cut = len(ds.base) - len(ds.base) // 10
    built, held = np.sort(order[:cut]), order[cut:]
    doomed = rng.choice(built, size=len(held), replace=False)
    source, _ = cached_build(runner, cache_dir, f"{ds.name}-90pct", ds, built, overrides=overrides)
    work = cache_dir / "update-work"
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(source, work)
    try:
        return runner.run(_phase(work, ds, built, held, doomed, steps))
    finally:
        shutil.rmtree(work, ignore_errors=True)
