"""Shared pieces of the vectordb benchmark: one measured point, recall, cold cache, timing.

A ``Point`` is one setting of one system's recall knob on one dataset: recall@10 and the
single-batch wall time of every round, and the memory/I-O figures. QPS is queries / wall time of
one call that hands over the whole query batch (as big-ann-benchmarks does); the table shows the
median over rounds with the min-max spread.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import statistics
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np

OUT_SUBDIR = "vectordb"  # under benchmarks/out/
RECALL_TARGET = 0.90
PAGE_BYTES = 4096


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclass
class Point:
    """One knob setting of one system on one dataset."""

    system: str
    knob: str
    value: float
    resident_bytes: float  # in RAM while searching; nan where unknown
    queries: int
    io: dict[str, float] = field(default_factory=dict)  # bytes/pages per query, batch and alone
    wall_s: list[float] = field(default_factory=list)
    recalls: list[float] = field(default_factory=list)

    def add_round(self, wall_s: float, recall: float, io: dict[str, float]) -> None:
        self.wall_s.append(wall_s)
        self.recalls.append(recall)
        self.io = io  # counters are deterministic per setting; the last round's is kept

    @property
    def recall(self) -> float:
        return statistics.median(self.recalls) if self.recalls else float("nan")

    @property
    def qps(self) -> float:
        return self.queries / statistics.median(self.wall_s) if self.wall_s else float("nan")

    @property
    def qps_range(self) -> tuple[float, float]:
        if not self.wall_s:
            return float("nan"), float("nan")
        return self.queries / max(self.wall_s), self.queries / min(self.wall_s)


def recall_at(found: np.ndarray, gt: np.ndarray, k: int = 10) -> float:
    """Mean over queries of |found[:k] ∩ gt[:k]| / k (padding -1 never matches a real id)."""
    hits = 0
    for row, truth in zip(found[:, :k], gt[:, :k], strict=True):
        hits += len(np.intersect1d(row[row >= 0], truth))
    return hits / (k * len(gt))


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Send file descriptor 1 to stderr for a while: faiss and DiskANN print progress from C++
    with printf, which would land between the markdown tables on stdout."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def drop_page_cache(paths: Iterable[str]) -> None:
    """posix_fadvise(DONTNEED) every file: the next read of it comes from the device.

    Pages that a process still has mapped are not dropped by the kernel, so callers that
    mmap a file (faiss OnDiskInvertedLists) must unmap it first (close the index)."""
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            continue
        try:
            os.fsync(fd)  # dirty pages are not dropped; write them back first
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def timed(fn, *args, **kwargs):  # type: ignore[no-untyped-def]
    """(result, wall seconds) of one call."""
    start = time.perf_counter()
    result = fn(*args, **kwargs)
    return result, time.perf_counter() - start


def qps_at_recall(points: list[Point], target: float = RECALL_TARGET) -> float | None:
    """QPS where the recall-vs-QPS curve crosses ``target``; None when no point reaches it.

    Points are taken in knob order; between the first pair that straddles the target, log(QPS)
    is interpolated linearly in recall (QPS falls roughly exponentially as a knob grows). A
    faster measured point at or above the target (noise can make curves non-monotonic) wins.
    """
    ordered = sorted(points, key=lambda p: p.value)
    reaching = [p.qps for p in ordered if p.recall >= target]
    if not reaching:
        return None
    best = max(reaching)
    for low, high in itertools.pairwise(ordered):
        if low.recall < target <= high.recall:
            share = (target - low.recall) / (high.recall - low.recall)
            log_qps = np.log(low.qps) + share * (np.log(high.qps) - np.log(low.qps))
            return max(best, float(np.exp(log_qps)))
    return best


def fmt_bytes(value: float) -> str:
    if value != value:  # nan
        return "n/a"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if value >= size:
            return f"{value / size:.1f} {unit}"
    return f"{value:.0f} B"
