"""DramTier: the Tier contract, one arena for every object, compaction, pinning and closing."""

from __future__ import annotations

import asyncio
import ctypes
import errno
import random
from pathlib import Path

import numpy as np
import pytest

from tiers.io.buffers import PAGE_SIZE_BYTES
from tiers.io.errors import (
    CapacityError,
    EngineClosedError,
    EngineUnavailableError,
    InvalidArgumentError,
    NoMemoryError,
    StorageError,
)
from tiers.memory.dram import DramTier
from tiers.storage.tier import Tier
from tiers.testing.tier_contract import TierContract


class TestDramContract(TierContract):
    async def make_tier(self, capacity_bytes: int, tmp_path: Path) -> Tier:
        return DramTier("dram", capacity_bytes)


def payload(size: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8)


def extent_bytes(size: int) -> int:
    """Arena bytes an object takes: rounded up to 64, none at all when empty."""
    return -(-size // 64) * 64


def test_every_object_lies_inside_the_one_arena() -> None:
    async def main() -> None:
        tier = DramTier("dram", 1 << 20, pinned=False)
        assert tier.arena_address % PAGE_SIZE_BYTES == 0
        data = {f"k{i}": payload(100 + 997 * i, i) for i in range(20)}
        for key, value in data.items():
            await tier.put(key, value)
        for key, value in data.items():
            extent = tier.extent_of(key)
            assert extent is not None
            offset, size = extent
            assert size == value.size and offset >= 0 and offset + size <= tier.arena_bytes
            # The bytes sit in the arena itself: nothing was allocated per object.
            assert ctypes.string_at(tier.arena_address + offset, size) == value.tobytes()
        await tier.aclose()

    asyncio.run(main())


def test_stats_and_counters() -> None:
    async def main() -> None:
        tier = DramTier("dram", 1 << 16, pinned=False)
        await tier.put("a", payload(1000, 1))
        await tier.get("a")
        await tier.get("a", byte_range=(10, 90))
        await tier.get("missing")
        stats = tier.stats()
        assert stats["kind"] == "dram" and stats["pinned"] is False
        assert (stats["hits"], stats["misses"]) == (2, 1)
        assert (stats["bytes_read"], stats["bytes_written"]) == (1090, 1000)
        assert stats["used_bytes"] == 1000 and stats["objects"] == 1
        assert tier.estimated_read_s(10**9) == pytest.approx(0.1, rel=0.01)
        await tier.aclose()

    asyncio.run(main())


def test_into_of_any_dtype_and_shape() -> None:
    async def main() -> None:
        tier = DramTier("dram", 1 << 16, pinned=False)
        matrix = np.arange(60, dtype=np.float64).reshape(6, 10)
        await tier.put("m", matrix)
        out = np.zeros((6, 10), np.float64)
        assert await tier.get("m", into=out) is out
        assert np.array_equal(out, matrix)
        with pytest.raises(InvalidArgumentError):  # read-only destination
            await tier.get("m", into=bytes(480))
        with pytest.raises(InvalidArgumentError):  # not contiguous
            await tier.get("m", into=np.zeros(960, np.uint8)[::2])
        with pytest.raises(InvalidArgumentError):  # not contiguous either
            await tier.put("x", matrix[:, ::2])
        await tier.aclose()

    asyncio.run(main())


def test_fragmented_arena_is_compacted_and_keeps_every_byte() -> None:
    async def main() -> None:
        tier = DramTier("dram", 64 * 1024, pinned=False)
        data = {f"k{i}": payload(8192, i) for i in range(8)}
        for key, value in data.items():
            await tier.put(key, value)
        for i in range(0, 8, 2):  # four 8 KiB holes, no two adjacent
            await tier.delete(f"k{i}")
            del data[f"k{i}"]
        data["big"] = payload(30_000, 99)
        await tier.put("big", data["big"])  # no hole fits: the arena is compacted
        assert tier.stats()["compactions"] == 1
        for key, value in data.items():
            assert (await tier.get(key)).tobytes() == value.tobytes()
        await tier.aclose()

    asyncio.run(main())


def test_overwrite_that_fits_only_without_its_old_copy() -> None:
    async def main() -> None:
        tier = DramTier("dram", 64 * 1024, pinned=False)
        await tier.put("a", payload(40_000, 1))
        await tier.put("a", payload(50_000, 2))  # old + new would not fit side by side
        assert tier.used_bytes == 50_000
        assert (await tier.get("a")).tobytes() == payload(50_000, 2).tobytes()
        await tier.aclose()

    asyncio.run(main())


def test_no_fragmentation_blow_up_after_random_cycles() -> None:
    async def main() -> None:
        capacity = 1 << 20
        tier = DramTier("dram", capacity, pinned=False)
        rng = random.Random(7)
        model: dict[str, bytes] = {}
        for step in range(3000):
            key = f"k{rng.randrange(60)}"
            if rng.random() < 0.4:
                await tier.delete(key)
                model.pop(key, None)
                continue
            size = rng.choice([0, 1, 63, 64, 65, 700, 4096, 20_000, 90_000])
            value = payload(size, step).tobytes()
            rounded = sum(
                max(64, -(-len(v) // 64) * 64) for k, v in model.items() if v and k != key
            )
            fits = rounded + (max(64, -(-size // 64) * 64) if size else 0) <= capacity
            try:
                await tier.put(key, value)
                model[key] = value
            except CapacityError:
                assert not fits, f"refused {size} bytes with room for it (step {step})"
        for key, value in model.items():
            assert (await tier.get(key)).tobytes() == value
        for key in list(model):
            await tier.delete(key)
        assert tier.used_bytes == 0 and tier.stats()["arena_free_bytes"] == tier.arena_bytes
        await tier.put("all", payload(capacity, 1))  # one extent spanning the whole arena
        assert tier.stats()["compactions"] > 0  # the workload did exercise compaction
        await tier.aclose()

    asyncio.run(main())


def test_closed_tier_refuses_every_call() -> None:
    async def main() -> None:
        tier = DramTier("dram", 1 << 16, pinned=False)
        await tier.put("a", b"x")
        await tier.aclose()
        await tier.aclose()  # idempotent
        for call in (tier.get("a"), tier.get("b"), tier.put("a", b"y"), tier.delete("a")):
            with pytest.raises(EngineClosedError):
                await call
        with pytest.raises(EngineClosedError):
            tier.size_of("a")
        with pytest.raises(EngineClosedError):
            list(tier.keys())
        assert tier.stats()["closed"] is True

    asyncio.run(main())


def test_pinned_without_cuda_is_refused() -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("CUDA is present: pinning succeeds here")
    with pytest.raises(EngineUnavailableError):
        DramTier("dram", 1 << 16, pinned=True)
    assert DramTier("dram", 1 << 16).pinned is False


@pytest.mark.gpu
def test_pinned_arena_round_trips_cuda_tensors() -> None:
    import torch

    async def main() -> None:
        tier = DramTier("dram", 1 << 24)
        assert tier.pinned and tier.stats()["pinned"]
        source = torch.arange(1 << 20, dtype=torch.float32, device="cuda")
        await tier.put("t", source)
        back = torch.empty_like(source)
        await tier.get("t", into=back)
        assert torch.equal(back, source)
        assert (await tier.get("t")).tobytes() == source.cpu().numpy().tobytes()
        await tier.aclose()

    asyncio.run(main())


def test_full_arena_refuses_cleanly_even_when_overwriting_an_empty_object() -> None:
    async def main() -> None:
        tier = DramTier("dram", 4096, pinned=False)
        await tier.put("e", b"")
        await tier.put("a", payload(4000, 1))
        with pytest.raises(CapacityError):  # 4000 + 96 <= 4096 bytes, but 64-byte extents don't
            await tier.put("e", payload(96, 2))
        assert tier.size_of("e") == 0 and tier.used_bytes == 4000
        await tier.aclose()

    asyncio.run(main())


def test_an_arena_the_kernel_refuses_is_a_typed_error_naming_the_tier() -> None:
    with pytest.raises(NoMemoryError) as info:
        DramTier("huge", 1 << 50)  # more than any process's address space
    assert isinstance(info.value, StorageError) and info.value.errno == errno.ENOMEM
    assert "dram tier 'huge'" in str(info.value) and str(info.value).startswith("[ENOMEM]")


def test_free_bytes_never_promises_room_the_arena_lacks() -> None:
    """Objects of 65 bytes take 128-byte extents: the arena fills while the byte count still
    shows room. free_bytes must say so, so a caller (the store) evicts instead of failing."""

    async def main() -> None:
        tier = DramTier("dram", 1000)
        payload = np.arange(65, dtype=np.uint8)
        stored = 0
        while tier.free_bytes >= len(payload):
            await tier.put(f"k{stored}", payload)  # every put free_bytes allowed succeeds
            stored += 1
        assert stored == 8 and tier.used_bytes == 8 * 65
        assert tier.capacity_bytes - tier.used_bytes >= len(payload)  # the count alone says fits
        with pytest.raises(CapacityError):
            await tier.put("one-too-many", payload)
        assert tier.used_bytes == 8 * 65

    asyncio.run(main())
