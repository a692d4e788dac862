"""Cross-check of ``benchmarks.kvstore.belady`` against an exhaustive search on tiny traces.

    .venv/bin/python -m benchmarks.kvstore.crosscheck_belady [--traces 300]

The search tries every cache a demand cache could hold: after each access, any subset of (the
cache before it + the block accessed) of at most ``capacity`` blocks (so admission, bypass and
voluntary eviction are all allowed). Its best hit count is the true optimum, which MIN must
equal. Traces are random prefix forests (like Mooncake's) and random plain sequences (chains
of one block each). Prints one line per mismatch and a JSON summary last; exits 1 on any.

Thread-safety: pure functions; run as a script.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Sequence
from functools import cache
from itertools import combinations

from benchmarks.kvstore.belady import belady

__all__ = ["optimum_block_hits", "random_flat_trace", "random_forest_trace"]


def optimum_block_hits(requests: Sequence[Sequence[int]], capacity_blocks: int) -> int:
    """The most per-block hits any cache of ``capacity_blocks`` filled from accesses gets."""
    sequence = tuple(block for chain in requests for block in chain)

    @cache
    def best(position: int, cached: frozenset[int]) -> int:
        if position == len(sequence):
            return 0
        block = sequence[position]
        gain = int(block in cached)
        pool = sorted(cached | {block})
        results = [
            best(position + 1, frozenset(kept))
            for size in range(min(capacity_blocks, len(pool)) + 1)
            for kept in combinations(pool, size)
        ]
        return gain + max(results)

    return best(0, frozenset())


def random_forest_trace(rng: random.Random, requests: int, roots: int) -> list[list[int]]:
    """Requests that each extend an earlier request's prefix (or start a new root) by 1-2
    blocks: every id keeps one parent, as in a prefix-hash trace."""
    chains: list[list[int]] = []
    next_id = 0
    for _ in range(requests):
        if chains and rng.random() < 0.7:
            base = rng.choice(chains)
            chain = base[: rng.randint(1, len(base))]
        else:
            chain = [rng.randrange(roots)]
        for _ in range(rng.randint(0, 2)):
            next_id += 1
            chain = [*chain, roots + next_id]
        chains.append(chain)
    return chains


def random_flat_trace(rng: random.Random, accesses: int, blocks: int) -> list[list[int]]:
    return [[rng.randrange(blocks)] for _ in range(accesses)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--traces", type=int, default=300)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    checked = mismatches = 0
    for index in range(args.traces):
        if index % 2:
            trace = random_forest_trace(rng, rng.randint(2, 5), roots=2)
        else:
            trace = random_flat_trace(rng, rng.randint(3, 10), blocks=rng.randint(2, 5))
        if sum(map(len, trace)) > 12:
            continue
        for capacity in range(0, 4):
            expected = optimum_block_hits(trace, capacity)
            got = belady(trace, capacity).block_hits
            checked += 1
            if got != expected:
                mismatches += 1
                print(f"MISMATCH capacity={capacity} belady={got} optimum={expected} {trace}")
    print(json.dumps({"checked": checked, "mismatches": mismatches}))
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
