"""Store and load throughput of real-size KV blocks through KVBlockStore vs the bare tier.

Blocks have a 7B model's shape (``FP_7B``: Mistral-7B-like, 32 layers, 8 KV heads, head dim
128, 512-token blocks, bfloat16: 64 MiB a block). Two stores of the same tier configuration
(an NVMe tier only, O_DIRECT, so every load reads the device and not DRAM), each in its own
directory: a ``KVBlockStore`` and a plain ``tiers.open_store`` TieredStore ("raw"). Each round,
on the same bytes and the same block count:

* store: ``KVBlockStore.store(hashes, blocks)`` vs ``TieredStore.put_many`` of the blocks;
* load: ``KVBlockStore.load(hashes, into)`` vs ``TieredStore.get_many(keys, into=...)``;
* load_layer: every layer once, ``KVBlockStore.load_layer(hashes, layer, into)`` vs the
  tier's ``get(key, into=..., byte_range=layer span)`` of each block, gathered;

the two sides run back to back, in ABBA order over the rounds (round r runs the KV store
first when r % 4 is 0 or 3, the raw tier first otherwise; the round count must be even, so
each side runs first as often as second, and a drift over the run weighs on both alike),
after one untimed warm-up round; then both drop the round's blocks. GB/s is 10**9 bytes per
second; the report gives medians, min-max, and the ratio of medians (store / raw).
``load_layer_gbps_vs_load`` is the KV store's load_layer rate over its whole-block load rate,
both per byte moved to the caller (median over median; the per-round ratios' median and
spread beside it): 1 when a layer read costs its bytes' share of a block read, ~1/32 when
every layer read reads and checks the whole block.

Thread-safety: one asyncio loop; run as part of the benchmark.
"""

from __future__ import annotations

import asyncio
import shutil
import statistics
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from kvstore import KVBlockStore, ModelFingerprint
from tiers import TieredStore, open_store

__all__ = ["FP_7B", "measure_throughput"]

FP_7B = ModelFingerprint(
    model="bench-mistral-7b-like", dtype="bfloat16", num_layers=32, block_tokens=512,
    num_kv_heads=8, head_dim=128,
)  # fmt: skip
_OPS = ("store", "load", "load_layer")


def random_blocks(count: int, fingerprint: ModelFingerprint, seed: int = 7) -> torch.Tensor:
    """``count`` blocks of random bytes (incompressible; no codec is used here anyway)."""
    words = np.random.default_rng(seed).bit_generator.random_raw(
        count * fingerprint.block_bytes // 8
    )
    raw = torch.from_numpy(words.view(np.uint8))
    return raw.view(fingerprint.torch_dtype).view(count, *fingerprint.block_shape)


async def _timed(action: Callable[[], Awaitable[Any]]) -> float:
    start_s = time.perf_counter()
    await action()
    return time.perf_counter() - start_s


