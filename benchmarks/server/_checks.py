"""What the plain cross-check scripts share, and nothing of the load benchmark's harness:
the data (debian-minilm, or 20k x 128 random unit vectors with exact top-10 without ../shared)
and a timed loop of one-vector searches from N threads (QPS, p50 / p99, recall@10).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

MINILM = Path(__file__).resolve().parents[3] / "shared" / "data" / "debian-minilm"
SECONDS = 10.0


def data() -> tuple[np.ndarray, np.ndarray, np.ndarray, str]:
    if (MINILM / "embeddings.npy").exists():
        base = np.load(MINILM / "embeddings.npy")
        return base, np.load(MINILM / "queries.npy"), np.load(MINILM / "gt_ids.npy"), "minilm"
    rng = np.random.default_rng(0)
    rows = rng.standard_normal((20_500, 128)).astype(np.float32)
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    base, queries = rows[:20_000], rows[20_000:]
    return base, queries, np.argsort(-(queries @ base.T), axis=1)[:, :10], "random-20k"


def run(
    search: Callable[[list[float]], list[int]],
    queries: list[list[float]],
    gt: np.ndarray,
    threads: int,
) -> dict[str, float]:
    lat: list[float] = []
    hits: list[int] = []  # list.append is atomic across threads; += on an int is not
    stop = time.perf_counter() + SECONDS

    def caller(slot: int) -> None:
        i = slot
        while time.perf_counter() < stop:
            began = time.perf_counter()
            ids = search(queries[i % len(queries)])
            lat.append(time.perf_counter() - began)
            hits.append(len(set(ids) & set(gt[i % len(queries), :10].tolist())))
            i += threads

    began = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(caller, range(threads)))
    wall = time.perf_counter() - began
    ms = np.asarray(lat) * 1e3
    return {
        "threads": threads,
        "qps": len(lat) / wall,
        "p50_ms": float(np.percentile(ms, 50)),
        "p99_ms": float(np.percentile(ms, 99)),
        "recall_at_10": sum(hits) / (10 * len(hits)),
    }
