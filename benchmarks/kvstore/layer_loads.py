"""Why one layer of many blocks reads slower per byte than whole blocks: a diagnostic.

On one KVBlockStore (NVMe tier only, O_DIRECT, 64 MiB blocks of ``FP_7B``) holding ``blocks``
blocks, each round times, in rotating order: a whole-block ``load`` of all of them; a layer of
all of them through ``KVBlockStore.load_layer``; the same layer through one gathered tiered-store
``get(byte_range=...)`` per block (the way ``load_layer`` read before: each get becomes its own
record read, staged in a bounce buffer and copied out); and through the NVMe tier's
``get_many(byte_ranges=...)`` (one submission planned over arrays, in place where the
destination is page-aligned). Reports GB/s of bytes delivered, median (min-max), and, with
``--profile``, the top of a cProfile of ``load_layer`` calls.

    flock /tmp/tierkit-bench.lock .venv/bin/python -m benchmarks.kvstore.layer_loads [--profile]

The last line is one JSON object. Thread-safety: one asyncio loop; a script.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import json
import pstats
import shutil
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import torch

from benchmarks.common.paths import OUT_DIR
from benchmarks.kvstore.throughput import FP_7B, random_blocks
from kvstore import KVBlockStore


async def measure(work: Path, blocks: int, rounds: int, profile: bool) -> dict[str, Any]:
    fp = FP_7B
    shutil.rmtree(work, ignore_errors=True)
    store = await KVBlockStore.open(
        work, fp, disk_bytes=KVBlockStore.disk_bytes_for(blocks, fp.block_bytes), policy="lru"
    )
    try:
        source = random_blocks(blocks, fp)
        whole = torch.empty_like(source)
        layer_into = torch.empty((blocks, *fp.layer_shape), dtype=source.dtype)
        hashes = [f"layer-loads-{i}".encode() for i in range(blocks)]
        if await store.store(hashes, source) != blocks:
            raise RuntimeError("the store refused blocks")
        keys = [store._index.blocks[h].key for h in hashes]
        tiered = store._store
        nvme = tiered.tiers[-1]

        def span(layer: int) -> tuple[int, int]:
            return (layer * fp.layer_bytes, fp.layer_bytes)

        async def load(layer: int) -> None:
            await store.load(hashes, whole)

        async def load_layer(layer: int) -> None:
            await store.load_layer(hashes, layer, layer_into)

        async def gathered_gets(layer: int) -> None:
            await asyncio.gather(
                *(tiered.get(k, into=layer_into[i], byte_range=span(layer))
                  for i, k in enumerate(keys))
            )  # fmt: skip

        async def tier_get_many(layer: int) -> None:
            await nvme.get_many(  # type: ignore[call-arg]
                keys, [layer_into[i] for i in range(blocks)], byte_ranges=[span(layer)] * blocks
            )

        ways: dict[str, Callable[[int], Awaitable[None]]] = {
            "load": load, "load_layer": load_layer, "gathered_gets": gathered_gets,
            "tier_get_many": tier_get_many,
        }  # fmt: skip
        seconds: dict[str, list[float]] = {name: [] for name in ways}
        names = list(ways)
        for round_index in range(-1, rounds):  # round -1: warm-up, untimed
            shift = round_index % len(names)
            for name in names[shift:] + names[:shift]:
                layer = (7 * round_index + 3) % fp.num_layers
                start_s = time.perf_counter()
                await ways[name](layer)
                if round_index >= 0:
                    seconds[name].append(time.perf_counter() - start_s)
                if name != "load" and not torch.equal(  # bytes: random bf16 holds NaNs
                    layer_into.view(torch.uint8), source[:, layer].contiguous().view(torch.uint8)
                ):
                    raise RuntimeError(f"{name} read the wrong bytes")
        figures: dict[str, Any] = {
            "blocks": blocks, "rounds": rounds, "block_bytes": fp.block_bytes,
        }  # fmt: skip
        for name, values in seconds.items():
            moved = blocks * (fp.block_bytes if name == "load" else fp.layer_bytes)
            rates = sorted(moved / s / 1e9 for s in values)
            figures[f"{name}_gbps"] = {
                "median": round(statistics.median(rates), 3),
                "min": round(rates[0], 3), "max": round(rates[-1], 3),
            }  # fmt: skip
            figures[f"{name}_ms_median"] = round(1e3 * statistics.median(values), 2)
        if profile:
            profiler = cProfile.Profile()
            profiler.enable()
            for layer in range(fp.num_layers):
                await store.load_layer(hashes, layer, layer_into)
            profiler.disable()
            text = io.StringIO()
            pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(12)
            figures["profile_top"] = text.getvalue()
        return figures
    finally:
        await store.aclose()
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=16)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--out", type=Path, default=OUT_DIR / "kvstore" / "layer-loads")
    args = parser.parse_args(argv)
    figures = asyncio.run(measure(args.out, args.blocks, args.rounds, args.profile))
    if "profile_top" in figures:
        print(figures.pop("profile_top"))
    for name in ("load", "load_layer", "gathered_gets", "tier_get_many"):
        rate = figures[f"{name}_gbps"]
        print(f"{name}: {rate['median']:.3f} GB/s ({rate['min']:.3f}-{rate['max']:.3f}), "
              f"{figures[f'{name}_ms_median']} ms a call")  # fmt: skip
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
