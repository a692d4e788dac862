"""The hit-rate part of the KV-cache benchmark: every policy at every capacity, with Belady's
optimum and a plain LRU beside them.

For each capacity (a fraction of the trace's unique blocks): MIN (benchmarks.kvstore.belady),
the textbook LRU and the LRU with the store's write rules (benchmarks.kvstore.lru_model: the
store's "lru" replay must equal the latter), and a replay through the real
KVBlockStore for each policy (benchmarks.kvstore.replay). Replays run on a DRAM-only store,
except at the ``disk_fraction`` capacity where they run on the NVMe tier (the restart-safe
path a server uses) and are split in halves, so the restart check can compare its second
half with theirs. With ``check_dram`` the disk cells are replayed on DRAM too, to show that
the tier does not change a policy's decisions (the scaling argument of replay.py).

Thread-safety: one asyncio loop; run as part of the benchmark.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.kvstore.belady import belady
from benchmarks.kvstore.lru_model import (
    lru_oracle_admission_hits,
    lru_prefix_hits,
    lru_store_model_hits,
)
from benchmarks.kvstore.replay import (
    REPLAY_FP,
    ReplayCounts,
    disk_bytes_for,
    open_replay_store,
    replay_requests,
)

__all__ = ["POLICIES", "capacity_cell", "replay_policy"]

POLICIES = ("lru", "cost", "prefix", "prefix-admit")


async def replay_policy(
    work_dir: Path,
    requests: Sequence[Sequence[int]],
    capacity_blocks: int,
    policy: str,
    tier: str,
) -> dict[str, Any]:
    """One replay through the store; on disk also the second half's hit rate on its own."""
    directory = work_dir / f"replay-{policy}-{capacity_blocks}"
    shutil.rmtree(directory, ignore_errors=True)
    store = await open_replay_store(directory, capacity_blocks, policy, tier)
    disk = directory if tier == "disk" else None
    cap_bytes = disk_bytes_for(capacity_blocks)
    data_bytes = capacity_blocks * REPLAY_FP.block_bytes
    counts = ReplayCounts()
    half = len(requests) // 2
    try:
        await replay_requests(
            store,
            requests[:half],
            counts,
            directory=disk,
            disk_cap_bytes=cap_bytes,
            data_cap_bytes=data_bytes,
        )
        first_hits, first_accesses = counts.hits, counts.accesses
        await replay_requests(
            store,
            requests[half:],
            counts,
            directory=disk,
            disk_cap_bytes=cap_bytes,
            data_cap_bytes=data_bytes,
        )
        stats = store.stats()
    finally:
        await store.aclose()
        shutil.rmtree(directory, ignore_errors=True)
    result = counts.as_dict()
    second = counts.accesses - first_accesses
    result["second_half_hit_rate"] = round((counts.hits - first_hits) / second, 5) if second else 0
    result["tier"] = tier
    result["evicted_blocks"] = stats["evicted_blocks"]
    result["rejected_blocks"] = stats["rejected_blocks"]
    result["declined_blocks"] = stats["declined_blocks"]
    if tier != "disk":
        result.pop("disk_overrun_bytes")
        result.pop("max_directory_bytes")
        result.pop("max_extent_overrun_bytes")
    return result


async def capacity_cell(
    work_dir: Path,
    requests: Sequence[Sequence[int]],
    fraction: float,
    unique_blocks: int,
    tier: str,
    check_dram: bool,
) -> dict[str, Any]:
    """Belady, the LRU model and every policy at ``fraction`` of the unique blocks."""
    capacity_blocks = max(1, round(unique_blocks * fraction))
    optimum = belady(requests, capacity_blocks)
    lru_hits = lru_prefix_hits(requests, capacity_blocks)
    cell: dict[str, Any] = {
        "fraction": fraction,
        "capacity_blocks": capacity_blocks,
        "capacity_bytes_scaled": capacity_blocks * REPLAY_FP.block_bytes,
        "accesses": optimum.accesses,
        "belady_block_hit_rate": round(optimum.block_hit_rate, 5),
        "belady_prefix_hit_rate": round(optimum.prefix_hit_rate, 5),
        "lru_model_hit_rate": round(lru_hits / optimum.accesses, 5),
        "lru_store_model_hit_rate": round(
            lru_store_model_hits(requests, capacity_blocks) / optimum.accesses, 5
        ),
        "lru_oracle_admission_hit_rate": round(
            lru_oracle_admission_hits(requests, capacity_blocks) / optimum.accesses, 5
        ),
        "policies": {},
    }
    for policy in POLICIES:
        print(f"  replay {policy} at {fraction:.0%} on {tier}", file=sys.stderr, flush=True)
        result = await replay_policy(work_dir, requests, capacity_blocks, policy, tier)
        if check_dram and tier != "dram":
            twin = await replay_policy(work_dir, requests, capacity_blocks, policy, "dram")
            result["dram_replay_same_hits"] = twin["hits"] == result["hits"]
        cell["policies"][policy] = result
    rates = {policy: r["hit_rate"] for policy, r in cell["policies"].items()}
    best = max(rates, key=lambda policy: rates[policy])
    cell["best_policy"] = best
    cell["best_vs_belady"] = _ratio(rates[best], optimum.block_hit_rate)
    cell["best_vs_lru_model"] = _ratio(rates[best], cell["lru_model_hit_rate"])
    cell["best_vs_store_lru"] = _ratio(rates[best], rates["lru"])
    cell["prefix_vs_lru_model"] = _ratio(rates["prefix"], cell["lru_model_hit_rate"])
    cell["lru_oracle_admission_vs_belady"] = _ratio(
        cell["lru_oracle_admission_hit_rate"], optimum.block_hit_rate
    )
    return cell


def _ratio(numerator: float, denominator: float) -> float | None:
    return round(numerator / denominator, 4) if denominator else None
