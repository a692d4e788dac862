"""HbmTier on the CPU device (same code as on CUDA): contract, arena slices, clones, compaction."""

from __future__ import annotations

import asyncio
import ctypes
from pathlib import Path

import numpy as np
import pytest

from tiers.storage.tier import Tier
from tiers.testing.tier_contract import TierContract

torch = pytest.importorskip("torch")

from tiers.memory import hbm  # noqa: E402  (after the torch skip)
from tiers.memory.hbm import HbmTier  # noqa: E402


class TestHbmContract(TierContract):
    async def make_tier(self, capacity_bytes: int, tmp_path: Path) -> Tier:
        return HbmTier("hbm", capacity_bytes, device="cpu")


def payload(size: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8)


def test_get_returns_a_uint8_tensor_that_never_aliases_the_arena() -> None:
    async def main() -> None:
        tier = HbmTier("hbm", 1 << 16, device="cpu")
        await tier.put("a", payload(1000, 1))
        got = await tier.get("a")
        assert isinstance(got, torch.Tensor) and got.dtype == torch.uint8
        assert got.device.type == "cpu" and got.numel() == 1000
        address = got.data_ptr()
        assert not tier.arena_address <= address < tier.arena_address + tier.arena_bytes
        got.zero_()  # scribbling on the result leaves the stored object alone
        assert (await tier.get("a")).numpy().tobytes() == payload(1000, 1).tobytes()
        await tier.aclose()

    asyncio.run(main())


def test_objects_are_slices_of_the_one_arena() -> None:
    async def main() -> None:
        tier = HbmTier("hbm", 1 << 20, device="cpu")
        data = {f"k{i}": payload(50 + 1231 * i, i) for i in range(16)}
        for key, value in data.items():
            await tier.put(key, torch.from_numpy(value))
        for key, value in data.items():
            offset, size = tier.extent_of(key) or (-1, -1)
            assert offset % 256 == 0 and offset + size <= tier.arena_bytes
            assert ctypes.string_at(tier.arena_address + offset, size) == value.tobytes()
        assert tier.stats()["device"] == "cpu" and tier.stats()["kind"] == "hbm"
        await tier.aclose()

    asyncio.run(main())


def test_into_tensors_of_other_dtypes_and_host_buffers() -> None:
    async def main() -> None:
        tier = HbmTier("hbm", 1 << 16, device="cpu")
        source = torch.linspace(0, 1, 512, dtype=torch.float64)
        await tier.put("f", source)
        as_int = torch.zeros(1024, dtype=torch.int32)  # same bytes, other dtype
        await tier.get("f", into=as_int)
        assert torch.equal(as_int.view(torch.float64), source)
        host = np.zeros(512, np.float64)
        await tier.get("f", into=host)
        assert np.array_equal(host, source.numpy())
        await tier.put("b", bytearray(b"bytes in"))
        assert bytes((await tier.get("b")).numpy()) == b"bytes in"
        await tier.aclose()

    asyncio.run(main())


def test_overlapping_compaction_moves_are_staged(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hbm, "_MOVE_CHUNK_BYTES", 4096)  # many chunks per move

    async def main() -> None:
        tier = HbmTier("hbm", 64 * 1024, device="cpu")
        await tier.put("a", payload(1024, 1))
        await tier.put("b", payload(30_000, 2))
        await tier.put("c", payload(1024, 3))
        await tier.put("d", payload(32_000, 4))
        await tier.delete("a")
        await tier.delete("c")  # two 1 KiB holes; "b" must slide 1 KiB onto itself
        await tier.put("e", payload(2000, 5))
        assert tier.stats()["compactions"] == 1 and tier.stats()["compacted_bytes"] > 0
        assert tier.extent_of("b") == (0, 30_000)  # moved down by less than its own size
        for key, seed, size in (("b", 2, 30_000), ("d", 4, 32_000), ("e", 5, 2000)):
            assert (await tier.get(key)).numpy().tobytes() == payload(size, seed).tobytes()
        await tier.aclose()

    asyncio.run(main())


def test_construction_and_close() -> None:
    async def main() -> None:
        tier = HbmTier("hbm", 1000, device="cpu")
        assert tier.arena_bytes == 1024  # rounded up to the 256-byte alignment
        await tier.aclose()
        assert tier.stats()["closed"] is True

    asyncio.run(main())


@pytest.mark.gpu
def test_cuda_arena_round_trips() -> None:
    async def main() -> None:
        tier = HbmTier("hbm", 1 << 24)
        assert tier.device.type == "cuda"
        source = torch.arange(4096, dtype=torch.float16)
        await tier.put("cpu", source)
        await tier.put("dev", source.cuda())
        await tier.put("host", source.numpy())
        for key in ("cpu", "dev", "host"):
            got = await tier.get(key)
            assert got.device.type == "cuda" and got.dtype == torch.uint8
            assert torch.equal(got.cpu().view(torch.float16), source)
            host = np.zeros(4096, np.float16)
            await tier.get(key, into=host)
            assert np.array_equal(host, source.numpy())
        await tier.aclose()

    asyncio.run(main())
