"""NvmeTier batches and layout: get_many in one submission, group commit (shared fdatasyncs and
catalog commits, still durable at the acknowledgement, through power cuts), bare 4 KiB records
(4 KiB on disk, damage still detected), and a tier written by the format-1 writer."""

from __future__ import annotations

import asyncio
import os
import random
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.tiers.nvme.test_nvme import assert_space_consistent, lease
from tiers.io.env import Env
from tiers.io.errors import CorruptionError, EngineClosedError
from tiers.io.threaded import ThreadEngine
from tiers.nvme.marker import parse_marker
from tiers.nvme.nvme_tier import NvmeTier
from tiers.testing.faulty_engine import PowerCutAt
from tiers.testing.tier_contract import as_bytes

FORMAT1_TIER = Path(__file__).parent / "format1_tier"  # written by the writer of 90676b9


def _data(size: int, seed: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()


class _CountingEnv(Env):
    def __init__(self) -> None:
        self.fdatasyncs = 0

    def fdatasync(self, fd: int) -> None:
        self.fdatasyncs += 1
        super().fdatasync(fd)


def test_get_many_reads_every_record_in_one_submission(tmp_path: Path) -> None:
    values = {f"k{i}": _data(4096 * (1 + i % 3) + (i % 2) * 100, i) for i in range(40)}

    async def main() -> None:
        engine = ThreadEngine(8)
        tier = await NvmeTier.open(
            "n", 4 << 20, tmp_path, runtime=lease(engine), extent_file_bytes=64 * 1024, create=True
        )
        await tier.put_many(values)
        assert tier.stats()["extent_files"] > 1  # the records lie in several files
        keys = [*values, "absent"]
        before = engine.counters["batches"]
        got = await tier.get_many(keys)
        assert engine.counters["batches"] - before == 1
        assert got[-1] is None
        assert [as_bytes(v) for v in got[:-1]] == list(values.values())
        stats = tier.stats()
        assert (stats["gets"], stats["hits"], stats["misses"]) == (41, 40, 1)
        await tier.aclose()
        await engine.aclose()

    asyncio.run(main())


def test_concurrent_puts_share_fdatasyncs_and_commits(tmp_path: Path) -> None:
    n = 64

    async def main() -> None:
        env = _CountingEnv()
        engine = ThreadEngine(8, env=env)
        tier = await NvmeTier.open("n", 8 << 20, tmp_path, runtime=lease(engine), create=True)
        await tier.put("warm", _data(4096, 0))  # the first extent file's growth is done
        syncs, commits = env.fdatasyncs, tier.stats()["catalog_commits"]
        await asyncio.gather(*(tier.put(f"k{i}", _data(4096, i)) for i in range(n)))
        stats = tier.stats()
        assert env.fdatasyncs - syncs <= n // 4, env.fdatasyncs - syncs
        assert stats["catalog_commits"] - commits <= n // 4
        syncs, commits = env.fdatasyncs, stats["catalog_commits"]
        await tier.put_many({f"m{i}": _data(8192, i) for i in range(n)})
        assert env.fdatasyncs - syncs == 1 and tier.stats()["catalog_commits"] - commits == 1
        await tier.aclose()
        await engine.aclose()
        tier = await NvmeTier.open("n", 8 << 20, tmp_path, create=True)
        assert len(list(tier.keys())) == 2 * n + 1
        for i in range(n):
            assert as_bytes(await tier.get(f"k{i}")) == _data(4096, i)
            assert as_bytes(await tier.get(f"m{i}")) == _data(8192, i)
        await tier.aclose()

    asyncio.run(main())


async def _put_many_until_cut(directory: Path, seed: int, cut_at: int) -> tuple[dict, int]:
    engine = PowerCutAt(ThreadEngine(4), cut_at, seed=seed)
    acked: dict[str, bytes] = {}
    try:
        tier = await NvmeTier.open(
            "n", 512 * 1024, directory, runtime=lease(engine), extent_file_bytes=64 * 1024,
            create=True,
        )  # fmt: skip
    except EngineClosedError:
        return acked, engine.batches
    rng = random.Random(seed)

    async def writer(lane: int) -> None:
        for step in range(6):
            batch = {
                f"k{rng.randrange(12)}": _data(rng.choice([0, 4096, 5000, 12288]), 97 * step + lane)
                for _ in range(rng.randrange(1, 5))
            }
            try:
                if lane % 2:
                    await tier.put_many(batch)
                else:
                    await asyncio.gather(*(tier.put(k, v) for k, v in batch.items()))
            except EngineClosedError:
                return
            acked.update(batch)

    await asyncio.gather(*(writer(lane) for lane in range(3)))
    await tier.aclose()
    await engine.aclose()
    return acked, engine.batches


@pytest.mark.parametrize("seed", [1, 2])
def test_power_cuts_during_group_commits_lose_no_acknowledged_put(
    tmp_path: Path, seed: int
) -> None:
    """Writers race on shared keys, so an acknowledged value may be overwritten by a later put
    that was in flight at the cut: each key must hold its last acknowledged value or a value
    some put of it was writing."""

    async def main() -> None:
        _, total = await _put_many_until_cut(tmp_path / "dry", seed, 10**9)
        points = sorted({1, 3, total, *random.Random(seed).sample(range(2, total), 8)})
        for cut_at in points:
            directory = tmp_path / f"cut{cut_at}"
            acked, _ = await _put_many_until_cut(directory, seed, cut_at)
            tier = await NvmeTier.open("n", 512 * 1024, directory, create=True)
            try:
                assert set(acked) <= set(tier.keys())
                for key in acked:
                    got = as_bytes(await tier.get(key))  # every checksum verified
                    assert got == acked[key] or got in _all_values(seed), key
                assert_space_consistent(tier)
            finally:
                await tier.aclose()

    asyncio.run(main())


def _all_values(seed: int) -> set[bytes]:
    return {_data(size, 97 * step + lane) for size in (0, 4096, 5000, 12288)
            for step in range(6) for lane in range(3)}  # fmt: skip


def test_a_4k_object_takes_4k_and_damage_to_it_is_detected(tmp_path: Path) -> None:
    async def main() -> None:
        tier = await NvmeTier.open("n", 1 << 20, tmp_path, create=True)
        await tier.put_many({"a": _data(4096, 1), "b": _data(4096, 2), "c": _data(3000, 3)})
        stats = tier.stats()
        on_disk = stats["extent_file_bytes"] - stats["extent_free_bytes"]
        assert on_disk == 3 * 4096  # bare pages, and 3000 B + header in one page
        located = tier.locate("a")
        assert located is not None
        path, offset = located
        fd = os.open(path, os.O_RDWR)
        try:
            byte = os.pread(fd, 1, offset + 4000)
            os.pwrite(fd, bytes([byte[0] ^ 0x08]), offset + 4000)
            os.fsync(fd)
        finally:
            os.close(fd)
        with pytest.raises(CorruptionError, match="checksum") as info:
            await tier.get("a")
        assert (info.value.path, info.value.offset_bytes) == (path, offset)
        with pytest.raises(CorruptionError):
            await tier.get_many(["b", "a"], into=[np.zeros(4096, np.uint8)] * 2)
        assert as_bytes(await tier.get("b")) == _data(4096, 2)
        await tier.aclose()

    asyncio.run(main())


def test_a_tier_written_by_the_format_1_writer_opens_and_reads(tmp_path: Path) -> None:
    directory = tmp_path / "old"
    shutil.copytree(FORMAT1_TIER, directory)
    old = {"page": 4096, "two-pages": 8192, "odd": 5000, "empty": 0}
    expected = {k: _data(n, i) for i, (k, n) in enumerate(old.items())}

    async def main() -> None:
        tier = await NvmeTier.open("n", 1 << 20, directory)
        assert sorted(tier.keys()) == sorted(old)
        got = await tier.get_many(list(old))
        assert [as_bytes(v) for v in got] == list(expected.values())
        assert_space_consistent(tier)
        expected.update({"new-page": _data(4096, 50), "page": _data(8192, 51)})
        await tier.put_many({"new-page": expected["new-page"], "page": expected["page"]})
        await tier.aclose()
        marker = (directory / "FORMAT").read_bytes()
        assert 1 < parse_marker(marker, "FORMAT") <= 7  # after the 6 old puts and deletes
        tier = await NvmeTier.open("n", 1 << 20, directory)
        for key, value in expected.items():
            assert as_bytes(await tier.get(key)) == value
        assert_space_consistent(tier)
        await tier.aclose()

    asyncio.run(main())


def test_a_damaged_format_marker_is_refused(tmp_path: Path) -> None:
    async def main() -> None:
        tier = await NvmeTier.open("n", 1 << 20, tmp_path, create=True)
        await tier.aclose()
        raw = bytearray((tmp_path / "FORMAT").read_bytes())
        raw[9] ^= 1
        (tmp_path / "FORMAT").write_bytes(bytes(raw))
        with pytest.raises(CorruptionError, match="marker"):
            await NvmeTier.open("n", 1 << 20, tmp_path)

    asyncio.run(main())
