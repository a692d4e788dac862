"""Belady's offline optimum (MIN) for a trace's block accesses at a capacity in blocks.

The access sequence is every request's chain, flattened in order. On each access the block is
(kept or) put in the cache, then, while the cache is over capacity, the block whose next use is
farthest is evicted, the one just accessed included: so a block that is needed later than all
others is simply not kept (bypass). This is the optimum over every cache of that capacity that
fills only from accessed blocks, with or without admission control (Belady 1966; Mattson et
al. 1970), counting a hit per cached block ("per-block" hits).

Why it bounds the store: a server benefits only from the longest cached *prefix* of a request
(``KVBlockStore.lookup``), and a prefix hit is also a per-block hit under the same cache
contents. Any policy's prefix hits are therefore <= its per-block hits <= MIN's. ``prefix_hits``
counts, in MIN's own run, only the leading run of hits of each request: on a prefix-hash trace
(an id's parent is always the same, so a parent is used whenever its child is and before it)
MIN never keeps a child without its parent, and the two counts agree; the benchmark reports
both so the reader can see it.

Thread-safety: pure functions.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["BeladyResult", "belady", "next_use_positions"]


@dataclass(frozen=True)
class BeladyResult:
    capacity_blocks: int
    accesses: int
    block_hits: int  # the bound: hits of every cached block
    prefix_hits: int  # hits in each request's leading run of hits, same run

    @property
    def block_hit_rate(self) -> float:
        return self.block_hits / self.accesses if self.accesses else 0.0

    @property
    def prefix_hit_rate(self) -> float:
        return self.prefix_hits / self.accesses if self.accesses else 0.0


def next_use_positions(sequence: Sequence[int]) -> list[int]:
    """For each position, the position of the next access to the same block; a block never
    used again gets ``len(sequence) + position`` (distinct, farther than any real use)."""
    count = len(sequence)
    following = [0] * count
    seen: dict[int, int] = {}
    for position in range(count - 1, -1, -1):
        block = sequence[position]
        following[position] = seen.get(block, count + position)
        seen[block] = position
    return following


def belady(requests: Sequence[Sequence[int]], capacity_blocks: int) -> BeladyResult:
    """MIN's hits on the flattened ``requests`` with room for ``capacity_blocks`` blocks."""
    if capacity_blocks < 0:
        raise ValueError(f"capacity_blocks must be >= 0, got {capacity_blocks}")
    sequence = [block for chain in requests for block in chain]
    following = next_use_positions(sequence)
    cached: dict[int, int] = {}  # block -> position of its next use
    farthest: list[tuple[int, int]] = []  # (-next use, block), stale entries skipped lazily
    block_hits = prefix_hits = 0
    position = 0
    for chain in requests:
        leading = True
        for block in chain:
            if block in cached:
                block_hits += 1
                prefix_hits += leading
            else:
                leading = False
            upcoming = following[position]
            position += 1
            cached[block] = upcoming
            heapq.heappush(farthest, (-upcoming, block))
            while len(cached) > capacity_blocks:
                negative, victim = heapq.heappop(farthest)
                if cached.get(victim) == -negative:
                    del cached[victim]
    return BeladyResult(capacity_blocks, len(sequence), block_hits, prefix_hits)
