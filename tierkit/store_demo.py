"""The store half of ``tierkit demo``: a TieredStore over DRAM, CXL and NVMe under a Zipf load.

It puts objects worth 4x the DRAM tier, reads them with Zipf-skewed popularity (hot objects are
promoted, cold ones demoted), checks every byte it reads, and prints the per-tier counters.
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np

from tierkit.tables import table
from tiers.store import open_store

__all__ = ["run_store_demo"]

KIB = 1 << 10
MIB = 1 << 20
HEADERS = ("tier", "objects", "hits", "misses", "evictions", "promotions", "MiB in", "MiB out",
           "p50 get", "p99 get")  # fmt: skip


def _value(index: int, size: int) -> np.ndarray:
    return np.random.default_rng(index).integers(0, 256, size, dtype=np.uint8)


async def run_store_demo(
    directory: str, step: str, objects: int = 256, object_bytes: int = 64 * KIB, gets: int = 4000
) -> dict[str, Any]:
    """Prints what it does as it starts (prefixed ``step``), then a table per tier; returns the
    summary's figures."""
    dram_bytes = objects * object_bytes // 4
    print(
        f"{step} tiered store: {objects} objects of {object_bytes // KIB} KiB over DRAM "
        f"{dram_bytes // MIB} MiB + CXL + NVMe, then {gets:,} Zipf-skewed gets..."
    )
    config = {
        "policy": "cost",
        "tiers": [
            {"kind": "dram", "capacity": dram_bytes},
            {"kind": "cxl", "capacity": dram_bytes},
            {
                "kind": "nvme",
                "capacity": 2 * objects * object_bytes,
                "path": os.path.join(directory, "store"),
                "create": True,
            },
        ],
    }
    store = await open_store(config)
    try:
        for i in range(objects):
            await store.put(f"obj/{i}", _value(i, object_bytes))
        ranks = np.random.default_rng(7).zipf(1.1, gets) % objects
        into = np.empty(object_bytes, np.uint8)
        start = time.perf_counter()
        for rank in ranks.tolist():
            await store.get(f"obj/{rank}", into=into)
            if rank < 8 and not np.array_equal(into, _value(rank, object_bytes)):
                raise RuntimeError(f"obj/{rank} came back wrong")
        elapsed = time.perf_counter() - start
        await store.drain()
        stats = store.stats()
    finally:
        await store.aclose()
    rate = f"{gets:,} gets at {gets / elapsed:,.0f} gets/s"
    title = f"\ntiered store, {stats['policy']} policy: {rate}"
    print(table(title, HEADERS, [_row(tier) for tier in stats["tiers"]]))
    print("  hot objects move up, cold ones down; the 8 hottest checked byte for byte\n")
    hits = [t["hits"] for t in stats["tiers"]]
    return {
        "store_gets_per_s": round(gets / elapsed),
        "store_hit_rate_dram": round(hits[0] / gets, 3),
    }


def _row(tier: dict[str, Any]) -> tuple[object, ...]:
    name = tier["name"] + (" (emulated)" if tier.get("emulated") else "")
    counts = (tier[key] for key in ("objects", "hits", "misses", "evictions", "promotions"))
    moved = (f"{tier[key] / MIB:,.1f}" for key in ("bytes_in", "bytes_out"))
    return (name, *counts, *moved, _us(tier["p50_get_s"]), _us(tier["p99_get_s"]))


def _us(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e6:,.0f} us"
