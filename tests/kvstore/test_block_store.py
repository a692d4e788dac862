"""KVBlockStore: round trips, prefix lookups, namespaces, capacity, pins, reopen, bad input."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kvstore import KVBlockStore, ModelFingerprint
from tests.kvstore.blocks import BLOCK_BYTES, FP, blocks_of, chain, disk_for, run
from tiers import ConfigError, InvalidArgumentError, TierkitError


async def _open(path: Path, blocks: int = 16, **options: object) -> KVBlockStore:
    options.setdefault("disk_bytes", disk_for(blocks))
    return await KVBlockStore.open(path, FP, **options)  # type: ignore[arg-type]


def test_store_lookup_load_and_load_layer(tmp_path: Path) -> None:
    async def body() -> None:
        store = await _open(tmp_path, dram_bytes=4 * BLOCK_BYTES)
        hashes = chain("a", 6)
        blocks = blocks_of(hashes)
        assert await store.store(hashes, blocks) == 6
        assert await store.store(hashes[:3], blocks[:3]) == 0  # already cached: skipped
        assert await store.lookup(hashes) == 6
        assert await store.lookup([*hashes[:2], b"absent", hashes[3]]) == 2
        into = torch.zeros_like(blocks)
        assert await store.load(hashes, into) == 6
        assert torch.equal(into, blocks)
        layer = torch.zeros((6, *FP.layer_shape), dtype=FP.torch_dtype)
        assert await store.load_layer(hashes, 1, layer) == 6
        assert torch.equal(layer, blocks[:, 1])
        partial = torch.zeros((3, *FP.block_shape), dtype=FP.torch_dtype)
        assert await store.load([hashes[0], hashes[1], b"gone"], partial) == 2
        assert torch.equal(partial[:2], blocks[:2]) and not partial[2].any()
        strided = torch.zeros((*FP.block_shape, 2), dtype=FP.torch_dtype)[..., 0]
        assert await store.load(hashes[:1], strided.unsqueeze(0)) == 1  # staged copy
        assert torch.equal(strided, blocks[0])
        stats = store.stats()
        assert stats["blocks"] == 6 and stats["stored_blocks"] == 6
        assert stats["tiers"]["nvme"]["used_bytes"] == 6 * BLOCK_BYTES
        await store.aclose()

    run(body())


def test_models_never_see_each_others_blocks(tmp_path: Path) -> None:
    other = ModelFingerprint(
        model="test-model",
        dtype="bfloat16",
        num_layers=2,
        block_tokens=16,
        num_kv_heads=1,
        head_dim=64,
    )  # fmt: skip — same bytes per block, another layout
    assert other.block_bytes == FP.block_bytes and other.digest() != FP.digest()

    async def body() -> None:
        hashes = chain("shared", 3)
        store = await _open(tmp_path)
        await store.store(hashes, blocks_of(hashes))
        await store.aclose()
        store = await KVBlockStore.open(tmp_path, other, disk_bytes=disk_for(16))
        assert await store.lookup(hashes) == 0 and len(store) == 0
        await store.aclose()

    run(body())


def test_the_cap_is_never_exceeded_and_leaves_go_first(tmp_path: Path) -> None:
    async def body() -> None:
        store = await _open(tmp_path, blocks=8, dram_bytes=2 * BLOCK_BYTES)
        first = chain("first", 5)
        await store.store(first, blocks_of(first))
        second = chain("second", 5, root=first[:2])  # shares first's two root blocks
        assert await store.lookup(second) == 2
        assert await store.store(second[2:], blocks_of(second[2:]), parent=second[1]) == 5
        for tier in store.stats()["tiers"].values():
            assert tier["used_bytes"] <= tier["capacity_bytes"]
        assert len(store) == 8
        # the prefix policy took first's leaves (its last blocks), not the shared roots
        assert await store.lookup(second) == 7 and await store.lookup(first) == 3
        assert store.stats()["evicted_blocks"] == 2
        await store.aclose()

    run(body())


def test_a_chain_longer_than_the_store_keeps_its_first_blocks(tmp_path: Path) -> None:
    async def body() -> None:
        store = await _open(tmp_path, blocks=4)
        hashes = chain("long", 7)
        assert await store.store(hashes, blocks_of(hashes)) == 4
        assert await store.lookup(hashes) == 4
        assert store.stats()["rejected_blocks"] == 3
        await store.aclose()

    run(body())


def test_pinned_blocks_stay_and_evict_drops_the_rest(tmp_path: Path) -> None:
    async def body() -> None:
        store = await _open(tmp_path, blocks=4)
        pinned = chain("pinned", 4)
        await store.store(pinned, blocks_of(pinned))
        assert await store.pin([*pinned, b"absent"]) == 4
        other = chain("other", 2)
        assert await store.store(other, blocks_of(other)) == 0  # no room: all pinned
        assert await store.unpin(pinned[2:]) == 2
        assert await store.store(other, blocks_of(other)) == 2
        assert await store.lookup(pinned) == 2  # the two still pinned
        assert await store.evict(pinned) == 0  # pinned blocks are not evicted
        assert await store.unpin(pinned) == 2 and await store.evict(pinned[1:]) == 1
        assert await store.lookup(pinned) == 1
        await store.aclose()

    run(body())


def test_a_reopened_store_finds_its_blocks_and_chains(tmp_path: Path) -> None:
    async def body() -> None:
        store = await _open(tmp_path, blocks=6)
        hashes = chain("kept", 5)
        await store.store(hashes, blocks_of(hashes))
        await store.aclose()
        store = await _open(tmp_path, blocks=6, create=False)
        assert len(store) == 5 and await store.lookup(hashes) == 5
        into = torch.zeros((5, *FP.block_shape), dtype=FP.torch_dtype)
        assert await store.load(hashes, into) == 5 and torch.equal(into, blocks_of(hashes))
        # depths came back from the keys: a prefix policy still takes the leaf first
        other = chain("new", 2)
        await store.store(other, blocks_of(other))
        assert await store.lookup(hashes) == 4
        await store.aclose()

    run(body())


def test_dram_only_store_is_bounded_too() -> None:
    async def body() -> None:
        store = await KVBlockStore.open(None, FP, dram_bytes=3 * BLOCK_BYTES, policy="lru")
        for name in "abc":
            hashes = chain(name, 2)
            await store.store(hashes, blocks_of(hashes))
            assert store.stats()["tiers"]["dram"]["used_bytes"] <= 3 * BLOCK_BYTES
        assert len(store) == 3
        await store.aclose()

    run(body())


def test_bad_input_is_a_typed_error(tmp_path: Path) -> None:
    async def body() -> None:
        store = await _open(tmp_path)
        hashes = chain("bad", 2)
        with pytest.raises(InvalidArgumentError, match="shape"):
            await store.store(hashes, blocks_of(hashes)[:1])
        with pytest.raises(InvalidArgumentError, match="bfloat16"):
            await store.store(hashes, blocks_of(hashes).float())
        with pytest.raises(InvalidArgumentError, match="bytes"):
            await store.lookup(["not bytes"])  # type: ignore[list-item]
        with pytest.raises(InvalidArgumentError, match="1 to 120"):
            await store.lookup([b"x" * 121])
        with pytest.raises(InvalidArgumentError, match="layer 2"):
            await store.load_layer(hashes, 2, torch.empty(2, *FP.layer_shape))
        with pytest.raises(InvalidArgumentError, match="into"):
            await store.load(hashes, torch.empty(2, 3))
        await store.aclose()
        with pytest.raises(InvalidArgumentError, match="policy"):
            await _open(tmp_path, policy="fifo")
        with pytest.raises(InvalidArgumentError):
            await KVBlockStore.open(tmp_path, FP)  # no tier at all
        with pytest.raises((ConfigError, TierkitError)):  # a mistyped path is not a new cache
            await _open(tmp_path / "typo", create=False)
        with pytest.raises(InvalidArgumentError):
            ModelFingerprint("m", "int3", 1, 16, 1, 8)

    run(body())


def test_the_sync_store_serves_many_threads(tmp_path: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from kvstore import SyncKVBlockStore

    with SyncKVBlockStore.open(tmp_path, FP, disk_bytes=disk_for(64)) as store:

        def worker(name: str) -> bool:
            hashes = chain(name, 3)
            store.store_blocks(hashes, blocks_of(hashes))
            into = torch.empty((3, *FP.block_shape), dtype=FP.torch_dtype)
            return (
                store.lookup(hashes) == 3
                and store.load(hashes, into) == 3
                and bool(torch.equal(into, blocks_of(hashes)))
            )

        with ThreadPoolExecutor(4) as pool:
            assert all(pool.map(worker, [f"t{i}" for i in range(8)]))
        assert len(store) == 24 and store.stats()["stored_blocks"] == 24


def test_a_compressed_store_round_trips_within_the_codec_error(tmp_path: Path) -> None:
    from kvstore.kivi import KiviCodec

    codec = KiviCodec(bits=4, residual_tokens=4, group_tokens=4)
    assert codec.encoded_bytes(FP) % 4096  # so the store pads each object to a page

    async def body() -> None:
        store = await _open(tmp_path, compression=codec)
        assert store.object_bytes % 4096 == 0
        hashes = chain("kivi", 3)
        blocks = blocks_of(hashes)
        await store.store(hashes, blocks)
        into = torch.zeros_like(blocks)
        assert await store.load(hashes, into) == 3
        error = (into.float() - blocks.float()).abs()
        assert 0 < error.max() < 0.5 and torch.equal(into[:, :, :, -4:], blocks[:, :, :, -4:])
        await store.aclose()
        plain = await _open(tmp_path)  # another namespace: raw blocks never meet codec ones
        assert await plain.lookup(hashes) == 0
        await plain.aclose()

    run(body())


def test_a_lookup_without_touch_changes_nothing(tmp_path: Path) -> None:
    async def body() -> None:
        store = await _open(tmp_path, blocks=2, policy="lru")
        old, new = chain("old", 1), chain("new", 1)
        await store.store(old, blocks_of(old))
        await store.store(new, blocks_of(new))
        for _ in range(3):  # a scheduler asking again and again: old stays least recent
            assert await store.lookup(old, touch=False) == 1
        assert store.stats()["lookups"] == 0
        third = chain("third", 1)
        await store.store(third, blocks_of(third))
        assert await store.lookup(old, touch=False) == 0  # evicted: never touched
        into = torch.empty((1, *FP.block_shape), dtype=FP.torch_dtype)
        assert await store.load(new, into, touch=True) == 1  # the load is the use
        await store.store(old, blocks_of(old))
        assert await store.lookup(new, touch=False) == 1 and await store.lookup(third) == 0
        await store.aclose()

    run(body())


def test_the_disk_reserve_covers_the_chunk_table_of_big_blocks() -> None:
    """Blocks of 1 MiB and more carry a CRC a 256 KiB chunk in their catalog entry: the
    reserve per block grows with it (twice the entry, as for the rest of the catalog)."""
    from tiers.nvme import catalog_entry_bytes

    for block_bytes in (16 << 10, 1 << 20, 64 << 20):
        one = KVBlockStore.disk_bytes_for(1, block_bytes)
        two = KVBlockStore.disk_bytes_for(2, block_bytes)
        reserve = two - one - block_bytes
        assert reserve >= 2 * catalog_entry_bytes(block_bytes)
        assert reserve >= 512
