"""Workload (a): 32 KiB records, globally shuffled, cold cache -- tierkit vs DataLoader vs fio.

The data file holds ``count`` records of pseudo-random bytes, each stamped with its index in its
first 8 bytes (checked once per run on a sample of indices, outside the timing). fio reads the
same file at random 32 KiB offsets with O_DIRECT at the loader's queue depth: the device limit.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common.fio import ensure_fio, run_fio
from benchmarks.common.measure import MIB, Config
from benchmarks.dataload._measure import Run, time_run
from benchmarks.dataload._peers import RecordDataset, torch_loader
from dataload import FixedSizeSource, ShuffledLoader, read_samples
from tiers.io import aligned_empty

RECORD_BYTES = 32 * 1024
BATCH = 64
QUEUE_DEPTH = 128
WORKLOAD = "records_32k"


def ensure_records(path: Path, count: int) -> None:
    """Write ``count`` stamped 32 KiB records with O_DIRECT unless the file is already there."""
    size_bytes = count * RECORD_BYTES
    if path.exists() and path.stat().st_size == size_bytes:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_suffix(".partial")
    per_chunk = 512  # 16 MiB
    chunk = aligned_empty(per_chunk * RECORD_BYTES).reshape(per_chunk, RECORD_BYTES)
    rng = np.random.default_rng(5)
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o644)
    try:
        for first in range(0, count, per_chunk):
            n = min(per_chunk, count - first)
            chunk.view(np.uint64)[:] = rng.bit_generator.random_raw(chunk.size // 8).reshape(
                per_chunk, -1
            )
            chunk[:, :8] = np.arange(first, first + per_chunk, dtype="<i8")[:, None].view(np.uint8)
            os.pwritev(fd, [chunk[:n].reshape(-1)], first * RECORD_BYTES)
        os.fsync(fd)
    except BaseException:  # a fill that fails leaves nothing behind
        temp.unlink(missing_ok=True)
        raise
    finally:
        os.close(fd)
    temp.rename(path)


def check_stamps(path: Path) -> None:
    """The loader reads the right bytes: each record's stamp is its index."""
    source = FixedSizeSource(path, RECORD_BYTES, direct=True)
    picks = np.random.default_rng(1).integers(0, len(source), 256)
    for index, raw in zip(picks.tolist(), read_samples(source, picks), strict=True):
        if int.from_bytes(raw[:8], "little") != index:
            raise RuntimeError(f"record {index} of {path} has the wrong stamp")


def tierkit_start(path: Path, direct: bool, seed: int) -> Callable[[], tuple[Iterator, Any]]:
    def start() -> tuple[Iterator[Any], Callable[[], None]]:
        source = FixedSizeSource(path, RECORD_BYTES, direct=direct)
        loader = ShuffledLoader(
            source, BATCH, seed=seed, prefetch_batches=4, queue_depth=QUEUE_DEPTH, num_workers=0
        )
        return iter(loader), loader.close

    return start


def torch_start(path: Path, count: int, workers: int, seed: int) -> Callable[[], tuple]:
    def start() -> tuple[Iterator[Any], Callable[[], None]]:
        return torch_loader(RecordDataset(path, RECORD_BYTES, count), BATCH, workers, seed)

    return start


def run_round(
    path: Path, count: int, round_index: int, max_time_s: float, torch_workers: tuple[int, ...]
) -> list[Run]:
    """One round: tierkit (O_DIRECT, buffered), DataLoader per worker count; fio separately."""
    runs = []
    rows = lambda batch: int(batch.shape[0])  # noqa: E731
    size = lambda batch: int(batch.numel())  # noqa: E731
    seed = 100 + round_index
    for name, start in (
        ("tierkit_direct", tierkit_start(path, True, seed)),
        ("tierkit_buffered", tierkit_start(path, False, seed)),
        *((f"torch_nw{w}", torch_start(path, count, w, seed)) for w in torch_workers),
    ):
        run = time_run(WORKLOAD, name, round_index, [path], start, rows, size, count, max_time_s)
        print(
            f"  round {round_index} {name:18s} {run.samples_per_s:9,.0f} samples/s "
            f"{run.mb_per_s:7,.0f} MB/s cpu {run.cpu_us_per_sample:6.1f} us/sample "
            f"first {run.first_batch_s * 1e3:6.1f} ms",
            flush=True,
        )
        runs.append(run)
    runs.append(fio_run(path, count, round_index, duration_s=min(max_time_s, 6.0)))
    return runs


def fio_run(path: Path, count: int, round_index: int, duration_s: float) -> Run:
    """fio random 32 KiB O_DIRECT reads at the loader's queue depth, as a Run."""
    cfg = Config("randread", RECORD_BYTES, QUEUE_DEPTH, 1)
    result = run_fio(ensure_fio(), cfg, path, count * RECORD_BYTES, duration_s, 0.5)
    run = Run(
        WORKLOAD,
        f"fio_qd{QUEUE_DEPTH}",
        round_index,
        result.total_ios,
        result.total_ios * RECORD_BYTES,
        result.runtime_s,
        result.cpu_us_per_io * result.total_ios / 1e6,
        0.0,
        os.getloadavg()[0],
    )
    print(
        f"  round {round_index} {run.loader:18s} {run.samples_per_s:9,.0f} samples/s "
        f"{run.mb_per_s:7,.0f} MB/s cpu {run.cpu_us_per_sample:6.1f} us/IO",
        flush=True,
    )
    return run


def data_path(out_dir: Path, count: int) -> Path:
    return out_dir / f"dataload_records_{count * RECORD_BYTES // MIB}m.dat"
