"""The fio reference: install it if missing, run one config, parse IOPS, bandwidth and CPU.

fio runs io_uring with O_DIRECT over the same file as the Python paths, with the same block size,
queue depth, warm-up (``--ramp_time``) and duration. CPU per I/O follows the issue's formula:
``(usr_cpu + sys_cpu) / 100 * runtime_s / total_ios``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.common.measure import Config


@dataclass(frozen=True)
class FioResult:
    iops: float
    bandwidth_bytes_per_s: float
    cpu_us_per_io: float
    total_ios: int
    runtime_s: float


def ensure_fio() -> str:
    """Path of the fio binary, installing the Debian package when it is not on PATH."""
    found = shutil.which("fio")
    if found:
        return found
    print("fio not found: apt-get update && apt-get install -y fio", file=sys.stderr, flush=True)
    subprocess.run(
        "apt-get update && apt-get install -y fio",
        shell=True,
        check=True,
        stdout=sys.stderr,
        stderr=sys.stderr,
    )
    found = shutil.which("fio")
    if not found:
        raise RuntimeError("fio is still not on PATH after apt-get install")
    return found


def fio_command(
    fio: str, cfg: Config, path: Path, size_bytes: int, duration_s: float, warmup_s: float
) -> list[str]:
    """fio io_uring O_DIRECT job for ``cfg``; time values in ms so fractions of a second work."""
    return [
        fio,
        f"--name={cfg.key}",
        f"--filename={path}",
        f"--size={size_bytes}",
        "--ioengine=io_uring",
        "--direct=1",
        "--output-format=json",
        "--time_based",
        f"--runtime={round(duration_s * 1000)}ms",
        f"--ramp_time={round(warmup_s * 1000)}ms",
        f"--rw={cfg.rw}",
        f"--bs={cfg.block_size_bytes}",
        f"--iodepth={cfg.queue_depth}",
        "--norandommap",
        "--randrepeat=0",
    ]


def run_fio(
    fio: str, cfg: Config, path: Path, size_bytes: int, duration_s: float, warmup_s: float
) -> FioResult:
    """Run fio once for ``cfg``; fails loudly on a non-zero exit or an fio-reported error."""
    command = fio_command(fio, cfg, path, size_bytes, duration_s, warmup_s)
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"fio failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    return parse_fio_json(done.stdout, "write" if cfg.is_write else "read")


def parse_fio_json(text: str, direction: str) -> FioResult:
    """IOPS, bandwidth and CPU per I/O of the first job of fio's JSON output."""
    start = text.find("{")  # fio may print warnings before the JSON document
    if start < 0:
        raise RuntimeError(f"no JSON in fio output: {text[:500]!r}")
    job: dict[str, Any] = json.loads(text[start:])["jobs"][0]
    if job.get("error"):
        raise RuntimeError(f"fio job error {job['error']}")
    stats = job[direction]
    total_ios = int(stats["total_ios"])
    runtime_s = float(stats["runtime"]) / 1000.0
    if total_ios <= 0 or runtime_s <= 0:
        raise RuntimeError(f"fio measured nothing: {stats}")
    cpu_fraction = (float(job["usr_cpu"]) + float(job["sys_cpu"])) / 100.0
    return FioResult(
        iops=float(stats["iops"]),
        bandwidth_bytes_per_s=float(stats["bw_bytes"]),
        cpu_us_per_io=cpu_fraction * runtime_s / total_ios * 1e6,
        total_ios=total_ios,
        runtime_s=runtime_s,
    )
