"""The NVMe floor: fio reading and writing the bytes an AdamW step moves, at our block size.

A step over N parameters reads and writes Adam's two moments (``8 * N`` bytes each way, the
default ``master="params"``: the fp32 parameters are the masters) or those and the fp32 master
weights (``12 * N``, ``master="tier"``): ``bytes_per_param``. fio moves the same bytes with
O_DIRECT (io_uring, like the tiers I/O core) at the block size of our subgroup I/O (one request
per subgroup object: the moments, and the master with ``master="tier"``), two ways, each at
queue depth 1 (what our pipeline keeps in flight each way) and 4:

* ``overlapped``: one fio run, a reader and a writer at once on two files, as our pipeline reads
  subgroup i+1 while writing i-1; its time is the slower job's runtime;
* ``serial``: a read run then a write run, times added.

The floor is the lowest of the four (the device may do better one way or the other). Files are
written with real data first (``ensure_data_file``: unwritten extents read as zeros without
touching the device) and overwritten in place, as a steady-state step overwrites its state.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.common.fio import ensure_fio
from benchmarks.common.measure import ensure_data_file

__all__ = ["IoFloor", "fio_blocks", "measure_io_floor"]

STATE_BYTES_PER_PARAM = 8  # exp_avg + exp_avg_sq (the parameters are the fp32 masters)


QUEUE_DEPTHS = (1, 4)


@dataclass(frozen=True)
class IoFloor:
    bytes_each_way: int
    block_size_bytes: int
    seconds: dict[str, float]  # "overlapped_qd1", "serial_qd4", ...

    @property
    def floor_s(self) -> float:
        return min(self.seconds.values())


def fio_blocks(
    params: int, object_bytes: int, bytes_per_param: int = STATE_BYTES_PER_PARAM
) -> tuple[int, int]:
    """(block size, total bytes) for fio: as many blocks as our objects, equal in size (a whole
    MiB each, at most ~1 MiB over the true ``bytes_per_param * params`` bytes per block), since
    fio moves whole blocks and our last subgroup is a short one."""
    raw = bytes_per_param * params
    blocks = -(-raw // object_bytes)
    block_bytes = -(-raw // blocks // (1 << 20)) * (1 << 20)
    return block_bytes, blocks * block_bytes


def _job(name: str, rw: str, path: Path, size: int, bs: int, qd: int) -> list[str]:
    return [
        f"--name={name}",
        f"--filename={path}",
        f"--rw={rw}",
        f"--size={size}",
        f"--bs={bs}",
        f"--iodepth={qd}",
        "--ioengine=io_uring",
        "--direct=1",
    ]


def _run_fio(fio: str, jobs: list[list[str]]) -> list[float]:
    """Runtime in seconds of each job of one fio run (jobs start together)."""
    command = [fio, "--output-format=json", "--group_reporting=0"]
    for job in jobs:
        command += job
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"fio failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    report: dict[str, Any] = json.loads(done.stdout[done.stdout.find("{") :])
    runtimes_s = []
    for job_report in report["jobs"]:
        if job_report.get("error"):
            raise RuntimeError(f"fio job error {job_report['error']}")
        side = job_report["write"] if job_report["write"]["io_bytes"] else job_report["read"]
        runtimes_s.append(float(side["runtime"]) / 1000.0)
    return runtimes_s


def measure_io_floor(
    directory: Path, params: int, object_bytes: int, bytes_per_param: int = STATE_BYTES_PER_PARAM
) -> IoFloor:
    """fio's time to read and to write ``bytes_per_param * params`` bytes in ``directory`` in
    blocks of at most ``object_bytes`` (files kept there for the next round; the caller removes
    them)."""
    fio = ensure_fio()
    block_size_bytes, size = fio_blocks(params, object_bytes, bytes_per_param)
    read_path = directory / f"floor-read-{size}.bin"
    write_path = directory / f"floor-write-{size}.bin"
    ensure_data_file(read_path, size)
    ensure_data_file(write_path, size)
    seconds = {}
    for depth in QUEUE_DEPTHS:
        read = _job("read", "read", read_path, size, block_size_bytes, depth)
        write = _job("write", "write", write_path, size, block_size_bytes, depth)
        seconds[f"overlapped_qd{depth}"] = max(_run_fio(fio, [read, write]))
        seconds[f"serial_qd{depth}"] = _run_fio(fio, [read])[0] + _run_fio(fio, [write])[0]
    return IoFloor(size, block_size_bytes, seconds)


if __name__ == "__main__":
    import sys
    import tempfile

    with tempfile.TemporaryDirectory(dir=Path(__file__).resolve().parents[1] / "out") as scratch:
        floor = measure_io_floor(Path(scratch), int(sys.argv[1]), int(sys.argv[2]))
        print(floor, floor.floor_s)
