"""The demo behind ``tierkit demo``: the I/O core and the tiered store on real files, measured.

It writes a file with sequential 1 MiB O_DIRECT writes, fsyncs it, drops it from the page cache,
then reads random 4 KiB blocks with O_DIRECT at queue depth 32 for a few seconds, verifies a
sample byte for byte against ``os.pread``, and reports what it measured.
"""

from __future__ import annotations

import asyncio
import os
import resource
import shutil
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from tierkit.store_demo import run_store_demo
from tierkit.vectordb_demo import run_vectordb_demo
from tiers import IOEngine, aligned_empty, create_engine

__all__ = ["DemoOptions", "run_demo"]

MIB = 1 << 20


@dataclass(frozen=True, slots=True)
class DemoOptions:
    directory: str = ".tierkit-demo"
    size_mib: int = 256
    duration_s: float = 2.0
    engine: str | None = None
    keep: bool = False
    queue_depth: int = 32


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _write(engine: IOEngine, path: str, size_mib: int) -> float:
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


async def _random_reads(engine: IOEngine, path: str, options: DemoOptions) -> dict[str, Any]:
    file = await engine.open(path, direct=True)
    blocks = options.size_mib * MIB // 4096
    lanes, per_lane = 4, options.queue_depth // 4
    buffers = [aligned_empty(per_lane * 4096) for _ in range(lanes)]
    last: list[np.ndarray] = [np.zeros(0, np.int64)] * lanes
    deadline = time.perf_counter() + options.duration_s
    count = 0

    async def lane(index: int) -> None:
        nonlocal count
        rng = np.random.default_rng(index)
        while time.perf_counter() < deadline:
            offsets = rng.integers(0, blocks, per_lane) * 4096
            results = await engine.read_batch(file, buffers[index], offsets, 4096)
            if not (results == 4096).all():
                raise RuntimeError(f"short read: {results}")
            last[index] = offsets
            count += per_lane

    cpu0, t0 = _cpu_s(), time.perf_counter()
    await asyncio.gather(*(lane(i) for i in range(lanes)))
    cpu, elapsed = _cpu_s() - cpu0, time.perf_counter() - t0
    fd = os.open(path, os.O_RDONLY)
    try:  # the last batch of every lane, byte for byte against os.pread
        for buffer, offsets in zip(buffers, last, strict=True):
            for i, off in enumerate(offsets.tolist()):
                assert buffer[i * 4096 : (i + 1) * 4096].tobytes() == os.pread(fd, 4096, off)
    finally:
        os.close(fd)
    await engine.close_file(file)
    return {
        "iops": count / elapsed,
        "cpu_us_per_io": cpu / count * 1e6,
        "verified_reads": sum(len(o) for o in last),
    }


async def run_demo(options: DemoOptions) -> dict[str, Any]:
    os.makedirs(options.directory, exist_ok=True)
    path = os.path.join(options.directory, "demo.tkdemo")
    engine = create_engine(options.engine, queue_depth=options.queue_depth)
    print(f"engine: {engine.name} (queue depth {engine.queue_depth}), file: {path}")
    try:
        write_bps = await _write(engine, path, options.size_mib)
        print(f"sequential 1 MiB O_DIRECT writes + fsync: {write_bps / MIB:,.0f} MiB/s")
        reads = await _random_reads(engine, path, options)
        print(
            f"random 4 KiB O_DIRECT reads, QD {options.queue_depth}, cold cache: "
            f"{reads['iops']:,.0f} IOPS ({reads['iops'] * 4096 / MIB:,.0f} MiB/s), "
            f"{reads['cpu_us_per_io']:.1f} CPU-us per I/O; "
            f"{reads['verified_reads']} reads verified against os.pread"
        )
        stats = engine.stats()
        print(f"engine counters: {stats}")
        await engine.aclose()
        store = await run_store_demo(options.directory)
        vectors = await run_vectordb_demo(options.directory)
    finally:
        await engine.aclose()
        if not options.keep:
            shutil.rmtree(options.directory, ignore_errors=True)
    return {
        "engine": engine.name,
        "write_mib_s": round(write_bps / MIB, 1),
        "read_iops_4k_qd32": round(reads["iops"]),
        "cpu_us_per_io_4k": round(reads["cpu_us_per_io"], 2),
        **store,
        **vectors,
    }
