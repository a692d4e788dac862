"""One system's AdamW steps in this process: torch in memory, or ours in DRAM or on NVMe.

``python -m benchmarks.optim.worker --system torch|ours-dram|ours-nvme|ours-nvme-tier --params N``
builds the
synthetic model (``model.build_params``), runs ``--warmup`` untimed steps (the first allocates or
writes the states), then ``--steps`` timed ones, and prints one JSON line: the step times, the RSS
of the model alone (params + grads, measured before the optimizer exists) and this process's
peak RSS (VmHWM, read just before exit).
Threads are fixed with ``torch.set_num_threads`` before anything runs.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from benchmarks.optim.model import build_params, disk_io_bytes, peak_rss_bytes, rss_bytes

# ours-nvme: the default master="auto", "params" for this fp32 CPU model (the parameters are the
# masters; the tier holds the two moments, 8 bytes per parameter each way); ours-nvme-tier:
# master="tier" (an fp32 master with them, 12).
SYSTEMS = ("torch", "ours-dram", "ours-nvme", "ours-nvme-tier")
ADAMW_KWARGS: dict[str, Any] = {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8}
ADAMW_KWARGS["weight_decay"] = 0.01


@contextmanager
def open_optimizer(
    system: str,
    params: list[torch.nn.Parameter],
    directory: Path | None,
    subgroup_bytes: int | None,
) -> Iterator[torch.optim.Optimizer]:
    """The optimizer ``system`` names over ``params``; ours is closed on the way out."""
    if system == "torch":
        yield torch.optim.AdamW(params, fused=True, **ADAMW_KWARGS)
        return
    from kvstore.optim import OffloadedOptimizer

    tier = "dram" if system == "ours-dram" else "nvme"
    # ours-nvme as users call it: the default master="auto", which is "params" here
    master = {"ours-nvme-tier": "tier"}.get(system, "auto")
    optimizer = OffloadedOptimizer(
        params,
        torch.optim.AdamW,
        tier=tier,
        directory=directory if tier == "nvme" else None,
        subgroup_bytes=subgroup_bytes,
        master=master,
        fused=True,
        **ADAMW_KWARGS,
    )
    try:
        yield optimizer
    finally:
        optimizer.close()


def directory_bytes(directory: Path | None) -> int:
    """Bytes of the files under ``directory``: evidence the state really is on disk."""
    if directory is None or not directory.exists():
        return 0
    return sum(path.stat().st_size for path in directory.rglob("*") if path.is_file())


def run_steps(
    optimizer: torch.optim.Optimizer, warmup: int, steps: int
) -> tuple[list[float], list[int]]:
    """Wall seconds of each of ``steps`` timed ``step()`` calls after ``warmup`` untimed ones,
    and the disk bytes (read, written) the timed steps moved per step."""
    for _ in range(warmup):
        optimizer.step()
    times_s = []
    io_before = disk_io_bytes()
    for _ in range(steps):
        start_s = time.perf_counter()
        optimizer.step()
        times_s.append(time.perf_counter() - start_s)
    io_after = disk_io_bytes()
    moved = [after - before for before, after in zip(io_before, io_after, strict=True)]
    return times_s, [count // steps for count in moved]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--system", choices=SYSTEMS, required=True)
    parser.add_argument("--params", type=int, required=True)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--directory", type=Path, default=None)
    parser.add_argument("--subgroup-bytes", type=int, default=None, help="default: automatic")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    params = build_params(args.params)
    model_rss = rss_bytes()
    setup_start_s = time.perf_counter()
    with open_optimizer(args.system, params, args.directory, args.subgroup_bytes) as optimizer:
        setup_s = time.perf_counter() - setup_start_s
        times_s, io_per_step = run_steps(optimizer, args.warmup, args.steps)
        disk_bytes = directory_bytes(args.directory)
    record = {
        "system": args.system,
        "params": sum(p.numel() for p in params),
        "threads": torch.get_num_threads(),
        "setup_s": setup_s,
        "step_s": times_s,
        "model_rss_bytes": model_rss,
        "peak_rss_bytes": peak_rss_bytes(),
        "checksum": float(sum(p.detach().double().sum() for p in params[:4])),
        "directory_bytes": disk_bytes,
        "subgroups": len(getattr(optimizer, "subgroups", [])),
        "subgroup_bytes": getattr(optimizer, "subgroup_bytes", None),
        "master": getattr(optimizer, "master", None),
        "disk_read_write_bytes_per_step": io_per_step,
    }
    print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
