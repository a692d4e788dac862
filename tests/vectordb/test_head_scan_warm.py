"""A collection whose index is within half of the bfloat16 head scan's threshold warms the
scan's product shapes when it opens (head_scan.warm_up); a smaller one does not."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

import vectordb.navigator as navigator_module
from vectordb import head_scan
from vectordb.collections import Collection, CollectionConfig

DIM = 8


@pytest.mark.parametrize("reach", [2, 3])
def test_opening_warms_the_head_scan_only_within_reach(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reach: int
) -> None:
    warmed: list[int] = []
    monkeypatch.setattr(head_scan, "bfloat16_is_native", lambda: True)
    monkeypatch.setattr(head_scan, "warm_up", lambda dim=None: warmed.append(dim))

    async def main() -> int:
        config = CollectionConfig(dim=DIM, distance="Euclid")
        collection = await Collection.create("c", str(tmp_path), config)
        vectors = np.random.default_rng(0).normal(size=(300, DIM)).astype(np.float32)
        await collection.upsert(list(range(300)), vectors)
        heads = collection.index.navigator.n_heads
        await collection.aclose()
        # the threshold at ``reach`` times the heads' cells: 2 is within reach, 3 is not
        monkeypatch.setattr(navigator_module, "BFLOAT16_FROM_CELLS", reach * heads * DIM)
        again = await Collection.open("c", str(tmp_path))
        await again.aclose()
        return heads

    assert asyncio.run(main()) > 0
    assert [dim for dim in warmed if dim is not None] == ([DIM] if reach == 2 else [])
