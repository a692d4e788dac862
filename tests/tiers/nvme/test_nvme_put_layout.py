"""Where a put_many's records go: end to end in one hole, written as one request, their old
extents freed as merged runs; record by record into the holes there are when no hole holds the
whole batch (the files do not grow past them). Every object reads back, also after a reopen."""

from __future__ import annotations

import asyncio
import itertools
import zlib
from pathlib import Path

import numpy as np

from tests.tiers.nvme.test_nvme import assert_space_consistent, lease
from tiers.io.threaded import ThreadEngine
from tiers.nvme.nvme_tier import NvmeTier
from tiers.testing.tier_contract import as_bytes


def _data(size: int, seed: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()


def test_a_batch_lies_end_to_end_and_goes_out_as_one_write(tmp_path: Path) -> None:
    sizes = [4096, 8192, 4096, 12288] * 8  # bare records of mixed sizes

    async def main() -> None:
        engine = ThreadEngine(4)
        tier = await NvmeTier.open("n", 8 << 20, tmp_path, runtime=lease(engine), create=True)
        await tier.put("warm", _data(4096, 0))  # the first file has grown: a large free tail
        for round_index in range(3):  # the later rounds overwrite: old extents freed merged
            values = {f"k{i}": _data(size, 100 * round_index + i) for i, size in enumerate(sizes)}
            before = engine.counters["requests"]
            await tier.put_many(values)
            assert engine.counters["requests"] - before <= 2  # one write (and one fdatasync)
            entries = tier._open_catalog().entries
            offsets = sorted((entries[key].offset_bytes, entries[key].size_bytes) for key in values)
            for (offset, size), (following, _) in itertools.pairwise(offsets):
                assert offset + size == following
            for key, value in values.items():
                assert entries[key].crc32 == zlib.crc32(value)
            assert_space_consistent(tier)
            got = await tier.get_many(list(values))
            assert [as_bytes(v) for v in got] == list(values.values())
        await tier.aclose()
        await engine.aclose()
        tier = await NvmeTier.open("n", 8 << 20, tmp_path)
        assert [as_bytes(await tier.get(key)) for key in values] == list(values.values())
        await tier.aclose()

    asyncio.run(main())


def test_without_a_hole_for_the_batch_records_fill_the_holes_one_by_one(tmp_path: Path) -> None:
    async def main() -> None:
        engine = ThreadEngine(4)
        tier = await NvmeTier.open(
            "n", 8 << 20, tmp_path, runtime=lease(engine), extent_file_bytes=64 * 1024,
            create=True,
        )  # fmt: skip
        await tier.put_many({f"a{i}": _data(4096, i) for i in range(16)})  # the file is full
        assert tier.stats()["extent_files"] == 1
        for i in range(0, 16, 2):
            assert await tier.delete(f"a{i}")  # eight holes of 4 KiB, none adjacent
        fresh = {f"b{i}": _data(4096, 50 + i) for i in range(8)}
        await tier.put_many(fresh)
        stats = tier.stats()
        assert stats["extent_files"] == 1 and stats["extent_free_bytes"] == 0
        assert_space_consistent(tier)
        got = await tier.get_many([*fresh, *(f"a{i}" for i in range(1, 16, 2))])
        expected = [*fresh.values(), *(_data(4096, i) for i in range(1, 16, 2))]
        assert [as_bytes(v) for v in got] == expected
        await tier.aclose()
        await engine.aclose()

    asyncio.run(main())
