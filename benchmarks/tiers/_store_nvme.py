"""NvmeTier puts and gets at queue depth QD against fio at the same size and depth.

Per size the tier holds ``count`` objects (``count x size`` bytes in all); fio reads a file of
pseudo-random data, limited with ``--size`` to the same total. Puts overwrite every object once per
round, QD at a time (QD tasks pulling keys from one list; each put is write + fdatasync + catalog
commit). Gets run for a fixed time after a warm-up: QD tasks each loop ``get(key, into=buffer)``
over uniformly random keys, so QD gets are in flight at every moment, as with fio's ``iodepth``.
Both sides use O_DIRECT, so the page cache stays cold. The reference for puts is fio sequential
writes with ``--fdatasync=1`` (every write made durable) over the same file, run just before fio's
randread. The tier and fio take turns, the one going first alternating by round. fio's latencies
are its total latency (``--lat_percentiles=1``).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from pathlib import Path

import numpy as np

from benchmarks.common.fio import fio_command, parse_fio_json
from benchmarks.common.measure import KIB, MIB, Config
from benchmarks.tiers._store_memory import SIZES, OpSample, summarize
from tiers.io import aligned_empty
from tiers.nvme import NvmeTier

QD = 16


def object_counts(mode: str) -> dict[int, int]:
    """Objects per size: 2 MiB / 32 MiB / 128 MiB / 256 MiB quick, 8x-4x that in full mode;
    ``smoke`` (the test suite's) a few of each, 32 MiB at most."""
    if mode == "smoke":
        return {4 * KIB: 16, 64 * KIB: 16, MIB: 4, 16 * MIB: 2}
    if mode == "quick":
        return {4 * KIB: 512, 64 * KIB: 512, MIB: 128, 16 * MIB: 16}
    return {4 * KIB: 4096, 64 * KIB: 2048, MIB: 512, 16 * MIB: 64}


def nvme_key(size: int, index: int) -> str:
    return f"s{size}-{index:06d}"


async def timed_puts(tier: NvmeTier, size: int, count: int, src: np.ndarray, qd: int) -> tuple:
    """Put (or overwrite) every object, qd at a time; (elapsed s, per-put latencies in ns)."""
    pending = iter(range(count))
    lat: list[int] = []
    clock = time.perf_counter_ns

    async def worker() -> None:
        for index in pending:
            start = clock()
            await tier.put(nvme_key(size, index), src)
            lat.append(clock() - start)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(qd)))
    return time.perf_counter() - started, lat


async def timed_gets(
    tier: NvmeTier, size: int, count: int, qd: int, warmup_s: float, duration_s: float, seed: int
) -> tuple[float, list[int]]:
    """qd looping readers for warmup_s + duration_s; (window s, latencies of gets in the window)."""
    state = {"measure": False, "stop": False}
    lat: list[int] = []
    clock = time.perf_counter_ns
    keys = [nvme_key(size, i) for i in range(count)]

    async def worker(lane: int) -> None:
        picks = np.random.default_rng(seed + lane).integers(0, count, 8192).tolist()
        into = aligned_empty(size)
        step = 0
        while not state["stop"]:
            key = keys[picks[step & 8191]]
            step += 1
            start = clock()
            if await tier.get(key, into=into) is None:
                raise RuntimeError(f"nvme: {key} is missing")
            if state["measure"]:
                lat.append(clock() - start)

    tasks = [asyncio.create_task(worker(lane)) for lane in range(qd)]
    try:
        await _run_for(tasks, warmup_s)
        state["measure"] = True
        started = time.perf_counter()
        await _run_for(tasks, duration_s)
        while not lat and not any(task.done() for task in tasks):  # a window shorter than a get
            await _run_for(tasks, duration_s)
        window_s = time.perf_counter() - started
        state["measure"] = False
    finally:
        state["stop"] = True
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome
    return window_s, lat


async def _run_for(tasks: list[asyncio.Task[None]], seconds: float) -> None:
    done, _ = await asyncio.wait(tasks, timeout=seconds, return_when=asyncio.FIRST_EXCEPTION)
    for task in done:
        task.result()
    if done:
        raise RuntimeError("a reader stopped early")


def fio_run(
    fio: str,
    rw: str,
    path: Path,
    size: int,
    total_bytes: int,
    qd: int,
    warmup_s: float,
    duration_s: float,
    round_index: int,
) -> OpSample:
    """fio io_uring O_DIRECT over the file's first ``total_bytes``: ``randread``, or ``write``
    (sequential, ``--fdatasync=1``: each write made durable, as a put is) at ``size`` and ``qd``."""
    cfg = Config(rw, size, qd, 1)
    command = [*fio_command(fio, cfg, path, total_bytes, duration_s, warmup_s)]
    command.append("--lat_percentiles=1")
    if rw == "write":
        command.append("--fdatasync=1")
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"fio failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    direction = "write" if rw == "write" else "read"
    result = parse_fio_json(done.stdout, direction)
    job = json.loads(done.stdout[done.stdout.find("{") :])["jobs"][0][direction]
    pct = job["lat_ns"]["percentile"]
    return OpSample(
        "fio",
        rw,
        size,
        round_index,
        result.bandwidth_bytes_per_s / 1e9,
        float(pct["50.000000"]) / 1e3,
        float(pct["99.000000"]) / 1e3,
        result.total_ios,
    )


async def nvme_round(
    tier: NvmeTier,
    fio: str,
    fio_path: Path,
    counts: dict[int, int],
    round_index: int,
    warmup_s: float,
    duration_s: float,
) -> list[OpSample]:
    """Puts, then gets and fio back to back (order alternating by round), for every size."""
    samples: list[OpSample] = []
    rng = np.random.default_rng(100 + round_index)
    for size in SIZES:
        count = counts[size]
        src = rng.integers(0, 256, size, dtype=np.uint8)
        elapsed, lat = await timed_puts(tier, size, count, src, QD)
        samples.append(
            summarize("nvme", "put", size, round_index, lat, count * size / elapsed / 1e9)
        )

        async def tier_side(size: int = size, count: int = count) -> list[OpSample]:
            src = rng.integers(0, 256, size, dtype=np.uint8)
            elapsed, lat = await timed_puts(tier, size, count, src, QD)
            put = summarize("nvme", "put", size, round_index, lat, count * size / elapsed / 1e9)
            seed = 1000 * round_index + size
            window_s, lat = await timed_gets(tier, size, count, QD, warmup_s, duration_s, seed)
            gbps = len(lat) * size / window_s / 1e9
            return [put, summarize("nvme", "get", size, round_index, lat, gbps)]

        def fio_side(size: int = size, count: int = count) -> list[OpSample]:
            args = (fio_path, size, count * size, QD, warmup_s, duration_s, round_index)
            return [fio_run(fio, "write", *args), fio_run(fio, "randread", *args)]

        if round_index % 2 == 0:
            samples += await tier_side() + fio_side()
        else:
            samples += fio_side() + await tier_side()
    return samples
