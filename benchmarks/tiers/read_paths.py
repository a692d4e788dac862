"""In-process A/B of NvmeTier's read paths, back to back in one process, beside fio (issue 13).

Two questions the store benchmark (benchmarks.tiers.store) cannot answer alone, because its
rounds move with the machine as much as with the code:

1. **get_many's planner** at 4 and 64 KiB: the compiled planner (tiers.nvme.whole_reads) vs the
   general one (tiers.nvme.batch_reads), each as ``_store_batch.get_many_rate`` drives it (2
   lanes of ``get_many(32)`` into page-aligned buffers), alternating which goes first per round,
   with fio randread at iodepth 32 over a file of the same size in the same round. Reports
   objects/s, the ratio to fio and CPU microseconds per object (``process_time``).
2. **single gets on the Zipf store load** (``_store_lru_peer``: 8 tasks, 64 KiB objects, DRAM
   10%, the best-hit policy "lfu"): a whole bare record read as the engine's own single request
   (tiers.nvme.single_reads) vs the gathered ``read_many`` path, against the naive LRU of the
   same round.

The paths are switched by the tier's own switches, read per batch and per tier start:
``TIERKIT_GET_MANY_COMPILED=0`` (the general planner), ``TIERKIT_NVME_SINGLE_GETS=0`` (every
single get gathered).

    flock /tmp/tierkit-bench.lock .venv/bin/python -m benchmarks.tiers.read_paths --rounds 4

The last output line is one JSON object: per path, the median (and min-max) of each figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import benchmarks.tiers._store_lru_peer as peer
from benchmarks.common.fio import ensure_fio
from benchmarks.common.measure import KIB, MIB, code_version, ensure_data_file, median
from benchmarks.common.paths import OUT_DIR
from benchmarks.tiers._store_batch import fill, fio_rate, get_many_rate
from tiers.io import IORuntime
from tiers.nvme import NvmeTier

COUNTS = {4 * KIB: 16384, 64 * KIB: 2048}  # as _store_batch.batch_counts("quick")
SMOKE_COUNTS = {4 * KIB: 256, 64 * KIB: 64}
PLANNER_ENV = "TIERKIT_GET_MANY_COMPILED"  # tiers.nvme.whole_reads.DISABLE_ENV
SINGLES_ENV = "TIERKIT_NVME_SINGLE_GETS"  # tiers.nvme.nvme_tier.SINGLE_GETS_ENV


def _switch(name: str, on: bool) -> None:
    os.environ[name] = "1" if on else "0"


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


async def _planners(args: argparse.Namespace, directory: Path, out: dict[str, list]) -> None:
    counts, rounds, seconds = SMOKE_COUNTS if args.smoke else COUNTS, args.rounds, args.seconds
    fio = ensure_fio()
    fio_path = directory / "fio.dat"
    ensure_data_file(fio_path, max(s * n for s, n in counts.items()))
    runtime = IORuntime()
    tier = await NvmeTier.open("nvme", 600 * MIB, directory / "tier", runtime=runtime, create=True)
    try:
        await fill(tier, counts)
        for r in range(rounds):
            for size, count in counts.items():
                label = f"{size // KIB}k"
                fio_per_s = await asyncio.to_thread(
                    fio_rate, fio, "randread", fio_path, size, count * size, 32, 0.25, seconds
                )
                out[f"fio_{label}"].append(fio_per_s)
                for path in ("compiled", "general")[:: 1 if r % 2 == 0 else -1]:
                    _switch(PLANNER_ENV, path == "compiled")
                    await get_many_rate(tier, size, count, 0.25, r)  # warm-up
                    cpu = time.process_time()
                    rate = await get_many_rate(tier, size, count, seconds, 100 + r)
                    cpu_us = (time.process_time() - cpu) / (rate * seconds) * 1e6
                    out[f"{path}_{label}_vs_fio"].append(rate / fio_per_s)
                    out[f"{path}_{label}_cpu_us"].append(cpu_us)
                    _log(
                        f"[round {r + 1}] {label} {path:>8}: {rate:9,.0f}/s "
                        f"({rate / fio_per_s:.3f} of fio {fio_per_s:,.0f}), {cpu_us:.1f} us "
                        f"CPU/object, load1 {os.getloadavg()[0]:.1f}"
                    )
    finally:
        os.environ.pop(PLANNER_ENV, None)
        await tier.aclose()
        runtime.close()


async def _singles(args: argparse.Namespace, directory: Path, out: dict[str, list]) -> None:
    work, rounds = peer.peer_work("smoke" if args.smoke else "quick"), args.rounds
    runtime = IORuntime()
    try:
        await peer.populate_peer(directory, work, runtime)
        await peer.store_gets_per_s(directory, work, "lfu", runtime)  # one-offs (JIT), unrecorded
        for r in range(rounds):
            naive, _ = await asyncio.to_thread(peer.naive_gets_per_s, directory, work)
            for path in ("single", "gathered")[:: 1 if r % 2 == 0 else -1]:
                _switch(SINGLES_ENV, path == "single")  # read when the store opens its tier
                cpu = time.process_time()
                rate, hit = await peer.store_gets_per_s(directory, work, "lfu", runtime)
                cpu_us = (time.process_time() - cpu) / len(work.trace) * 1e6
                out[f"zipf_{path}_vs_naive"].append(rate / naive)
                out[f"zipf_{path}_cpu_us"].append(cpu_us)
                _log(
                    f"[round {r + 1}] zipf {path:>8}: {rate:8,.0f} gets/s ({rate / naive:.3f} "
                    f"of naive {naive:,.0f}), hit {hit:.3f}, {cpu_us:.0f} us CPU/get, load1 "
                    f"{os.getloadavg()[0]:.1f}"
                )
    finally:
        os.environ.pop(SINGLES_ENV, None)
        runtime.close()


async def _main(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, list] = {}
    for key in ("fio_4k", "fio_64k"):
        out[key] = []
    for path in ("compiled", "general"):
        for label in ("4k", "64k"):
            out[f"{path}_{label}_vs_fio"], out[f"{path}_{label}_cpu_us"] = [], []
    for path in ("single", "gathered"):
        out[f"zipf_{path}_vs_naive"], out[f"zipf_{path}_cpu_us"] = [], []
    directory = args.dir / "tiers_read_paths"
    shutil.rmtree(directory, ignore_errors=True)
    try:
        if "planners" in args.parts:
            await _planners(args, directory / "planners", out)
        if "singles" in args.parts:
            await _singles(args, directory / "singles", out)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return {
        key: {"median": round(median(v), 3), "min": round(min(v), 3), "max": round(max(v), 3)}
        for key, v in out.items()
        if v
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="NvmeTier read paths, A/B in one process")
    parser.add_argument("--rounds", type=int, default=4, help="rounds (even: each path leads)")
    parser.add_argument("--seconds", type=float, default=1.5, help="per get_many measurement")
    parser.add_argument("--parts", default="planners,singles", help="planners, singles")
    parser.add_argument("--dir", type=Path, default=OUT_DIR, help="where the files live")
    parser.add_argument("--smoke", action="store_true", help=argparse.SUPPRESS)  # tests only
    args = parser.parse_args(argv)
    version = code_version()
    _log(f"tiers code: {version}")
    figures = asyncio.run(_main(args))
    figures["code"] = version
    print(json.dumps(figures), flush=True)


if __name__ == "__main__":
    main()
