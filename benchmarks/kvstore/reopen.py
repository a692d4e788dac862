"""Reopen time of a disk-backed KVBlockStore holding many blocks, and the replay's hit rate
across a restart.

Reopen: a store of ``blocks`` tiny replay blocks (4 KiB, ``REPLAY_FP``) is filled in chains of
``chain_blocks`` (one ``store`` per chain), closed, then opened ``repeats`` times; each open is
timed from the call to a store that answers a lookup of the last chain in full (the index is
rebuilt from the catalog's key list; no block is read). Seconds per million blocks = median
open time / blocks * 1e6.

Restart: the trace's first half is replayed on a disk store, which is then closed and
reopened before the second half; the caller sets its second-half hit rate beside an
uninterrupted replay's (benchmarks.kvstore.hit_rates).

Thread-safety: one asyncio loop; run as part of the benchmark.
"""

from __future__ import annotations

import shutil
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from benchmarks.kvstore.replay import (
    REPLAY_FP,
    ReplayCounts,
    directory_bytes,
    disk_bytes_for,
    open_replay_store,
    replay_requests,
)
from kvstore import KVBlockStore

__all__ = ["measure_reopen", "restart_hit_rates"]


async def measure_reopen(
    directory: Path, blocks: int, *, chain_blocks: int = 512, repeats: int = 3
) -> dict[str, Any]:
    """Fill a store with ``blocks`` blocks, then time ``repeats`` reopenings."""
    shutil.rmtree(directory, ignore_errors=True)
    capacity_bytes = disk_bytes_for(blocks)
    store = await KVBlockStore.open(directory, REPLAY_FP, disk_bytes=capacity_bytes)
    payload = torch.zeros((chain_blocks, *REPLAY_FP.block_shape), dtype=REPLAY_FP.torch_dtype)
    last_chain: list[bytes] = []
    fill_start_s = time.perf_counter()
    try:
        for first in range(0, blocks, chain_blocks):
            count = min(chain_blocks, blocks - first)
            last_chain = [f"fill-{n}".encode() for n in range(first, first + count)]
            if await store.store(last_chain, payload[:count]) != count:
                raise RuntimeError("the store refused blocks while filling")
        held = len(store)
    finally:
        await store.aclose()
    fill_s = time.perf_counter() - fill_start_s
    if held != blocks:
        raise RuntimeError(f"the store holds {held} blocks, {blocks} were stored")
    open_s: list[float] = []
    for _ in range(repeats):
        start_s = time.perf_counter()
        store = await KVBlockStore.open(
            directory, REPLAY_FP, disk_bytes=capacity_bytes, create=False
        )
        try:
            found = await store.lookup(last_chain)
            open_s.append(time.perf_counter() - start_s)
            if found != len(last_chain) or len(store) != blocks:
                raise RuntimeError(f"after reopening: {len(store)} blocks, chain {found}")
        finally:
            await store.aclose()
    on_disk_bytes = directory_bytes(directory)
    shutil.rmtree(directory, ignore_errors=True)
    median_s = statistics.median(open_s)
    return {
        "blocks": blocks,
        "block_bytes": REPLAY_FP.block_bytes,
        "fill_s": round(fill_s, 2),
        "fill_blocks_per_s": round(blocks / fill_s),
        "open_s": [round(s, 3) for s in open_s],
        "open_s_median": round(median_s, 3),
        "s_per_million_blocks": round(median_s / blocks * 1e6, 2),
        "directory_bytes": on_disk_bytes,
    }


async def restart_hit_rates(
    directory: Path, requests: Sequence[Sequence[int]], capacity_blocks: int, policy: str
) -> dict[str, Any]:
    """A disk replay of the first half of ``requests``, close, reopen, and the second half:
    the second half's hit rate (the caller sets it beside an uninterrupted replay's) and the
    capacity check of the whole run."""
    half = len(requests) // 2
    cap_bytes = disk_bytes_for(capacity_blocks)
    data_bytes = capacity_blocks * REPLAY_FP.block_bytes
    shutil.rmtree(directory, ignore_errors=True)
    first, second = ReplayCounts(), ReplayCounts()
    store = await open_replay_store(directory, capacity_blocks, policy, "disk")
    try:
        await replay_requests(
            store,
            requests[:half],
            first,
            directory=directory,
            disk_cap_bytes=cap_bytes,
            data_cap_bytes=data_bytes,
        )
        held = len(store)
        await store.aclose()
        start_s = time.perf_counter()
        store = await open_replay_store(directory, capacity_blocks, policy, "disk", create=False)
        reopen_s = time.perf_counter() - start_s
        reopened = len(store)
        await replay_requests(
            store,
            requests[half:],
            second,
            directory=directory,
            disk_cap_bytes=cap_bytes,
            data_cap_bytes=data_bytes,
        )
    finally:
        await store.aclose()
        shutil.rmtree(directory, ignore_errors=True)
    return {
        "policy": policy,
        "capacity_blocks": capacity_blocks,
        "blocks_before_restart": held,
        "blocks_after_restart": reopened,
        "reopen_s": round(reopen_s, 3),
        "second_half_hit_rate_restart": round(second.hit_rate, 5),
        "tier_overrun_bytes": max(first.tier_overrun_bytes, second.tier_overrun_bytes),
        "disk_overrun_bytes": max(first.disk_overrun_bytes, second.disk_overrun_bytes),
        "max_directory_bytes": max(first.max_directory_bytes, second.max_directory_bytes),
        "max_extent_overrun_bytes": max(
            first.max_extent_overrun_bytes, second.max_extent_overrun_bytes
        ),
    }
