"""NvmeTier batches against fio: get_many vs randread at QD32, group-committed puts vs fsync'd
writes.

* **get_many**: ``GET_LANES`` (4) loops, each calling ``get_many`` of ``GET_BATCH`` (32)
  uniformly random keys into caller buffers, back to back, on a tier whose engine holds at most
  ``GET_QUEUE_DEPTH`` (32) requests in flight (``batch_tiers``); against ``fio --rw=randread
  --iodepth=32 --direct=1`` at the same block size (4 KiB, 64 KiB) over a file of the same total
  size. So both sides have at most 32 reads in flight: fio keeps 32 going from one job, the tier
  from batches queued behind its full ring (until 2026-11-27: 2 loops on the runtime's engine of
  depth 128, up to 64 in flight, ~40 on average at the device, and each loop idle between its
  slowest read and its next batch). A 4 KiB object is a bare 4 KiB record, so both sides move
  the same bytes per object.
* **puts**: ``put_many`` of ``PUT_BATCH`` 4 KiB objects back to back, and ``PUT_TASKS``
  concurrent single ``put`` loops (group commit: shared fdatasyncs and catalog commits), in
  objects acknowledged durable per second; against ``fio --rw=randwrite --bs=4k --iodepth=1
  --fdatasync=1`` (every write made durable on its own), in writes per second.

The tier and fio take turns figure by figure (get_many then fio at one size, the next size, then
the writes), the one going first alternating by round.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common.fio import fio_command, parse_fio_json
from benchmarks.common.measure import KIB, Config
from tiers.io import IORuntime, aligned_empty
from tiers.nvme import NvmeTier

GET_BATCH = 32
GET_LANES = 4  # batches queued behind the engine's full ring while the others' callers run
GET_QUEUE_DEPTH = 32  # the engine's cap on requests in flight: fio's iodepth
PATHS_LANES = 2  # get_many_rate's default: read_paths' A/Bs (depth 128) as they were defined
GET_SIZES = (4 * KIB, 64 * KIB)
PUT_BATCH = 256
PUT_TASKS = 64
PUT_SIZE = 4 * KIB


@dataclass(frozen=True)
class BatchSample:
    what: str  # "get_many", "fio_randread", "put_many", "puts_concurrent", "fio_fsync_write"
    size_bytes: int
    round_index: int
    per_s: float  # objects (or fio I/Os) per second


@contextlib.asynccontextmanager
async def batch_tiers(
    directory: Path, capacity_bytes: int, runtime: IORuntime
) -> AsyncIterator[tuple[NvmeTier, NvmeTier]]:
    """(the get tier, the put tier) under ``directory``: the gets on a runtime of their own
    whose engine holds at most GET_QUEUE_DEPTH requests in flight, the puts on ``runtime``'s
    engine as before (its depth is not what the put figures compare)."""
    get_runtime = IORuntime(queue_depth=GET_QUEUE_DEPTH)
    try:
        gets = await NvmeTier.open(
            "nvme", capacity_bytes, directory / "gets", runtime=get_runtime, create=True
        )
        try:
            puts = await NvmeTier.open(
                "nvme", capacity_bytes, directory / "puts", runtime=runtime, create=True
            )
            try:
                yield gets, puts
            finally:
                await puts.aclose()
        finally:
            await gets.aclose()
    finally:
        get_runtime.close()


def batch_counts(mode: str) -> dict[int, int]:
    """Objects per get size (the put phase writes its own keys)."""
    if mode == "smoke":
        return {4 * KIB: 256, 64 * KIB: 64}
    if mode == "quick":
        return {4 * KIB: 16384, 64 * KIB: 2048}
    return {4 * KIB: 65536, 64 * KIB: 8192}


async def fill(tier: NvmeTier, counts: dict[int, int]) -> None:
    rng = np.random.default_rng(3)
    for size, count in counts.items():
        src = rng.integers(0, 256, size, dtype=np.uint8)
        for first in range(0, count, 256):
            await tier.put_many({_key(size, i): src for i in range(first, min(count, first + 256))})


def _key(size: int, index: int) -> str:
    return f"b{size}-{index:07d}"


async def get_many_rate(
    tier: NvmeTier, size: int, count: int, seconds: float, seed: int, lanes: int = PATHS_LANES
) -> float:
    """Objects per second of ``lanes`` loops of get_many(GET_BATCH keys) for ``seconds``."""
    keys = [_key(size, i) for i in range(count)]
    done = [0]
    stop = time.perf_counter() + seconds

    async def lane(lane_index: int) -> None:
        rng = np.random.default_rng(seed + lane_index)
        outs = [aligned_empty(size) for _ in range(GET_BATCH)]
        while time.perf_counter() < stop:
            picks = [keys[i] for i in rng.integers(0, count, GET_BATCH).tolist()]
            got = await tier.get_many(picks, into=outs)
            if any(g is None for g in got):
                raise RuntimeError("get_many: a key is missing")
            done[0] += GET_BATCH

    started = time.perf_counter()
    await asyncio.gather(*(lane(i) for i in range(lanes)))
    return done[0] / (time.perf_counter() - started)


async def put_rates(tier: NvmeTier, seconds: float, round_index: int) -> tuple[float, float]:
    """(put_many objects/s, concurrent single puts objects/s), 4 KiB objects, ``seconds`` each."""
    src = np.random.default_rng(round_index).integers(0, 256, PUT_SIZE, dtype=np.uint8)
    keys = [f"p-{i:05d}" for i in range(4096)]
    done = 0
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        first = (done % len(keys)) // PUT_BATCH * PUT_BATCH
        await tier.put_many({key: src for key in keys[first : first + PUT_BATCH]})
        done += PUT_BATCH
    many = done / (time.perf_counter() - started)
    count = [0]
    stop = time.perf_counter() + seconds

    async def putter(task: int) -> None:
        step = 0
        while time.perf_counter() < stop:
            await tier.put(keys[(task * 61 + step) % len(keys)], src)
            step += 1
            count[0] += 1

    started = time.perf_counter()
    await asyncio.gather(*(putter(t) for t in range(PUT_TASKS)))
    return many, count[0] / (time.perf_counter() - started)


def fio_rate(
    fio: str, rw: str, path: Path, size: int, total: int, qd: int, warmup_s: float, seconds: float
) -> float:
    """fio I/Os per second: ``randread`` at ``qd``, or ``randwrite`` with --fdatasync=1."""
    base = "write" if rw == "randwrite" else rw  # Config names no randwrite: set below
    command = list(fio_command(fio, Config(base, size, qd, 1), path, total, seconds, warmup_s))
    if rw == "randwrite":
        command = [arg for arg in command if not arg.startswith("--rw=")]
        command += ["--rw=randwrite", "--fdatasync=1"]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"fio failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    result = parse_fio_json(done.stdout, "write" if rw == "randwrite" else "read")
    return result.total_ios / seconds


async def batch_round(
    get_tier: NvmeTier,
    put_tier: NvmeTier,
    fio: str,
    fio_path: Path,
    put_path: Path,
    counts: dict[int, int],
    round_index: int,
    warmup_s: float,
    seconds: float,
) -> list[BatchSample]:
    samples: list[BatchSample] = []
    first_tier = round_index % 2 == 0

    async def pair(tier_part: Any, fio_part: Any) -> None:
        """One figure of each side, back to back: the device drifts over seconds here (fio
        moved 60-130k IOPS within minutes), so each ratio compares neighbours in time."""
        if first_tier:
            await tier_part()
            await asyncio.to_thread(fio_part)
        else:
            await asyncio.to_thread(fio_part)
            await tier_part()

    for size in GET_SIZES:

        async def gets(size: int = size) -> None:
            n = counts[size]
            await get_many_rate(get_tier, size, n, warmup_s, round_index, GET_LANES)  # warm-up
            rate = await get_many_rate(get_tier, size, n, seconds, 100 + round_index, GET_LANES)
            samples.append(BatchSample("get_many", size, round_index, rate))

        def reads(size: int = size) -> None:
            total = counts[size] * size
            rate = fio_rate(fio, "randread", fio_path, size, total, 32, warmup_s, seconds)
            samples.append(BatchSample("fio_randread", size, round_index, rate))

        await pair(gets, reads)

    async def puts() -> None:
        many, single = await put_rates(put_tier, seconds, round_index)
        samples.append(BatchSample("put_many", PUT_SIZE, round_index, many))
        samples.append(BatchSample("puts_concurrent", PUT_SIZE, round_index, single))

    def writes() -> None:
        rate = fio_rate(fio, "randwrite", put_path, PUT_SIZE, 16 << 20, 1, warmup_s, seconds)
        samples.append(BatchSample("fio_fsync_write", PUT_SIZE, round_index, rate))

    await pair(puts, writes)  # last: fdatasync'd writes must not precede either side's reads
    return samples


def batch_figures(samples: list[BatchSample]) -> dict[str, list[float]]:
    """Per-round ratios and rates, by headline key."""
    by = {(s.what, s.size_bytes, s.round_index): s.per_s for s in samples}
    rounds = sorted({s.round_index for s in samples})
    out: dict[str, list[float]] = {}
    for size, label in ((4 * KIB, "4k"), (64 * KIB, "64k")):
        out[f"nvme_get_many_vs_fio_{label}"] = [
            by[("get_many", size, r)] / by[("fio_randread", size, r)] for r in rounds
        ]
    out["nvme_put_many_objects_per_s_4k"] = [by[("put_many", PUT_SIZE, r)] for r in rounds]
    out["nvme_concurrent_puts_per_s_4k"] = [by[("puts_concurrent", PUT_SIZE, r)] for r in rounds]
    out["fio_fsync_writes_per_s_4k"] = [by[("fio_fsync_write", PUT_SIZE, r)] for r in rounds]
    out["nvme_put_many_vs_fio_fsync_4k"] = [
        by[("put_many", PUT_SIZE, r)] / by[("fio_fsync_write", PUT_SIZE, r)] for r in rounds
    ]
    out["nvme_concurrent_puts_vs_fio_fsync_4k"] = [
        by[("puts_concurrent", PUT_SIZE, r)] / by[("fio_fsync_write", PUT_SIZE, r)] for r in rounds
    ]
    return out
