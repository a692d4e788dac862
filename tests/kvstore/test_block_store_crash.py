"""kill -9, damaged records and other processes: what a restart-safe cache must survive."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kvstore import KVBlockStore, chain_hashes
from tests.kvstore import block_crash_writer as writer
from tests.kvstore.blocks import BLOCK_BYTES, FP, blocks_of, chain, disk_for, run
from tests.vectordb.helpers import run_and_kill


def _acked_chains(seed: int, acked: int) -> list[list[bytes]]:
    """The chains acknowledged: with four stores in flight, acks may arrive out of order, so
    only the first ``acked - 3`` of the schedule are surely among them."""
    return writer.schedule(seed, acked)[: max(0, acked - 3)]


@pytest.mark.parametrize(("seed", "acks", "delay_s"), [(1, 20, 0.0), (2, 40, 0.05)])
def test_kill_9_loses_no_acknowledged_block(
    tmp_path: Path, seed: int, acks: int, delay_s: float
) -> None:
    acked = run_and_kill(Path(writer.__file__), tmp_path, seed, acks, delay_s)
    assert acked >= acks

    async def check() -> None:
        store = await KVBlockStore.open(tmp_path, FP, disk_bytes=disk_for(100_000))
        for hashes in _acked_chains(seed, acked):
            assert await store.lookup(hashes) == len(hashes)
            into = torch.empty((len(hashes), *FP.block_shape), dtype=FP.torch_dtype)
            assert await store.load(hashes, into) == len(hashes)  # checksums verified
            assert torch.equal(into, blocks_of(hashes))
        assert store.stats()["corrupt_blocks"] == 0
        await store.aclose()

    run(check())


def test_kill_9_under_a_tight_cap_leaves_a_consistent_bounded_store(tmp_path: Path) -> None:
    process = subprocess.Popen(
        [sys.executable, writer.__file__, str(tmp_path), "3", "24"], stdout=subprocess.PIPE
    )
    assert process.stdout is not None
    for _ in range(60):  # far past the cap: every store evicts
        assert process.stdout.readline()
    process.kill()
    process.wait()
    process.stdout.close()

    async def check() -> None:
        store = await KVBlockStore.open(tmp_path, FP, disk_bytes=disk_for(24))
        assert 0 < len(store) <= 24
        assert store.stats()["tiers"]["nvme"]["used_bytes"] <= 24 * BLOCK_BYTES
        hashes = list(store._index.blocks)
        for block_hash in hashes:  # every block left is whole and is its own content
            into = torch.empty((1, *FP.block_shape), dtype=FP.torch_dtype)
            assert await store.load([block_hash], into) == 1
            assert torch.equal(into, blocks_of([block_hash]))
        await store.aclose()

    run(check())


def _flip_every_record(directory: Path) -> int:
    """Flip a byte in the middle of every 8 KiB record of the tier's extent files."""
    flipped = 0
    for path in directory.rglob("*"):
        if path.is_file() and path.stat().st_size >= BLOCK_BYTES and "catalog" not in str(path):
            with open(path, "r+b") as file:
                size = path.stat().st_size
                for offset in range(BLOCK_BYTES // 2, size, BLOCK_BYTES):
                    file.seek(offset)
                    byte = file.read(1)
                    file.seek(offset)
                    file.write(bytes([byte[0] ^ 0xFF]))
                    flipped += 1
    return flipped


def test_a_damaged_block_is_dropped_never_returned(tmp_path: Path) -> None:
    hashes = chain("damaged", 4)

    async def write() -> None:
        store = await KVBlockStore.open(tmp_path, FP, disk_bytes=disk_for(16))
        await store.store(hashes, blocks_of(hashes))
        await store.aclose()

    run(write())
    assert _flip_every_record(tmp_path) >= 4

    async def check() -> None:
        store = await KVBlockStore.open(tmp_path, FP, disk_bytes=disk_for(16))
        assert await store.lookup(hashes) == 4  # the index does not read blocks
        into = torch.zeros((4, *FP.block_shape), dtype=FP.torch_dtype)
        assert await store.load(hashes, into) == 0
        assert store.stats()["corrupt_blocks"] >= 1
        assert await store.lookup(hashes) == 0  # dropped: the caller recomputes
        layer = torch.zeros((4, *FP.layer_shape), dtype=FP.torch_dtype)
        assert await store.load_layer(hashes, 0, layer) == 0
        await store.store(hashes, blocks_of(hashes))  # and it can be stored again
        assert await store.load(hashes, into) == 4 and torch.equal(into, blocks_of(hashes))
        await store.aclose()

    run(check())


def test_block_hashes_are_the_same_in_every_process() -> None:
    tokens = list(range(100))
    here = [h.hex() for h in chain_hashes(tokens, 16)]
    code = (
        "from kvstore import chain_hashes;"
        "print(','.join(h.hex() for h in chain_hashes(list(range(100)), 16)))"
    )
    for seed in ("0", "12345", "random"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        assert out.stdout.strip().split(",") == here
    assert len(here) == 6  # full blocks only
    assert chain_hashes(tokens[:50], 16) == chain_hashes(tokens, 16)[:3]  # a prefix's chain


def test_a_second_process_cannot_open_a_store_in_use(tmp_path: Path) -> None:
    async def hold() -> None:
        store = await KVBlockStore.open(tmp_path, FP, disk_bytes=disk_for(8))
        code = (
            "import asyncio, sys; sys.path.insert(0, '.');"
            "from kvstore import KVBlockStore; from tests.kvstore.blocks import FP;"
            f"asyncio.run(KVBlockStore.open({str(tmp_path)!r}, FP, disk_bytes=1 << 20))"
        )
        out = await asyncio.to_thread(
            subprocess.run, [sys.executable, "-c", code], capture_output=True, text=True
        )
        assert out.returncode != 0 and "Error" in out.stderr
        await store.aclose()

    run(hold())