async def measure_throughput(
    work_dir: Path,
    blocks: int,
    rounds: int,
    layers: int,
    fingerprint: ModelFingerprint = FP_7B,
) -> dict[str, Any]:
    """Per-op GB/s of the KV store and of the raw tier over ``rounds`` timed rounds, after
    one untimed warm-up round (the first writes grow fresh extent files); load_layer reads
    ``layers`` layers spread over the model."""
    if rounds < 2 or rounds % 2:
        raise ValueError(f"rounds must be even and >= 2 (ABBA order), got {rounds}")
    picked = list(range(0, fingerprint.num_layers, max(1, fingerprint.num_layers // layers)))
    picked = picked[:layers]
    capacity_bytes = 2 * blocks * fingerprint.block_bytes
    for name in ("kv", "raw"):
        shutil.rmtree(work_dir / name, ignore_errors=True)
    kv = await KVBlockStore.open(
        work_dir / "kv", fingerprint, disk_bytes=capacity_bytes, policy="lru"
    )
    raw = await open_store(
        {"policy": "lru", "tiers": [
            {"kind": "nvme", "capacity": capacity_bytes, "path": str(work_dir / "raw"),
             "create": True},
        ]}
    )  # fmt: skip
    source = random_blocks(blocks, fingerprint)
    into = torch.empty_like(source)
    seconds: dict[str, list[float]] = {f"{side}_{op}": [] for side in ("kv", "raw") for op in _OPS}
    try:
        for round_index in range(-1, rounds):
            hashes = [f"r{round_index}-b{i}".encode() for i in range(blocks)]
            keys = [f"raw/r{round_index}/b{i}" for i in range(blocks)]
            sides = _round_actions(kv, raw, fingerprint, picked, hashes, keys, source, into)
            order = ("kv", "raw") if round_index % 4 in (0, 3) else ("raw", "kv")
            for op in _OPS:
                for side in order:
                    elapsed_s = await _timed(sides[f"{side}_{op}"])
                    if round_index >= 0:
                        seconds[f"{side}_{op}"].append(elapsed_s)
            if not torch.equal(into.view(torch.uint8), source.view(torch.uint8)):
                raise RuntimeError("a loaded block differs from the stored one")
            await kv.evict(hashes)
            await raw.delete_many(keys)
    finally:
        await kv.aclose()
        await raw.aclose()
        for name in ("kv", "raw"):
            shutil.rmtree(work_dir / name, ignore_errors=True)
    total_bytes = blocks * fingerprint.block_bytes
    figures: dict[str, Any] = {
        "fingerprint": (
            f"{fingerprint.num_layers} layers, {fingerprint.num_kv_heads} kv heads x "
            f"{fingerprint.head_dim}, {fingerprint.block_tokens} tokens, {fingerprint.dtype}"
        ),
        "block_bytes": fingerprint.block_bytes,
        "blocks": blocks,
        "rounds": rounds,
        "order": "ABBA: kv first in rounds 0, 3, 4, 7, ...; one untimed warm-up round",
        "bytes_per_op": total_bytes,
        "load_layer_layers": picked,
        "load_layer_bytes_per_op": blocks * len(picked) * fingerprint.layer_bytes,
        "tier": "nvme only (O_DIRECT), write-through, same config for both",
    }
    for name, values in seconds.items():
        moved = figures["load_layer_bytes_per_op"] if name.endswith("layer") else total_bytes
        rates = [moved / s / 1e9 for s in values]
        figures[f"{name}_gbps"] = {
            "median": round(statistics.median(rates), 3),
            "min": round(min(rates), 3),
            "max": round(max(rates), 3),
            "all": [round(r, 3) for r in rates],
        }
    for op in _OPS:
        kv_rate = figures[f"kv_{op}_gbps"]["median"]
        raw_rate = figures[f"raw_{op}_gbps"]["median"]
        figures[f"{op}_gbps_vs_tier"] = round(kv_rate / raw_rate, 3) if raw_rate else None
    layer, whole = figures["kv_load_layer_gbps"], figures["kv_load_gbps"]
    figures["load_layer_gbps_vs_load"] = (
        round(layer["median"] / whole["median"], 3) if whole["median"] else None
    )
    per_round = [a / b for a, b in zip(layer["all"], whole["all"], strict=True) if b]
    figures["load_layer_vs_load_per_round"] = {
        "median": round(statistics.median(per_round), 3) if per_round else None,
        "min": round(min(per_round), 3) if per_round else None,
        "max": round(max(per_round), 3) if per_round else None,
    }
    return figures


def _round_actions(
    kv: KVBlockStore,
    raw: TieredStore,
    fingerprint: ModelFingerprint,
    layers: list[int],
    hashes: list[bytes],
    keys: list[str],
    source: torch.Tensor,
    into: torch.Tensor,
) -> dict[str, Callable[[], Awaitable[Any]]]:
    layer_bytes = fingerprint.layer_bytes
    layer_into = torch.empty((len(hashes), *fingerprint.layer_shape), dtype=source.dtype)

    async def kv_store() -> None:
        if await kv.store(hashes, source) != len(hashes):
            raise RuntimeError("the KV store did not take every block")

    async def raw_store() -> None:
        await raw.put_many({key: source[i] for i, key in enumerate(keys)})

    async def kv_load() -> None:
        if await kv.load(hashes, into) != len(hashes):
            raise RuntimeError("the KV store did not load every block")

    async def raw_load() -> None:
        got = await raw.get_many(keys, into=[into[i] for i in range(len(keys))])
        if any(item is None for item in got):
            raise RuntimeError("the raw tier lost a block")

    async def kv_load_layer() -> None:
        for layer in layers:
            if await kv.load_layer(hashes, layer, layer_into) != len(hashes):
                raise RuntimeError("the KV store did not load every block's layer")

    async def raw_load_layer() -> None:
        for layer in layers:
            span = (layer * layer_bytes, layer_bytes)
            await asyncio.gather(
                *(raw.get(key, into=layer_into[i], byte_range=span) for i, key in enumerate(keys))
            )

    return {
        "kv_store": kv_store,
        "raw_store": raw_store,
        "kv_load": kv_load,
        "raw_load": raw_load,
        "kv_load_layer": kv_load_layer,
        "raw_load_layer": raw_load_layer,
    }
