"""NvmeTier.get_many's batched path (tiers.nvme.batch_reads): whole-page objects read straight
into page-aligned destinations, every other one staged; destinations of every kind mixed in one
batch; shared destinations; damage still found in place; a cancelled get_many that leaves no
I/O aimed at its destinations."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np
import pytest

from tests.tiers.nvme.helpers import flip_byte
from tests.tiers.nvme.test_nvme import _GatedReads, assert_space_consistent, lease
from tiers.io.batch import IOBatch
from tiers.io.buffers import aligned_empty
from tiers.io.errors import CorruptionError, InvalidArgumentError, StorageError
from tiers.io.threaded import ThreadEngine
from tiers.nvme import batch_reads
from tiers.nvme.nvme_tier import NvmeTier
from tiers.testing.faulty_engine import FaultyEngine
from tiers.testing.tier_contract import as_bytes

PAGE = 4096


def _data(size: int, seed: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()


def test_destinations_of_every_kind_in_one_batch(tmp_path: Path) -> None:
    values = {
        "page": _data(PAGE, 1),  # into an aligned array: read in place
        "pages": _data(4 * PAGE, 2),  # into an unaligned array: staged
        "odd": _data(5000, 3),  # a header record: staged
        "fresh": _data(2 * PAGE, 4),  # no destination: a view
        "bytes": _data(PAGE, 5),  # into a bytearray
        "wide": _data(PAGE, 6),  # into an aligned float64 array
    }

    async def main() -> None:
        tier = await NvmeTier.open("n", 4 << 20, tmp_path, create=True)
        await tier.put_many(values)
        unaligned = np.zeros(4 * PAGE + 1, np.uint8)[1:]
        into = [
            aligned_empty(PAGE),
            unaligned,
            np.zeros(5000, np.uint8),
            None,
            bytearray(PAGE),
            aligned_empty(PAGE, dtype=np.float64),
            aligned_empty(PAGE),
        ]
        keys = [*values, "absent"]
        got = await tier.get_many(keys, into=into)
        assert got[-1] is None
        for key, out, value in zip(values, into, got, strict=False):
            if out is not None:
                assert value is out  # the destination itself, as get returns it
            assert as_bytes(value)[: len(values[key])] == values[key]
        views = await tier.get_many(values)  # no destinations: views of one fresh buffer
        assert [as_bytes(v) for v in views] == list(values.values())
        stats = tier.stats()
        assert (stats["hits"], stats["misses"], stats["corruptions"]) == (12, 1, 0)
        await tier.aclose()

    asyncio.run(main())


def test_a_shared_destination_ends_with_the_last_key(tmp_path: Path) -> None:
    async def main() -> None:
        tier = await NvmeTier.open("n", 1 << 20, tmp_path, create=True)
        await tier.put_many({"a": _data(PAGE, 1), "b": _data(PAGE, 2)})
        shared = aligned_empty(PAGE)
        got = await tier.get_many(["a", "b"], into=[shared, shared])
        assert got == [shared, shared]
        assert shared.tobytes() == _data(PAGE, 2)  # copied in key order, no false damage
        await tier.aclose()

    asyncio.run(main())


@pytest.mark.parametrize(("key", "size"), [("page", PAGE), ("odd", 5000)])
def test_damage_read_in_place_raises(tmp_path: Path, key: str, size: int) -> None:
    async def main() -> None:
        tier = await NvmeTier.open("n", 1 << 20, tmp_path, create=True)
        await tier.put_many({key: _data(size, 1), "other": _data(PAGE, 2)})
        flip_byte(tier, key, 100)
        with pytest.raises(CorruptionError, match="checksum"):
            await tier.get_many(["other", key], into=[aligned_empty(size), aligned_empty(size)])
        assert tier.stats()["corruptions"] == 1
        assert as_bytes(await tier.get("other")) == _data(PAGE, 2)  # only its own key fails
        await tier.aclose()

    asyncio.run(main())


def test_a_bad_destination_raises_before_any_io(tmp_path: Path) -> None:
    async def main() -> None:
        engine = ThreadEngine(4)
        tier = await NvmeTier.open("n", 1 << 20, tmp_path, runtime=lease(engine), create=True)
        await tier.put_many({"a": _data(PAGE, 1), "b": _data(PAGE, 2)})
        read_only = aligned_empty(PAGE)
        read_only.flags.writeable = False
        before = engine.counters["batches"]
        for bad in (read_only, aligned_empty(PAGE)[::2], np.zeros(10, np.uint8), "text"):
            with pytest.raises(InvalidArgumentError):
                await tier.get_many(["a", "b"], into=[aligned_empty(PAGE), bad])
        assert engine.counters["batches"] == before
        await tier.aclose()
        await engine.aclose()

    asyncio.run(main())


class _SlowEngine(ThreadEngine):
    """Starts each batch 50 ms late, so a test can cancel a get while its read is pending."""

    async def run(self, batch: IOBatch) -> None:
        await asyncio.sleep(0.05)
        await super().run(batch)


def test_a_cancelled_get_many_waits_for_reads_into_its_destinations(tmp_path: Path) -> None:
    async def main() -> None:
        engine = _SlowEngine(4)
        tier = await NvmeTier.open("n", 1 << 20, tmp_path, runtime=lease(engine), create=True)
        await tier.put("a", _data(PAGE, 1))
        out = aligned_empty(PAGE)
        out[:] = 0
        task = asyncio.ensure_future(tier.get_many(["a"], into=[out]))
        await asyncio.sleep(0.01)
        started = time.perf_counter()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert time.perf_counter() - started > 0.02  # it waited for the read
        assert out.tobytes() == _data(PAGE, 1)  # written before the cancellation went on
        assert as_bytes(await tier.get("a")) == _data(PAGE, 1)
        await tier.aclose()
        await engine.aclose()

    asyncio.run(main())


def test_a_failed_read_in_place_raises_and_the_tier_goes_on(tmp_path: Path) -> None:
    async def main() -> None:
        engine = FaultyEngine(ThreadEngine(4))
        tier = await NvmeTier.open("n", 1 << 20, tmp_path, runtime=lease(engine), create=True)
        await tier.put_many({"a": _data(PAGE, 1), "b": _data(PAGE, 2)})
        engine.fail_next("eio_read")
        into = [aligned_empty(PAGE), aligned_empty(PAGE)]
        with pytest.raises(StorageError):
            await tier.get_many(["a", "b"], into=into)
        got = await tier.get_many(["a", "b"], into=into)
        assert [as_bytes(v) for v in got] == [_data(PAGE, 1), _data(PAGE, 2)]
        await tier.aclose()
        await engine.aclose()

    asyncio.run(main())


@pytest.mark.parametrize("in_place", [True, False])
def test_a_release_during_a_batch_read_waits_for_it(tmp_path: Path, in_place: bool) -> None:
    """The batch's extents are pinned as one array: an overwrite and a delete that commit while
    it reads them defer their frees to its end, so no put takes those extents meanwhile."""
    old = {"k": _data(2 * PAGE, 1), "gone": _data(2 * PAGE, 2)}

    async def main() -> None:
        engine = _GatedReads(ThreadEngine(4))
        tier = await NvmeTier.open("n", 1 << 20, tmp_path, runtime=lease(engine), create=True)
        await tier.put_many(old)
        places = {tier.locate(key) for key in old}
        engine.gate.clear()
        into = [aligned_empty(2 * PAGE) for _ in range(3)] if in_place else None
        reader = asyncio.ensure_future(tier.get_many(["k", "gone", "k"], into=into))
        await engine.read_waiting.wait()
        await tier.put("k", _data(2 * PAGE, 3))
        assert await tier.delete("gone")
        assert tier.stats()["extent_frees_deferred"] == 2
        await tier.put_many({f"new{i}": _data(2 * PAGE, 4 + i) for i in range(2)})
        assert not places & {tier.locate("new0"), tier.locate("new1")}
        engine.gate.set()
        got = await reader
        assert [as_bytes(v) for v in got] == [old["k"], old["gone"], old["k"]]
        assert tier.stats()["extent_frees_deferred"] == 0
        assert_space_consistent(tier)
        await tier.aclose()
        await engine.aclose()

    asyncio.run(main())


def test_large_batches_are_checked_off_the_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(batch_reads, "_OFFLOAD_BYTES", 0)  # every batch: the CPU executor

    async def main() -> None:
        tier = await NvmeTier.open("n", 1 << 20, tmp_path, create=True)
        values = {"a": _data(PAGE, 1), "b": _data(5000, 2)}
        await tier.put_many(values)
        got = await tier.get_many(["a", "b"], into=[aligned_empty(PAGE), None])
        assert [as_bytes(v) for v in got] == list(values.values())
        flip_byte(tier, "a", 7)
        with pytest.raises(CorruptionError):
            await tier.get_many(["b", "a"])
        await tier.aclose()

    asyncio.run(main())
