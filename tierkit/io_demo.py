"""The I/O-core part of ``tierkit demo``: one real file, written and then read at random.

It writes the file with sequential 1 MiB O_DIRECT writes, fsyncs it and drops it from the page
cache, then reads random 4 KiB blocks with O_DIRECT at queue depth 32 (4 lanes of 8) for a few
seconds, and checks the last batch of every lane byte for byte against ``os.pread``.
"""

from __future__ import annotations

import asyncio
import os
import resource
import time
from typing import Any

import numpy as np

from tierkit.tables import table
from tiers import IOEngine, aligned_empty

__all__ = ["run_io_demo"]

MIB = 1 << 20
BLOCK_BYTES = 4096
LANES = 4


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _write(engine: IOEngine, path: str, size_mib: int) -> float:
    """Bytes per second of the sequential write, fsync included."""
    file = await engine.open(path, create=True, truncate=True, direct=True)
    chunk = aligned_empty(8 * MIB)
    chunk[:] = np.random.default_rng(1).integers(0, 256, chunk.size, dtype=np.uint8)
    start = time.perf_counter()
    for base in range(0, size_mib, 8):
        count = min(8, size_mib - base)
        offsets = (np.arange(count) + base) * MIB
        chunk[:8] = np.frombuffer(base.to_bytes(8, "little"), np.uint8)  # distinct chunks
        await engine.write_batch(file, chunk, offsets, MIB)
    await engine.fsync(file)
    elapsed = time.perf_counter() - start
    engine.env.drop_cache(file.fd)
    await engine.close_file(file)
    return size_mib * MIB / elapsed


async def _random_reads(
    engine: IOEngine, path: str, size_mib: int, duration_s: float, queue_depth: int
) -> dict[str, Any]:
    file = await engine.open(path, direct=True)
    blocks = size_mib * MIB // BLOCK_BYTES
    per_lane = queue_depth // LANES
    buffers = [aligned_empty(per_lane * BLOCK_BYTES) for _ in range(LANES)]
    last: list[np.ndarray] = [np.zeros(0, np.int64)] * LANES
    deadline = time.perf_counter() + duration_s
    count = 0

    async def lane(index: int) -> None:
        nonlocal count
        rng = np.random.default_rng(index)
        while True:  # at least one batch per lane, however short the duration
            offsets = rng.integers(0, blocks, per_lane) * BLOCK_BYTES
            results = await engine.read_batch(file, buffers[index], offsets, BLOCK_BYTES)
            if not (results == BLOCK_BYTES).all():
                raise RuntimeError(f"short read: {results}")
            last[index] = offsets
            count += per_lane
            if time.perf_counter() >= deadline:
                return

    cpu0, t0 = _cpu_s(), time.perf_counter()
    await asyncio.gather(*(lane(i) for i in range(LANES)))
    cpu, elapsed = _cpu_s() - cpu0, time.perf_counter() - t0
    await engine.close_file(file)
    return {
        "iops": count / elapsed,
        "cpu_us_per_io": cpu / count * 1e6,
        "verified_reads": _verify(path, buffers, last),
    }


def _verify(path: str, buffers: list[np.ndarray], last: list[np.ndarray]) -> int:
    """The last batch of every lane, byte for byte against ``os.pread``; returns the count."""
    fd = os.open(path, os.O_RDONLY)
    try:
        for buffer, offsets in zip(buffers, last, strict=True):
            for i, offset in enumerate(offsets.tolist()):
                got = buffer[i * BLOCK_BYTES : (i + 1) * BLOCK_BYTES].tobytes()
                if got != os.pread(fd, BLOCK_BYTES, offset):
                    raise RuntimeError(f"the block at {offset} came back wrong")
    finally:
        os.close(fd)
    return sum(len(offsets) for offsets in last)


async def run_io_demo(
    engine: IOEngine, directory: str, size_mib: int, duration_s: float, steps: tuple[str, str]
) -> dict[str, Any]:
    """Writes and reads ``<directory>/demo.tkdemo``; prints each phase as it starts (prefixed
    by its label in ``steps``), then a table. Returns the summary's figures."""
    path = os.path.join(directory, "demo.tkdemo")
    qd = engine.queue_depth
    print(f"{steps[0]} I/O core: writing a {size_mib:,} MiB file with 1 MiB O_DIRECT writes...")
    write_bps = await _write(engine, path, size_mib)
    print(f"{steps[1]} I/O core: random 4 KiB O_DIRECT reads at queue depth {qd}, {duration_s:g} s")
    reads = await _random_reads(engine, path, size_mib, duration_s, qd)
    stats = engine.stats()
    rows = [
        ("sequential 1 MiB writes + fsync", f"{write_bps / MIB:,.0f} MiB/s", "-"),
        (
            f"random 4 KiB reads, QD {qd}, cold cache",
            f"{reads['iops']:,.0f} IOPS ({reads['iops'] * BLOCK_BYTES / MIB:,.0f} MiB/s)",
            f"{reads['cpu_us_per_io']:.1f} us",
        ),
    ]
    title = f"\nI/O core: {engine.name} engine, O_DIRECT, a {size_mib:,} MiB file"
    print(table(title, ("workload", "rate", "CPU per I/O"), rows))
    print(f"  {reads['verified_reads']} of the reads checked byte for byte against os.pread")
    print(
        f"  engine counters: {stats['batches']:,} batches, {stats['requests']:,} requests, "
        f"{stats['errors']} errors, {stats['short_transfers_resumed']} short transfers resumed\n"
    )
    return {
        "engine": engine.name,
        "write_mib_s": round(write_bps / MIB, 1),
        "read_iops_4k_qd32": round(reads["iops"]),
        "cpu_us_per_io_4k": round(reads["cpu_us_per_io"], 2),
    }
