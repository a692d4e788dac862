"""LoaderStats: throughput and stall figures, counted where the training loop sees them.

A *stall* is a ``next()`` that had to wait for its batch (longer than ``stall_threshold_s``):
the loader, not the model, was the bottleneck then. ``wait_s`` sums every wait.

Concurrency: updated and read by the thread iterating the loader only.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

__all__ = ["LoaderStats"]


@dataclass
class LoaderStats:
    """Counters since the loader was created (or since ``reset``)."""

    stall_threshold_s: float = 0.001
    batches: int = 0
    samples: int = 0
    skipped: int = 0
    bytes_read: int = 0
    wait_s: float = 0.0
    stalls: int = 0
    max_wait_s: float = 0.0
    first_batch_s: float | None = None
    started_s: float = field(default_factory=time.perf_counter)

    def record(self, waited_s: float, samples: int, skipped: int, bytes_read: int) -> None:
        """One batch handed to the training loop after waiting ``waited_s``."""
        self.batches += 1
        self.samples += samples - skipped
        self.skipped += skipped
        self.bytes_read += bytes_read
        self.wait_s += waited_s
        self.max_wait_s = max(self.max_wait_s, waited_s)
        if waited_s > self.stall_threshold_s:
            self.stalls += 1
        if self.first_batch_s is None:
            self.first_batch_s = time.perf_counter() - self.started_s

    def reset(self) -> None:
        """Start counting afresh (e.g. after a warm-up)."""
        threshold = self.stall_threshold_s
        self.__init__(stall_threshold_s=threshold)  # type: ignore[misc]

    def as_dict(self) -> dict[str, Any]:
        """Counters plus derived rates (samples/s and MB/s over the time since the start)."""
        elapsed_s = max(time.perf_counter() - self.started_s, 1e-9)
        return {
            "batches": self.batches,
            "samples": self.samples,
            "skipped": self.skipped,
            "bytes_read": self.bytes_read,
            "elapsed_s": elapsed_s,
            "samples_per_s": self.samples / elapsed_s,
            "mb_per_s": self.bytes_read / elapsed_s / 1e6,
            "wait_s": self.wait_s,
            "stalls": self.stalls,
            "max_wait_s": self.max_wait_s,
            "stall_fraction": self.wait_s / elapsed_s,
            "time_to_first_batch_s": self.first_batch_s,
        }
