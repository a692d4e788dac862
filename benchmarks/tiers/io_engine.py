"""Benchmark the tierkit I/O engines against fio and aiofiles on O_DIRECT file I/O (issue 2).

What it measures, on one data file written with real pseudo-random data (not fallocate):
random 4 KiB and 128 KiB reads at queue depth 1, 32 and 128, and sequential 1 MiB reads and
writes at queue depth 32 (writes go to a second file of the same size, so the read file stays
intact), all O_DIRECT, for four paths:

* ``fio``      -- fio 3.x, ``--ioengine=io_uring --direct=1``: the reference;
* ``uring``    -- ``tiers.UringEngine(queue_depth=QD)``;
* ``thread``   -- ``tiers.ThreadEngine(queue_depth=QD)``;
* ``aiofiles`` -- QD asyncio tasks, each with its own ``aiofiles.open(..., buffering=0)`` adding
  O_DIRECT, one awaited ``seek`` + ``readinto`` (or ``write``) per I/O.

How the engines hold QD requests in flight (``--drive``):

* ``stream`` (default; what fio's ``iodepth`` does): the engine is created with
  ``queue_depth=QD`` and two tasks keep long batches (256 requests) queued on it; the engine
  refills a slot the moment a request completes, so exactly QD stay in flight. Destinations
  cycle through a ring of 4xQD slots per task (a benchmark shortcut: the bytes are not used).
* ``lanes``: asyncio tasks each looping ``read_batch``/``write_batch`` of QD/lanes requests
  (QD1: 1x1, QD32: 4x8, QD128: 8x16): measures the per-call cost of small batches.
* ``tasks``: QD asyncio tasks, each awaiting one ``read_into`` (or ``write_from``) of one block
  at a time, as most callers write it: the engine alone must gather them.

Per round,
per config, every path runs in turn for the same duration, so device noise hits all alike; the
report gives medians with min-max spread, the median of per-round ratios to fio (and uring vs
aiofiles), CPU microseconds per I/O (getrusage of this process, engine threads included; fio's
from its JSON), PASS/MISS against the issue's targets, and, as the last line, one JSON object.

Quick check (1 GiB file, 2 rounds of 1.5 s runs, random rows 4k QD1/32/128 and 128k QD32/128
only; about 75 s here plus a few seconds to write the file)::

    .venv/bin/python -m benchmarks.tiers.io_engine --quick

The quick run also runs the tasks drive at 4 KiB QD32 for both engines in every round (paths
``uring_tasks`` and ``thread_tasks``, beside the same round's fio), whatever ``--drive`` says,
on asyncio's own loop (what ``asyncio.run`` gives a user), and ``uring_tasks_uvloop``: the same
on uvloop's loop (a dependency; the loop tierkit's server runs on), to show what the loop costs.
``--configs 4k_qd32 --paths fio,uring,uring_tasks`` runs only those rows (for iterating).

Full mode (4 GiB file, 5 rounds of 5 s runs, about 15-20 minutes)::

    .venv/bin/python -m benchmarks.tiers.io_engine

The data files (1 or 4 GiB each, under benchmarks/out/) are removed when the run ends, however
it ends; ``--keep-data`` keeps them, and a later run reuses them.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiofiles
import numpy as np

try:
    import uvloop
except ImportError:  # a main dependency, but not on every platform
    uvloop = None

from benchmarks.common.fio import ensure_fio, run_fio
from benchmarks.common.measure import (
    FULL_CONFIGS,
    GIB,
    MIB,
    QUICK_CONFIGS,
    Config,
    Meter,
    RandomOffsets,
    Sample,
    SequentialOffsets,
    Window,
    code_version,
    ensure_data_file,
    machine_string,
    measure_window,
)
from benchmarks.common.paths import OUT_DIR
from benchmarks.common.scratch import remove_at_exit
from benchmarks.tiers._io_report import headline, print_report
from tiers.io import IOEngine, ThreadEngine, UringEngine, aligned_empty

PATHS = ("fio", "uring", "thread", "aiofiles")
# the tasks drive, beside any --drive (quick); "uring_tasks_uvloop": the same on uvloop's loop
TASKS_PATHS = ("uring_tasks", "thread_tasks", "uring_tasks_uvloop")
RANDOM_CYCLE = 4096  # RandomOffsets' rows: ``take`` walks the same 4096 offsets in a cycle
TASKS_KEY = "4k_qd32"
DEFAULT_DIR = OUT_DIR


@dataclass(frozen=True)
class Run:
    """Everything one timed run needs besides the path and the config."""

    read_path: Path
    write_path: Path
    size_bytes: int
    duration_s: float
    warmup_s: float
    drive: str
    fio: str

    def target(self, cfg: Config) -> Path:
        return self.write_path if cfg.is_write else self.read_path


def _offset_sources(cfg: Config, size_bytes: int, seed: int, count: int, batch: int) -> list[Any]:
    """One offset source per worker: independent random streams, or one shared sequential cursor."""
    if cfg.is_random:
        return [
            RandomOffsets(seed + i, size_bytes, cfg.block_size_bytes, batch) for i in range(count)
        ]
    return [SequentialOffsets(size_bytes, cfg.block_size_bytes, batch)] * count


def _filled_buffer(size_bytes: int) -> np.ndarray:
    buffer = aligned_empty(size_bytes)
    buffer[:] = 0x5A  # what the write configs write; reads overwrite it
    return buffer


# ---------------------------------------------------------------------- tierkit engines
STREAM_BATCH = 256  # requests per read_batch call in the "stream" drive


async def _engine_lane(
    engine: IOEngine, file: Any, cfg: Config, offsets: Any, meter: Meter, batch: int
) -> None:
    size = cfg.block_size_bytes
    slots = min(batch, 4 * cfg.queue_depth)
    buffer = _filled_buffer(slots * size)
    ring = (np.arange(batch, dtype=np.int64) % slots) * size if slots < batch else None
    lengths = np.full(batch, size, np.int64) if ring is not None else size
    transfer = engine.write_batch if cfg.is_write else engine.read_batch
    while not meter.stop:
        moved = await transfer(file, buffer, offsets.take(), lengths, ring)
        if moved.min() != size or moved.max() != size:
            raise RuntimeError(f"{engine.name}: short transfer {moved.tolist()} (want {size})")
        meter.ios += len(moved)


def _offset_stream(cfg: Config, offsets: Any) -> Iterator[int]:
    """One worker's offsets, one I/O at a time. Random ones are drawn up front (the cycle
    ``take`` walks anyway), so a worker pays a list step per I/O rather than a numpy row
    view and scalar (~0.4 us), as fio draws its offsets in C; a sequential cursor is shared
    by the workers, so it is still asked per I/O."""
    if cfg.is_random:
        return itertools.cycle([int(offsets.take()[0]) for _ in range(RANDOM_CYCLE)])
    return iter(lambda: int(offsets.take()[0]), -1)


async def _engine_task(
    engine: IOEngine, file: Any, cfg: Config, offsets: Any, meter: Meter
) -> None:
    size = cfg.block_size_bytes
    slot = _filled_buffer(size)
    transfer = engine.write_from if cfg.is_write else engine.read_into
    stream = _offset_stream(cfg, offsets)
    while not meter.stop:
        moved = await transfer(file, next(stream), slot)
        if moved != size:
            raise RuntimeError(f"{engine.name}: short transfer {moved} (want {size})")
        meter.ios += 1


async def _run_engine(kind: str, cfg: Config, run: Run, seed: int) -> Window:
    engine_type = UringEngine if kind.startswith("uring") else ThreadEngine
    engine = engine_type(queue_depth=cfg.queue_depth)
    if run.drive == "tasks" or "_tasks" in kind:
        return await _run_engine_tasks(engine, cfg, run, seed)
    stream = run.drive == "stream" and cfg.queue_depth > 1
    lanes, batch = (2, STREAM_BATCH) if stream else (cfg.lanes, cfg.batch_size)
    async with engine:
        file = await engine.open(run.target(cfg), direct=True, write=cfg.is_write)
        meter = Meter()
        sources = _offset_sources(cfg, run.size_bytes, seed, lanes, batch)
        tasks = [
            asyncio.create_task(_engine_lane(engine, file, cfg, source, meter, batch))
            for source in sources
        ]
        return await measure_window(meter, tasks, run.warmup_s, run.duration_s)


async def _run_engine_tasks(engine: IOEngine, cfg: Config, run: Run, seed: int) -> Window:
    async with engine:
        file = await engine.open(run.target(cfg), direct=True, write=cfg.is_write)
        meter = Meter()
        sources = _offset_sources(cfg, run.size_bytes, seed, cfg.queue_depth, 1)
        tasks = [
            asyncio.create_task(_engine_task(engine, file, cfg, source, meter))
            for source in sources
        ]
        return await measure_window(meter, tasks, run.warmup_s, run.duration_s)


# ---------------------------------------------------------------------- aiofiles
def _direct_opener(path: str, flags: int) -> int:
    return os.open(path, flags | os.O_DIRECT)


async def _aiofiles_task(path: Path, cfg: Config, offsets: Any, meter: Meter) -> None:
    size = cfg.block_size_bytes
    slot = _filled_buffer(size)
    mode = "r+b" if cfg.is_write else "rb"
    stream = _offset_stream(cfg, offsets)
    async with aiofiles.open(path, mode, buffering=0, opener=_direct_opener) as file:
        while not meter.stop:
            await file.seek(next(stream))
            moved = await (file.write(slot) if cfg.is_write else file.readinto(slot))
            if moved != size:
                raise RuntimeError(f"aiofiles: short transfer {moved} (want {size})")
            meter.ios += 1


async def _run_aiofiles(cfg: Config, run: Run, seed: int) -> Window:
    meter = Meter()
    sources = _offset_sources(cfg, run.size_bytes, seed, cfg.queue_depth, 1)
    tasks = [
        asyncio.create_task(_aiofiles_task(run.target(cfg), cfg, source, meter))
        for source in sources
    ]
    return await measure_window(meter, tasks, run.warmup_s, run.duration_s)


# ---------------------------------------------------------------------- one run, all rounds
def run_one(path: str, cfg: Config, run: Run, round_index: int) -> Sample:
    load1 = os.getloadavg()[0]
    if path == "fio":
        result = run_fio(
            run.fio, cfg, run.target(cfg), run.size_bytes, run.duration_s, run.warmup_s
        )
        iops, cpu_us = result.iops, result.cpu_us_per_io
    else:
        seed = 1000 * round_index + 17
        coro = (
            _run_aiofiles(cfg, run, seed)
            if path == "aiofiles"
            else _run_engine(path, cfg, run, seed)
        )
        window = uvloop.run(coro) if path.endswith("_uvloop") else asyncio.run(coro)
        iops, cpu_us = window.ios / window.elapsed_s, window.cpu_s * 1e6 / window.ios
    return Sample(path, cfg.key, round_index, iops, iops * cfg.block_size_bytes, cpu_us, load1)


def paths_for(cfg: Config, quick: bool, only: tuple[str, ...] | None) -> list[str]:
    """The paths one config runs: every path, plus the tasks drive at 4k QD32 in quick mode."""
    paths = list(PATHS) + (list(TASKS_PATHS) if quick and cfg.key == TASKS_KEY else [])
    if uvloop is None:
        paths = [p for p in paths if not p.endswith("_uvloop")]
    return [p for p in paths if only is None or p in only]


def run_rounds(
    configs: list[Config],
    run: Run,
    rounds: int,
    quick: bool = False,
    only: tuple[str, ...] | None = None,
) -> list[Sample]:
    samples = []
    for round_index in range(rounds):
        for cfg in configs:
            for path in paths_for(cfg, quick, only):
                sample = run_one(path, cfg, run, round_index)
                samples.append(sample)
                print(
                    f"[round {round_index + 1}/{rounds}] {cfg.key:>17} {path:>12}: "
                    f"{sample.iops:10,.0f} IOPS {sample.bandwidth_bytes_per_s / 1e6:8,.1f} MB/s "
                    f"{sample.cpu_us_per_io:7.2f} us/IO  load1={sample.load1:.1f}",
                    file=sys.stderr,
                    flush=True,
                )
    return samples


# ---------------------------------------------------------------------- command line
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 GiB, 2 rounds, ~1.5 s per run")
    parser.add_argument("--rounds", type=int, help="rounds (full 5, quick 2)")
    parser.add_argument("--duration-s", type=float, help="seconds per run (full 5, quick 1.5)")
    parser.add_argument("--warmup-s", type=float, help="warm-up per run (full 0.5, quick 0.25)")
    parser.add_argument("--size-gib", type=float, help="data file size (full 4, quick 1)")
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="where the files live")
    parser.add_argument(
        "--keep-data", action="store_true", help="keep the data files for the next run"
    )
    parser.add_argument(
        "--drive",
        choices=("stream", "lanes", "tasks"),
        default="stream",
        help="how the engines keep QD in flight (see the module docstring)",
    )
    parser.add_argument(
        "--configs", help="comma-separated config keys to run (e.g. 4k_qd32); default: all"
    )
    parser.add_argument(
        "--paths",
        help=f"comma-separated paths to run, of {', '.join(PATHS + TASKS_PATHS)}; default: all",
    )
    args = parser.parse_args(argv)
    quick = args.quick
    args.rounds = args.rounds or (2 if quick else 5)
    args.duration_s = args.duration_s or (1.5 if quick else 5.0)
    args.warmup_s = args.warmup_s if args.warmup_s is not None else (0.25 if quick else 0.5)
    args.size_gib = args.size_gib or (1.0 if quick else 4.0)
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    version = code_version()  # the engine modules are imported already: this is what runs
    print(f"tiers code: {version}", file=sys.stderr, flush=True)
    mode = "quick" if args.quick else "full"
    configs = QUICK_CONFIGS if args.quick else FULL_CONFIGS
    if args.configs:
        wanted = args.configs.split(",")
        configs = [c for c in FULL_CONFIGS if c.key in wanted]
        if not configs:
            raise SystemExit(f"no config among {wanted}; known: {[c.key for c in FULL_CONFIGS]}")
    only = tuple(args.paths.split(",")) if args.paths else None
    size_bytes = int(args.size_gib * GIB) // MIB * MIB
    tag = f"{size_bytes // MIB}m"
    run = Run(
        read_path=args.dir / f"io_engine_read_{tag}.dat",
        write_path=args.dir / f"io_engine_write_{tag}.dat",
        size_bytes=size_bytes,
        duration_s=args.duration_s,
        warmup_s=args.warmup_s,
        drive=args.drive,
        fio=ensure_fio(),
    )
    targets = [run.read_path] + ([run.write_path] if any(c.is_write for c in configs) else [])
    for target in targets:
        made = ensure_data_file(remove_at_exit(target, args.keep_data), size_bytes)
        print(f"{'wrote' if made else 'reusing'} {target}", file=sys.stderr, flush=True)
    samples = run_rounds(configs, run, args.rounds, args.quick, only)
    figures = headline(samples, mode, machine_string(), args.drive)
    figures["code"] = version
    figures["drive"] = args.drive
    print_report(samples, configs, figures, args, mode)
    print(json.dumps(figures), flush=True)


if __name__ == "__main__":
    main()
