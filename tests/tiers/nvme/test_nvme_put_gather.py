"""Concurrent single puts gathered into groups (tiers.nvme.put_gather): few groups for many
puts, each durable; a group that does not fit answers each put on its own, as puts one at a time
would; a cancelled caller leaves its group alone; a close drains what is queued."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np

from tests.tiers.nvme.test_nvme import assert_space_consistent, lease
from tiers.io.errors import CapacityError
from tiers.io.threaded import ThreadEngine
from tiers.nvme.nvme_tier import NvmeTier
from tiers.testing.tier_contract import as_bytes


def _data(size: int, seed: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()


async def _open(directory: Path, engine: ThreadEngine, capacity_bytes: int = 8 << 20) -> NvmeTier:
    return await NvmeTier.open("n", capacity_bytes, directory, runtime=lease(engine), create=True)


def test_many_concurrent_puts_go_out_in_few_groups_and_all_last(tmp_path: Path) -> None:
    n = 64

    async def main() -> None:
        engine = ThreadEngine(4)
        tier = await _open(tmp_path, engine)
        before = engine.counters["requests"]
        await asyncio.gather(*(tier.put(f"k{i}", _data(4096, i)) for i in range(n)))
        assert tier._put_gather.groups <= 4  # two start alone, the rest wait for one of them
        assert engine.counters["requests"] - before <= 4 * 2 + 4  # a write and fdatasync each
        assert_space_consistent(tier)
        await tier.aclose()
        await engine.aclose()
        tier = await NvmeTier.open("n", 8 << 20, tmp_path)
        got = await tier.get_many([f"k{i}" for i in range(n)])
        assert [as_bytes(v) for v in got] == [_data(4096, i) for i in range(n)]
        await tier.aclose()

    asyncio.run(main())


def test_a_group_that_does_not_fit_answers_each_put_alone(tmp_path: Path) -> None:
    async def main() -> None:
        engine = ThreadEngine(4)
        tier = await _open(tmp_path, engine, capacity_bytes=16 * 4096)
        outcomes = await asyncio.gather(
            *(tier.put(f"k{i:02d}", _data(4096, i)) for i in range(24)), return_exceptions=True
        )
        stored = [f"k{i:02d}" for i, outcome in enumerate(outcomes) if outcome is None]
        failed = [outcome for outcome in outcomes if outcome is not None]
        assert len(stored) == 16  # as 24 puts one at a time: the first 16 fit
        assert stored == [f"k{i:02d}" for i in range(16)]
        assert all(isinstance(error, CapacityError) for error in failed)
        assert sorted(tier.keys()) == stored
        for key in stored:
            assert as_bytes(await tier.get(key)) == _data(4096, int(key[1:]))
        assert_space_consistent(tier)
        await tier.aclose()
        await engine.aclose()

    asyncio.run(main())


def test_a_cancelled_caller_leaves_its_group_and_a_close_drains_the_queue(tmp_path: Path) -> None:
    async def main() -> None:
        engine = ThreadEngine(4)
        tier = await _open(tmp_path, engine)
        puts = [asyncio.ensure_future(tier.put(f"k{i}", _data(8192, i))) for i in range(12)]
        await asyncio.sleep(0)  # every put is in a group or queued
        puts[5].cancel()
        done = await asyncio.gather(*puts, return_exceptions=True)
        assert isinstance(done[5], asyncio.CancelledError)
        assert all(outcome is None for i, outcome in enumerate(done) if i != 5)
        assert_space_consistent(tier)  # the cancelled put committed or left nothing
        queued = [asyncio.ensure_future(tier.put(f"q{i}", _data(4096, i))) for i in range(8)]
        await asyncio.sleep(0)
        await tier.aclose()  # waits for the queued groups
        assert all(put.done() and put.exception() is None for put in queued)
        await engine.aclose()
        tier = await NvmeTier.open("n", 8 << 20, tmp_path)
        assert {f"q{i}" for i in range(8)} <= set(tier.keys())
        await tier.aclose()

    asyncio.run(main())


def test_two_puts_of_one_key_in_a_group_leave_the_later_one(tmp_path: Path) -> None:
    async def main() -> None:
        engine = ThreadEngine(4)
        tier = await _open(tmp_path, engine)
        first = [tier.put(f"busy{i}", _data(4096, i)) for i in range(2)]  # fill both slots
        same = [tier.put("k", _data(4096, 100)), tier.put("k", _data(4096, 101))]
        await asyncio.gather(*first, *same)
        assert as_bytes(await tier.get("k")) == _data(4096, 101)
        assert_space_consistent(tier)
        await tier.aclose()
        await engine.aclose()

    asyncio.run(main())


def test_a_group_stops_at_its_byte_cap_and_large_puts_go_alone(tmp_path: Path) -> None:
    async def main() -> None:
        engine = ThreadEngine(4)
        tier = await _open(tmp_path, engine, capacity_bytes=32 << 20)
        tier._put_gather._max_group_bytes = 64 * 1024
        values = {f"k{i}": _data(16384, i) for i in range(18)}
        await asyncio.gather(*(tier.put(key, value) for key, value in values.items()))
        assert tier._put_gather.groups == 2 + 16 // 4  # two alone, then 4 x 16 KiB a group
        large = {f"big{i}": _data(1 << 20, 50 + i) for i in range(3)}
        await asyncio.gather(*(tier.put(key, value) for key, value in large.items()))
        assert tier._put_gather.groups == 6  # 1 MiB and more: not gathered
        values.update(large)
        got = await tier.get_many(list(values))
        assert [as_bytes(v) for v in got] == list(values.values())
        assert_space_consistent(tier)
        await tier.aclose()
        await engine.aclose()

    asyncio.run(main())
