"""Shared pieces of the I/O benchmarks: configs, data files, offsets, timing windows, stats.

Nothing here knows about a particular I/O path; ``benchmarks.tiers.io_engine`` drives the paths
and ``benchmarks.common.fio`` runs the fio reference.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import platform
import resource
import statistics
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import tiers
from tiers.io import aligned_empty

KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB
_FILL_CHUNK_BYTES = 16 * MIB


@dataclass(frozen=True)
class Config:
    """One measured workload: fio ``rw`` mode, block size, queue depth and engine lanes."""

    rw: str  # "randread", "read" (sequential) or "write" (sequential)
    block_size_bytes: int
    queue_depth: int
    lanes: int  # concurrent read_batch loops; each keeps queue_depth // lanes requests in flight

    @property
    def batch_size(self) -> int:
        return self.queue_depth // self.lanes

    @property
    def is_write(self) -> bool:
        return self.rw == "write"

    @property
    def is_random(self) -> bool:
        return self.rw == "randread"

    @property
    def key(self) -> str:
        """Short name, e.g. ``4k_qd32`` or ``seq_read_1m_qd32``."""
        kib = self.block_size_bytes // KIB
        size = f"{kib // 1024}m" if kib >= 1024 else f"{kib}k"
        kind = {"randread": "", "read": "seq_read_", "write": "seq_write_"}[self.rw]
        return f"{kind}{size}_qd{self.queue_depth}"


RANDOM_CONFIGS = [
    Config("randread", bs, qd, lanes)
    for bs in (4 * KIB, 128 * KIB)
    for qd, lanes in ((1, 1), (32, 4), (128, 8))
]
SEQ_CONFIGS = [Config("read", MIB, 32, 4), Config("write", MIB, 32, 4)]
FULL_CONFIGS = RANDOM_CONFIGS + SEQ_CONFIGS
QUICK_KEYS = ("4k_qd1", "4k_qd32", "128k_qd32", "4k_qd128", "128k_qd128")
QUICK_CONFIGS = [c for c in RANDOM_CONFIGS if c.key in QUICK_KEYS]


@dataclass(frozen=True)
class Sample:
    """One timed run of one path on one config in one round."""

    path: str
    config: str
    round_index: int
    iops: float
    bandwidth_bytes_per_s: float
    cpu_us_per_io: float
    load1: float


# ---------------------------------------------------------------------- data files
def ensure_data_file(path: Path, size_bytes: int) -> bool:
    """Make ``path`` hold ``size_bytes`` of pseudo-random data written with O_DIRECT.

    Real writes (not fallocate): unwritten extents read as zeros without touching the device.
    Returns False when an existing file of the right size was reused. A fill that fails leaves
    nothing behind.
    """
    if path.exists() and path.stat().st_size == size_bytes:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_suffix(".partial")
    rng = np.random.default_rng()
    chunk = aligned_empty(_FILL_CHUNK_BYTES)
    words = chunk.view(np.uint64)
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o644)
    try:
        for offset_bytes in range(0, size_bytes, _FILL_CHUNK_BYTES):
            words[:] = rng.bit_generator.random_raw(len(words))
            count = min(_FILL_CHUNK_BYTES, size_bytes - offset_bytes)
            if os.pwritev(fd, [chunk[:count]], offset_bytes) != count:
                raise RuntimeError(f"short write while filling {temp}")
        os.fsync(fd)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    finally:
        os.close(fd)
    temp.rename(path)
    return True


# ---------------------------------------------------------------------- offsets
class RandomOffsets:
    """Pre-drawn random block-aligned offsets over a file, handed out a batch at a time."""

    def __init__(self, seed: int, file_size_bytes: int, block_size_bytes: int, batch: int):
        rng = np.random.default_rng(seed)
        blocks = file_size_bytes // block_size_bytes
        self._rows = rng.integers(0, blocks, size=(4096, batch), dtype=np.int64) * block_size_bytes
        self._next = 0

    def take(self) -> np.ndarray:
        row = self._rows[self._next]
        self._next = (self._next + 1) % len(self._rows)
        return row


class SequentialOffsets:
    """One cursor shared by every lane: consecutive blocks, wrapping at the end of the file."""

    def __init__(self, file_size_bytes: int, block_size_bytes: int, batch: int):
        self._blocks = file_size_bytes // block_size_bytes
        self._block_size_bytes = block_size_bytes
        self._steps = np.arange(batch, dtype=np.int64)
        self._cursor = 0

    def take(self) -> np.ndarray:
        blocks = (self._steps + self._cursor) % self._blocks
        self._cursor = (self._cursor + len(self._steps)) % self._blocks
        return blocks * self._block_size_bytes


# ---------------------------------------------------------------------- timing window
class Meter:
    """Completed I/O count of the running workers, and the flag that stops them."""

    def __init__(self) -> None:
        self.ios = 0
        self.stop = False


@dataclass(frozen=True)
class Window:
    ios: int
    elapsed_s: float
    cpu_s: float


def cpu_seconds() -> float:
    """User + system CPU of this process, all threads included."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def measure_window(
    meter: Meter, workers: list[asyncio.Task[None]], warmup_s: float, duration_s: float
) -> Window:
    """Let ``workers`` warm up, count their I/Os and CPU for ``duration_s``, then stop them."""
    try:
        await _wait_or_raise(workers, warmup_s)
        ios, start_s, cpu_s = meter.ios, time.perf_counter(), cpu_seconds()
        await _wait_or_raise(workers, duration_s)
        window = Window(meter.ios - ios, time.perf_counter() - start_s, cpu_seconds() - cpu_s)
    finally:
        meter.stop = True
        outcomes = await asyncio.gather(*workers, return_exceptions=True)
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome  # a failure while draining
    if window.ios <= 0:
        raise RuntimeError("no I/O completed in the measurement window")
    return window


async def _wait_or_raise(workers: list[asyncio.Task[None]], timeout_s: float) -> None:
    done, _ = await asyncio.wait(workers, timeout=timeout_s, return_when=asyncio.FIRST_EXCEPTION)
    for task in done:
        task.result()  # re-raises a worker's failure
    if done:
        raise RuntimeError("an I/O worker stopped before the measurement ended")


# ---------------------------------------------------------------------- stats
def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def spread(values: list[float], fmt: str) -> str:
    """``median (min-max)`` with the given number format."""
    if not values:
        return "-"
    return f"{median(values):{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"


def machine_string() -> str:
    return f"{platform.system()} {platform.release()} {platform.machine()}, nproc={os.cpu_count()}"


def code_version() -> str:
    """Which engine code ran: where tiers/ was imported from, its git state, a hash of its *.py
    (subpackages included, each file named by its path inside tiers/)."""
    package_dir = Path(tiers.__file__).resolve().parent
    digest = hashlib.sha256()
    for source in sorted(package_dir.rglob("*.py")):
        name = source.relative_to(package_dir).as_posix()
        digest.update(name.encode() + source.read_bytes())
    git = ["git", "-C", str(package_dir)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run([*git, "status", "--porcelain", "."], capture_output=True, text=True)
    if head.returncode:
        state = "not a git checkout"
    else:
        changed = "modified" if dirty.stdout.strip() else "clean"
        state = f"git {head.stdout.strip()}, tiers/ {changed}"
    return f"{package_dir} ({state}), sha256 {digest.hexdigest()[:12]}"
