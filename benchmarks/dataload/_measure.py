"""Timing one loader run from a cold page cache: samples/s, MB/s, CPU per sample, first batch.

A run evicts the data files with ``posix_fadvise(DONTNEED)``, then times from *before* the
loader (or DataLoader iterator) is built to the moment the sample budget is consumed or the time
cap is hit. CPU is ``getrusage`` of this process plus its reaped children (DataLoader workers are
joined before the second reading, so their CPU is included).
"""

from __future__ import annotations

import gc
import os
import resource
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

__all__ = ["Run", "evict", "time_run"]


@dataclass(frozen=True)
class Run:
    """One timed run of one loader on one workload in one round."""

    workload: str
    loader: str
    round_index: int
    samples: int
    bytes: int
    elapsed_s: float
    cpu_s: float
    first_batch_s: float
    load1: float

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.elapsed_s

    @property
    def mb_per_s(self) -> float:
        return self.bytes / self.elapsed_s / 1e6

    @property
    def cpu_us_per_sample(self) -> float:
        return self.cpu_s / max(self.samples, 1) * 1e6

    def as_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "samples_per_s": self.samples_per_s,
            "mb_per_s": self.mb_per_s,
            "cpu_us_per_sample": self.cpu_us_per_sample,
        }


def evict(paths: Iterable[Path]) -> None:
    """Drop ``paths`` from the page cache (per file: polite to other users of the machine)."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def cpu_s_with_children() -> float:
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def time_run(
    workload: str,
    loader: str,
    round_index: int,
    files: list[Path],
    start: Callable[[], tuple[Iterator[Any], Callable[[], None]]],
    batch_samples: Callable[[Any], int],
    sample_bytes: Callable[[Any], int],
    max_samples: int,
    max_time_s: float,
) -> Run:
    """Evict ``files``, then consume batches from ``start()`` (an iterator and its closer)."""
    evict(files)
    gc.collect()
    cpu0, t0 = cpu_s_with_children(), time.perf_counter()
    iterator, close = start()
    samples = size = 0
    first_s = None
    try:
        for batch in iterator:
            if first_s is None:
                first_s = time.perf_counter() - t0
            samples += batch_samples(batch)
            size += sample_bytes(batch)
            del batch
            if samples >= max_samples or time.perf_counter() - t0 > max_time_s:
                break
        elapsed_s = time.perf_counter() - t0
    finally:
        del iterator
        close()
        gc.collect()
    cpu_s = cpu_s_with_children() - cpu0
    if not samples:
        raise RuntimeError(f"{loader} on {workload} produced no samples")
    return Run(
        workload,
        loader,
        round_index,
        samples,
        size,
        elapsed_s,
        cpu_s,
        first_s or elapsed_s,
        os.getloadavg()[0],
    )
