"""kvstore.rag.chunk_cache: chunks round-trip whole and by layer, survive a restart, are never
returned corrupt, stay within the disk cap and are evicted by value, not recency."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
import torch

from kvstore.fingerprint import ModelFingerprint
from kvstore.rag.chunk_cache import ChunkCache
from kvstore.rag.chunk_format import context_hash, parse_chunk_key
from kvstore.rag.errors import ChunkShapeError
from tiers import InvalidArgumentError

FP = ModelFingerprint("m", "float32", num_layers=3, block_tokens=1, num_kv_heads=2, head_dim=8)
DISK_BYTES = 1 << 20


def _chunk(seed: int, tokens: int) -> tuple[list[int], torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 1000, (tokens,), generator=generator).tolist()
    kv = torch.randn((3, 2, 2, tokens, 8), generator=generator)
    return ids, kv


async def _open(path: Path, disk_bytes: int = DISK_BYTES, fp: ModelFingerprint = FP) -> ChunkCache:
    return await ChunkCache.open(path, fp, disk_bytes=disk_bytes, dram_bytes=256 << 10)


def test_put_lookup_load_and_load_layer(tmp_path: Path) -> None:
    async def main() -> None:
        cache = await _open(tmp_path)
        try:
            ids, kv = _chunk(0, 37)
            assert cache.lookup(ids) is None
            info = await cache.put(ids, kv, position=12)
            assert info is not None and (info.num_tokens, info.position) == (37, 12)
            hit = cache.lookup(ids)
            assert hit is info and hit.hits == 1
            assert cache.lookup(ids[:-1]) is None  # a prefix is another chunk
            loaded = await cache.load(hit)
            assert loaded is not None and torch.equal(loaded, kv)
            for layer in range(3):
                part = await cache.load_layer(hit, layer)
                assert part is not None and torch.equal(part, kv[layer])
            assert (await cache.put(ids, kv, position=99)) is info  # one variant per chunk
            assert cache.stats()["stored"] == 1
        finally:
            await cache.aclose()

    asyncio.run(main())


def test_a_reopened_cache_hits(tmp_path: Path) -> None:
    async def main() -> None:
        cache = await _open(tmp_path)
        chunks = [_chunk(seed, 10 + seed) for seed in range(4)]
        contexts = [context_hash(range(seed)) if seed % 2 else None for seed in range(4)]
        for position, (ids, kv) in enumerate(chunks):
            await cache.put(ids, kv, position=position * 7, context=contexts[position])
        await cache.aclose()
        cache = await _open(tmp_path)
        try:
            assert len(cache) == 4
            for position, (ids, kv) in enumerate(chunks):
                info = cache.lookup(ids)
                assert info is not None and info.position == position * 7
                assert info.context == contexts[position]  # rebuilt from the key alone
                assert torch.equal(await cache.load(info), kv)  # type: ignore[arg-type]
            # a key of the earlier format (no context part) still parses: never exact
            assert parse_chunk_key(f"rag/{'0' * 16}/{'ab' * 32}/5/7") == (
                bytes.fromhex("ab" * 32), 5, 7, None,
            )  # fmt: skip
        finally:
            await cache.aclose()

    asyncio.run(main())


def flip_bytes_of(directory: Path, kv: torch.Tensor) -> None:
    """Flip 16 bytes in the middle of ``kv``'s bytes wherever the cache's files hold them."""
    raw = kv.numpy().tobytes()
    needle, hits = raw[: len(raw) // 4], 0
    for root, _, names in os.walk(directory):
        for name in names:
            with open(os.path.join(root, name), "r+b") as f:
                data = f.read()
                at = data.find(needle)
                if at >= 0:
                    f.seek(at + len(raw) // 2)
                    f.write(bytes(b ^ 0xFF for b in raw[len(raw) // 2 : len(raw) // 2 + 16]))
                    hits += 1
    assert hits == 1, f"the chunk's bytes were found in {hits} files"


@pytest.mark.parametrize("by_layer", [False, True])
def test_a_corrupt_chunk_is_dropped_never_returned(tmp_path: Path, by_layer: bool) -> None:
    async def main() -> None:
        cache = await _open(tmp_path)
        ids, kv = _chunk(1, 64)
        good_ids, good_kv = _chunk(2, 64)
        await cache.put(ids, kv, position=0)
        await cache.put(good_ids, good_kv, position=0)
        await cache.aclose()
        flip_bytes_of(tmp_path, kv)
        cache = await _open(tmp_path)  # its DRAM tier is empty: reads come from disk
        try:
            info = cache.lookup(ids)
            assert info is not None
            got = await (cache.load_layer(info, 1) if by_layer else cache.load(info))
            assert got is None
            assert cache.stats()["corrupt"] == 1
            assert cache.lookup(ids) is None  # dropped: the caller recomputes and re-stores
            good = cache.lookup(good_ids)
            assert good is not None and torch.equal(await cache.load(good), good_kv)  # type: ignore[arg-type]
            assert await cache.put(ids, kv, position=0) is not None
        finally:
            await cache.aclose()

    asyncio.run(main())


def test_the_cap_holds_and_reused_chunks_outlive_newer_ones(tmp_path: Path) -> None:
    async def main() -> None:
        # each 64-token chunk: 4 KiB header + 24 KiB KV; the disk holds at most 18 of them
        cache = await ChunkCache.open(tmp_path, FP, disk_bytes=512 << 10)
        try:
            favourite = _chunk(100, 64)
            await cache.put(*favourite, position=0)
            for _ in range(5):
                cache.lookup(favourite[0])
            for seed in range(40):
                ids, kv = _chunk(seed, 64)
                await cache.put(ids, kv, position=0)
                tiers = cache.stats()["tiers"]
                for tier in tiers.values():
                    assert tier["used_bytes"] <= tier["capacity_bytes"]
            assert cache.lookup(favourite[0]) is not None  # LRU would have dropped it
            assert cache.stats()["evicted"] >= 40 - 18
            assert len(cache) <= 18
        finally:
            await cache.aclose()

    asyncio.run(main())


def test_models_never_see_each_others_chunks_and_bad_input(tmp_path: Path) -> None:
    async def main() -> None:
        cache = await _open(tmp_path)
        ids, kv = _chunk(3, 16)
        await cache.put(ids, kv, position=0)
        with pytest.raises(ChunkShapeError):
            await cache.put(ids, kv[:, :, :, :15], position=0)
        with pytest.raises(ChunkShapeError):
            await cache.put(ids, kv.double(), position=0)
        with pytest.raises(InvalidArgumentError):
            await cache.put(ids, kv, position=-1)
        with pytest.raises(InvalidArgumentError):
            await cache.load_layer(cache.lookup(ids), 3)  # type: ignore[arg-type]
        await cache.aclose()
        other = ModelFingerprint("m2", "float32", num_layers=3, block_tokens=1,
                                 num_kv_heads=2, head_dim=8)  # fmt: skip
        cache = await _open(tmp_path, fp=other)
        try:
            assert cache.lookup(ids) is None and len(cache) == 0
        finally:
            await cache.aclose()
        with pytest.raises(InvalidArgumentError):
            await ChunkCache.open(None, FP, disk_bytes=1 << 20)

    asyncio.run(main())
