"""NvmeTier gathers concurrent single gets into shared submissions: fewer engine batches, each
get with its own result or error (absent, bad destination, damaged record), cancelled gets left
alone, and a close that waits for gets still queued."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.tiers.nvme.helpers import flip_byte
from tests.tiers.nvme.test_nvme import lease
from tiers.io.errors import CorruptionError, InvalidArgumentError
from tiers.io.threaded import ThreadEngine
from tiers.nvme.nvme_tier import NvmeTier
from tiers.nvme.writes import KeyLocks
from tiers.testing.tier_contract import as_bytes


def _data(size: int, seed: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()


async def _open(tmp_path: Path, engine: ThreadEngine) -> NvmeTier:
    return await NvmeTier.open(
        "n", 4 << 20, tmp_path, runtime=lease(engine), extent_file_bytes=64 * 1024, create=True
    )


def test_concurrent_gets_share_submissions_and_each_gets_its_own_result(tmp_path: Path) -> None:
    values = {f"k{i}": _data(4096 * (1 + i % 3) + (i % 2) * 100, i) for i in range(40)}

    async def main() -> None:
        engine = ThreadEngine(8)
        tier = await _open(tmp_path, engine)
        await tier.put_many(values)
        outs = {key: np.zeros(len(value), np.uint8) for key, value in values.items()}
        before = engine.counters["batches"]
        got = await asyncio.gather(
            *(tier.get(key, into=outs[key] if i % 2 else None) for i, key in enumerate(values)),
            tier.get("absent"),
            tier.get("k3", byte_range=(10, 100)),
        )
        assert engine.counters["batches"] - before <= 2  # was one per get: 41
        for (key, value), result in zip(values.items(), got, strict=False):
            assert as_bytes(result) == value
            if int(key[1:]) % 2:
                assert result is outs[key]
        assert got[-2] is None and as_bytes(got[-1]) == values["k3"][10:110]
        stats = tier.stats()
        assert (stats["gets"], stats["hits"], stats["misses"]) == (42, 41, 1)
        await tier.aclose()
        await engine.aclose()

    asyncio.run(main())


def test_a_failing_get_fails_alone(tmp_path: Path) -> None:
    values = {f"k{i}": _data(8192, i) for i in range(8)}

    async def main() -> None:
        engine = ThreadEngine(8)
        tier = await _open(tmp_path, engine)
        await tier.put_many(values)
        flip_byte(tier, "k5", 3000, mask=0x10)
        calls: list[Any] = [tier.get(key) for key in values]
        calls.append(tier.get("k1", into=np.zeros(10, np.uint8)))  # too small
        calls.append(tier.get("k2", byte_range=(8000, 500)))  # past the end
        got = await asyncio.gather(*calls, return_exceptions=True)
        for key, result in zip(values, got, strict=False):
            if key == "k5":
                assert isinstance(result, CorruptionError)
            else:
                assert as_bytes(result) == values[key]
        assert isinstance(got[-2], InvalidArgumentError)
        assert isinstance(got[-1], InvalidArgumentError)
        assert tier.stats()["corruptions"] == 1
        await tier.aclose()
        await engine.aclose()

    asyncio.run(main())


def test_a_cancelled_get_leaves_its_buffer_alone(tmp_path: Path, monkeypatch: Any) -> None:
    async def main() -> None:
        engine = ThreadEngine(8)
        tier = await _open(tmp_path, engine)
        await tier.put_many({"a": _data(4096, 1), "b": _data(4096, 2), "c": _data(4096, 3)})
        entered, gate = asyncio.Event(), asyncio.Event()
        assert tier._records is not None
        real = tier._records.read_many

        async def held(reads: Any) -> Any:
            entered.set()
            await gate.wait()
            return await real(reads)

        monkeypatch.setattr(tier._records, "read_many", held)
        outs = [np.zeros(4096, np.uint8) for _ in range(3)]
        early = asyncio.ensure_future(tier.get("a", into=outs[0]))
        early.cancel()  # before its read was planned: dropped
        late = asyncio.ensure_future(tier.get("b", into=outs[1]))
        kept = asyncio.ensure_future(tier.get("c", into=outs[2]))
        await entered.wait()
        late.cancel()  # while its read is in flight
        gate.set()
        assert as_bytes(await kept) == _data(4096, 3)
        for task in (early, late):
            with pytest.raises(asyncio.CancelledError):
                await task
        assert not outs[0].any() and not outs[1].any()
        await tier.aclose()
        await engine.aclose()

    asyncio.run(main())


def test_close_waits_for_queued_gets(tmp_path: Path) -> None:
    async def main() -> None:
        engine = ThreadEngine(8)
        tier = await _open(tmp_path, engine)
        await tier.put("a", _data(5000, 1))
        pending = asyncio.ensure_future(tier.get("a"))
        await asyncio.sleep(0)  # queued, not yet read
        await tier.aclose()
        assert as_bytes(await pending) == _data(5000, 1)
        await engine.aclose()

    asyncio.run(main())


def test_key_locks_serialise_each_key_and_survive_cancellation() -> None:
    async def main() -> None:
        locks = KeyLocks()
        order: list[str] = []

        async def writer(name: str, keys: list[str]) -> None:
            await locks.acquire(keys)
            order.append(f"{name}+")
            await asyncio.sleep(0.01)
            order.append(f"{name}-")
            locks.release(keys)

        # overlapping batches in sorted order: no deadlock, each key held by one at a time
        await asyncio.gather(
            writer("a", ["k1", "k2"]), writer("b", ["k2", "k3"]), writer("c", ["k3"])
        )
        assert order.index("a-") < order.index("b+") and order.index("c-") < order.index("b+")
        await locks.acquire(["x"])
        waiting = asyncio.ensure_future(locks.acquire(["w", "x"]))
        await asyncio.sleep(0)
        waiting.cancel()  # holds w, waits for x: cancelled, it must give w back
        with pytest.raises(asyncio.CancelledError):
            await waiting
        locks.release(["x"])
        await asyncio.wait_for(locks.acquire(["w", "x"]), 1)
        locks.release(["w", "x"])
        assert not locks._held

    asyncio.run(main())
