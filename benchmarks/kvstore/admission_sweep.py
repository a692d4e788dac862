"""How the ``prefix-admit`` policy's admission parameters were picked, without tuning to the
trace it is scored on: replays of the Mooncake trace's first half through the real
KVBlockStore (DRAM tier, the replay of benchmarks.kvstore.replay) for each ``ratio`` (a class
is declined below that fraction of the mean reuse rate) and window size (a multiple of the
capacity in blocks), at 5%, 10% and 25% of that half's unique blocks; then the pick (the best
mean of best/Belady over the three capacities on the first half) and the defaults on the
second half, which no choice looked at.

    flock /tmp/tierkit-bench.lock .venv/bin/python -m benchmarks.kvstore.admission_sweep

Prints a table and, last, one JSON line. Thread-safety: one asyncio loop; a script.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.kvstore.belady import belady
from benchmarks.kvstore.replay import ReplayCounts, open_replay_store, replay_requests
from benchmarks.kvstore.trace import load_trace
from kvstore.admission import AdmissionFilter

RATIOS = (0.0, 0.1, 0.25, 0.5)  # 0.0: nothing is ever declined (the plain prefix policy)
WINDOWS = (0.5, 1.0, 2.0)  # learning window, in multiples of the capacity in blocks
FRACTIONS = (0.05, 0.10, 0.25)


async def replay_admit(
    requests: Sequence[Sequence[int]], capacity_blocks: int, ratio: float, window: float
) -> int:
    """Prefix hits of the real store with the ``prefix-admit`` policy at these parameters."""
    with tempfile.TemporaryDirectory(prefix="kv-sweep-") as directory:
        store = await open_replay_store(Path(directory), capacity_blocks, "prefix-admit", "dram")
        try:
            store._policy.admission = AdmissionFilter(
                max(1, round(window * capacity_blocks)), ratio=ratio
            )
            counts = await replay_requests(store, requests, ReplayCounts())
        finally:
            await store.aclose()
    return counts.hits


async def sweep(requests: Sequence[Sequence[int]]) -> dict[str, Any]:
    unique = len({block for chain in requests for block in chain})
    caps = {f: max(1, round(unique * f)) for f in FRACTIONS}
    bounds = {f: belady(requests, cap).block_hits for f, cap in caps.items()}
    table: dict[str, dict[str, float]] = {}
    for ratio in RATIOS:
        for window in WINDOWS if ratio else (1.0,):
            name = f"ratio={ratio} window={window}"
            row = {}
            for f, cap in caps.items():
                hits = await replay_admit(requests, cap, ratio, window)
                row[f"{f:.0%}"] = round(hits / bounds[f], 4) if bounds[f] else 0.0
            table[name] = row
            print(f"| {name} | " + " | ".join(f"{v:.4f}" for v in row.values()) + " |", flush=True)
    return table


def main() -> int:
    requests = load_trace().requests
    half = len(requests) // 2
    print("first half: best/Belady at 5%, 10%, 25%", flush=True)
    first = asyncio.run(sweep(requests[:half]))
    pick = max(first, key=lambda name: sum(first[name].values()))
    print(f"pick on the first half: {pick}", flush=True)
    print("second half (not looked at by the pick):", flush=True)
    second = asyncio.run(sweep(requests[half:]))
    print(json.dumps({"first_half": first, "second_half": second, "pick": pick}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
