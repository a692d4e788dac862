"""TierCounters: what a TieredStore reports per tier: hits, misses, traffic, latency histogram.

Latency is kept as a histogram of log2 nanoseconds (bucket b holds gets that took
[2^(b-1), 2^b) ns), so recording a hit costs one ``int.bit_length`` and one list increment.

Concurrency: loop thread only.
"""

from __future__ import annotations

from typing import Any

__all__ = ["TierCounters"]


class TierCounters:
    __slots__ = (
        "bytes_in",
        "bytes_out",
        "demotions",
        "evictions",
        "hits",
        "latency_ns_log2",
        "misses",
        "promotions",
    )

    def __init__(self) -> None:
        self.hits = 0  # gets served by this tier
        self.misses = 0  # gets that looked past this tier (served below, or absent)
        self.bytes_in = 0  # bytes moved into this tier by promotion or demotion
        self.bytes_out = 0  # bytes moved out by eviction or demotion
        self.evictions = 0
        self.promotions = 0  # objects promoted into this tier
        self.demotions = 0  # objects demoted out of this tier
        self.latency_ns_log2 = [0] * 48

    def record_hit(self, elapsed_ns: int) -> None:
        self.hits += 1
        bucket = elapsed_ns.bit_length()
        self.latency_ns_log2[bucket if bucket < 47 else 47] += 1  # no min(): ~60 ns a hit

    def latency_quantile_s(self, q: float) -> float | None:
        """Upper bound of the bucket holding quantile ``q`` of hit latency, in seconds."""
        total = sum(self.latency_ns_log2)
        if not total:
            return None
        rank, seen = q * total, 0
        for bucket, count in enumerate(self.latency_ns_log2):
            seen += count
            if seen >= rank:
                return (1 << bucket) / 1e9
        return None

    def as_dict(self) -> dict[str, Any]:
        return {
            "hits": self.hits,
            "misses": self.misses,
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            "evictions": self.evictions,
            "promotions": self.promotions,
            "demotions": self.demotions,
            "p50_get_s": self.latency_quantile_s(0.5),
            "p99_get_s": self.latency_quantile_s(0.99),
        }
