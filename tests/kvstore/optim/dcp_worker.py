"""One rank of the data-parallel run of the DCP test, and the model, data and steps that the
test's world-size-1 resume shares with it.

    RANK=r WORLD_SIZE=n MASTER_ADDR=127.0.0.1 MASTER_PORT=p \\
        python tests/kvstore/optim/dcp_worker.py OUTPUT_DIR KIND [KIND ...]

For each optimizer KIND ("torch", "dram", "nvme"; see :func:`make_optimizer`), every rank
trains a DDP replica of :func:`tiny_model` over gloo for :data:`STEPS_BEFORE_SAVE` steps on its
rows of each global batch, then saves the model and optimizer with
``torch.distributed.checkpoint`` to ``OUTPUT_DIR/KIND``; rank 0 also writes the optimizer's
and model's own ``state_dict`` at that point to ``OUTPUT_DIR/KIND-expected.pt``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root

import torch
from torch import nn

GLOBAL_BATCH_ROWS = 8
FEATURES = 16
STEPS_BEFORE_SAVE = 3
LR = 1e-2
WEIGHT_DECAY = 0.05
SUBGROUP_BYTES = 4 << 10  # the model's ~9 KiB of fp32 weights stream in three subgroups


def tiny_model() -> nn.Module:
    """An MLP with weights, biases and a LayerNorm: eleven hundred-odd parameters' worth of
    tensors of four shapes, the same on every rank."""
    with torch.random.fork_rng():
        torch.manual_seed(7)
        return nn.Sequential(
            nn.Linear(FEATURES, 32),
            nn.LayerNorm(32),
            nn.GELU(),
            nn.Linear(32, 32),
            nn.GELU(),
            nn.Linear(32, 4),
        )


def make_optimizer(kind: str, model: nn.Module, directory: str) -> torch.optim.Optimizer:
    """torch's AdamW ("torch") or ours with the same flags, states in DRAM or on NVMe
    (under ``directory``)."""
    flags: dict[str, Any] = {"lr": LR, "weight_decay": WEIGHT_DECAY}
    if kind == "torch":
        return torch.optim.AdamW(model.parameters(), **flags)
    from kvstore.optim import OffloadedOptimizer

    return OffloadedOptimizer(
        model.parameters(),
        torch.optim.AdamW,
        tier=kind,
        directory=directory if kind == "nvme" else None,
        subgroup_bytes=SUBGROUP_BYTES,
        **flags,
    )


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of ``step``: inputs and regression targets."""
    generator = torch.Generator().manual_seed(1000 + step)
    inputs = torch.randn(GLOBAL_BATCH_ROWS, FEATURES, generator=generator)
    return inputs, torch.randn(GLOBAL_BATCH_ROWS, 4, generator=generator)


def train(
    model: nn.Module, optimizer: torch.optim.Optimizer, steps: range, rank: int, world_size: int
) -> None:
    """Steps over this rank's rows of each global batch, clipping gradients before ``step``."""
    for step in steps:
        inputs, targets = batch(step)
        rows = slice(rank, None, world_size)
        loss = nn.functional.mse_loss(model(inputs[rows]), targets[rows])
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def dcp_save(model: nn.Module, optimizer: torch.optim.Optimizer, checkpoint: str) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    state = {
        "model": get_model_state_dict(model),
        "optim": get_optimizer_state_dict(model, optimizer),
    }
    dcp.save(state, checkpoint_id=checkpoint)


def dcp_load(model: nn.Module, optimizer: torch.optim.Optimizer, checkpoint: str) -> None:
    """The documented resume: state dicts of the new model and optimizer to load into, then
    set back (DCP reshards to this process's world size)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    state: dict[str, Any] = {
        "model": get_model_state_dict(model),
        "optim": get_optimizer_state_dict(model, optimizer),
    }
    dcp.load(state, checkpoint_id=checkpoint)
    set_model_state_dict(model, state["model"])
    set_optimizer_state_dict(model, optimizer, state["optim"])


def same_state(a: Any, b: Any) -> bool:
    """Nested dicts/lists of tensors and numbers, equal bit for bit."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return torch.equal(torch.as_tensor(a), torch.as_tensor(b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_state(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(same_state(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def main(output_dir: str, kinds: list[str]) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    for kind in kinds:
        model = DistributedDataParallel(tiny_model())
        state_dir = os.path.join(output_dir, f"state-{kind}-rank{rank}")
        optimizer = make_optimizer(kind, model, state_dir)
        train(model, optimizer, range(STEPS_BEFORE_SAVE), rank, world_size)
        before = optimizer.state_dict()
        if rank == 0:
            expected = {"model": model.module.state_dict(), "optim": before}
            torch.save(expected, os.path.join(output_dir, f"{kind}-expected.pt"))
        dcp_save(model, optimizer, os.path.join(output_dir, kind))
        close = getattr(optimizer, "close", None)
        if close is not None:
            close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
