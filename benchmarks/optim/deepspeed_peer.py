"""DeepSpeed's ZeRO optimizer offload stepping the same model, run in .venv-deepspeed.

``.venv-deepspeed/bin/python -m benchmarks.optim.deepspeed_peer --device nvme|cpu --params N``
(from the repository root, with ``TORCH_EXTENSIONS_DIR`` pointing at the venv's prebuilt ops;
``scripts/deepspeed_venv.sh`` builds both). DeepSpeed runs on its ``cpu`` accelerator as one
rank of a gloo process group; its full engine (``deepspeed.initialize``) is used:

* ``--device nvme``: ZeRO-3 with ``offload_optimizer.device=nvme`` (ZeRO-Infinity): fp32 master
  weights and both moments in swap files under ``--directory``, moved by its libaio ``async_io``
  op, stepped by DeepSpeedCPUAdam;
* ``--device cpu``: ZeRO-2 with ``offload_optimizer.device=cpu`` (ZeRO-Offload): states in host
  memory, DeepSpeedCPUAdam.

``sub_group_size`` is set to our subgroup (``--subgroup-bytes`` / 4 elements) and the aio
settings are DeepSpeed's defaults (1 MiB blocks, queue depth 8). Each step runs a forward whose
gradient is 1 for every parameter (``engine.backward``) untimed, then ``engine.step()`` timed: the
step is what the offload moves and computes. Imports no tierkit code (the venv has none): only
``benchmarks.optim.model``, which needs torch alone. Prints one JSON line like ``worker``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.optim.model import build_params, disk_io_bytes, peak_rss_bytes, rss_bytes

ADAMW = {"lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.01}


class ParamModel(torch.nn.Module):
    """The synthetic parameters as a module whose output's gradient is 1 everywhere."""

    def __init__(self, params: list[torch.nn.Parameter]):
        super().__init__()
        self.weights = torch.nn.ParameterList(params)

    def forward(self) -> torch.Tensor:
        return torch.stack([p.sum() for p in self.weights]).sum()


def ds_config(device: str, directory: Path | None, subgroup_bytes: int) -> dict[str, Any]:
    offload: dict[str, Any] = {"device": device, "pin_memory": True}
    zero: dict[str, Any] = {"stage": 3 if device == "nvme" else 2, "offload_optimizer": offload}
    if device == "nvme":
        offload["nvme_path"] = str(directory)
        zero["sub_group_size"] = subgroup_bytes // 4
    return {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "AdamW", "params": ADAMW},
        "zero_optimization": zero,
        "aio": {"block_size": 1 << 20, "queue_depth": 8, "intra_op_parallelism": 1},
        "steps_per_print": 1 << 30,
        "wall_clock_breakdown": False,
    }


def _single_rank_env() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    defaults = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1"}
    defaults |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    for name, value in defaults.items():
        os.environ.setdefault(name, value)
    os.environ.setdefault("DS_ACCELERATOR", "cpu")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", choices=("nvme", "cpu"), required=True)
    parser.add_argument("--params", type=int, required=True)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--directory", type=Path, default=None)
    parser.add_argument("--subgroup-bytes", type=int, default=64 << 20)
    args = parser.parse_args(argv)
    _single_rank_env()
    torch.set_num_threads(args.threads)
    import deepspeed  # type: ignore[import-not-found]  # after the env: picks its accelerator

    deepspeed.init_distributed(dist_backend="gloo", verbose=False)
    params = build_params(args.params, grads=False)
    model_rss = rss_bytes()
    setup_start_s = time.perf_counter()
    config = ds_config(args.device, args.directory, args.subgroup_bytes)
    engine, _, _, _ = deepspeed.initialize(
        model=ParamModel(params), model_parameters=params, config=config
    )
    setup_s = time.perf_counter() - setup_start_s
    times_s: list[float] = []
    io_moved = [0, 0]
    for index in range(args.warmup + args.steps):
        engine.backward(engine())
        io_before = disk_io_bytes()
        start_s = time.perf_counter()
        engine.step()
        if index >= args.warmup:
            times_s.append(time.perf_counter() - start_s)
            io_after = disk_io_bytes()
            io_moved = [m + a - b for m, a, b in zip(io_moved, io_after, io_before, strict=True)]
    swap_files = [p for p in args.directory.rglob("*") if p.is_file()] if args.directory else []
    record = {
        "system": f"deepspeed-{args.device}",
        "params": sum(p.ds_numel if hasattr(p, "ds_numel") else p.numel() for p in params),
        "threads": torch.get_num_threads(),
        "setup_s": setup_s,
        "step_s": times_s,
        "model_rss_bytes": model_rss,
        "peak_rss_bytes": peak_rss_bytes(),
        "deepspeed": deepspeed.__version__,
        "disk_read_write_bytes_per_step": [moved // args.steps for moved in io_moved],
        "directory_bytes": sum(path.stat().st_size for path in swap_files),
        "zero_stage": config["zero_optimization"]["stage"],
    }
    print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
