"""An NVMe tier's files never take more disk than its capacity (for page-sized objects)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np

from tiers.nvme.nvme_tier import NvmeTier


def _disk_bytes(directory: Path) -> int:
    """Bytes the extent files take on disk (allocated blocks, preallocation included)."""
    return sum(p.stat().st_blocks * 512 for p in directory.glob("extents-*.dat"))


def test_growth_stops_at_the_capacity(tmp_path: Path) -> None:
    capacity = 40 * 4096  # far below one 64 MiB growth step

    async def body() -> None:
        tier = await NvmeTier.open(
            "nvme", capacity, tmp_path, create=True, extent_file_bytes=12 * 4096
        )
        page = np.ones(4096, np.uint8)
        for i in range(40):
            await tier.put(f"k{i}", page)
            assert _disk_bytes(tmp_path) <= capacity
        for i in range(40, 200, 20):  # churn: free 20 pages at either end, put 20 new ones
            await tier.delete_many([f"k{j}" for j in range(i - 40, i - 20)])
            await tier.put_many({f"k{j}": page for j in range(i, i + 20)})
            assert _disk_bytes(tmp_path) <= capacity
        assert tier.used_bytes <= capacity
        await tier.aclose()

    asyncio.run(body())
