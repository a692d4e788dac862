"""A small deterministic training loop for the OffloadedOptimizer tests, run the same way
with the offloaded optimizer and with the plain torch one.

The model has parameters of awkward sizes (33, 4*33, an embedding of 50x7) in two param groups
with different hyperparameters, and one parameter (``rare``) that only every third step uses,
so its gradient is None on the others (torch skips it; so must we). Every step accumulates two
micro-batches, clips the gradient norm to 1.0 and then steps; an LR scheduler changes the
learning rate each step. Everything is seeded: two runs that differ only in an optimizer giving
bit-identical updates end with bit-identical parameters.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = ["Model", "groups", "make_model", "same_params", "scheduler", "train"]


class Model(torch.nn.Module):
    def __init__(self, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(50, 7, dtype=dtype)
        self.hidden = torch.nn.Linear(7, 33, dtype=dtype)
        self.out = torch.nn.Linear(33, 4, dtype=dtype)
        self.rare = torch.nn.Parameter(torch.randn(5, 3, dtype=dtype))

    def forward(self, tokens: torch.Tensor, use_rare: bool) -> torch.Tensor:
        h = torch.tanh(self.hidden(self.embed(tokens).mean(1)))
        y = self.out(h)
        if use_rare:
            y = y + self.rare.sum() * 0.1
        return y


def make_model(seed: int = 0, dtype: torch.dtype = torch.float32) -> Model:
    torch.manual_seed(seed)
    return Model(dtype)


def groups(model: Model) -> list[dict[str, Any]]:
    """Two groups: matrices with weight decay, the rest (biases, rare) without, other lr."""
    decay = [model.embed.weight, model.hidden.weight, model.out.weight]
    rest = [model.hidden.bias, model.out.bias, model.rare]
    return [
        {"params": decay, "weight_decay": 0.05},
        {"params": rest, "weight_decay": 0.0, "lr": 0.02},
    ]


def scheduler(opt: torch.optim.Optimizer, kind: str) -> torch.optim.lr_scheduler.LRScheduler:
    if kind == "cosine":
        return torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=20)
    if kind == "constant":  # nothing to restore after a crash
        return torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0)
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 / (1 + step) ** 0.5)


def train(
    model: Model,
    opt: torch.optim.Optimizer,
    steps: int,
    *,
    first_step: int = 0,
    schedule: str = "lambda",
    sched: torch.optim.lr_scheduler.LRScheduler | None = None,
    on_step: Callable[[int], None] | None = None,
) -> torch.optim.lr_scheduler.LRScheduler:
    """``steps`` optimizer steps (from ``first_step``: the data depend on the step number)."""
    sched = sched or scheduler(opt, schedule)
    for step in range(first_step, first_step + steps):
        data = torch.Generator().manual_seed(1000 + step)
        opt.zero_grad(set_to_none=True)
        for _ in range(2):  # gradient accumulation
            tokens = torch.randint(50, (8, 5), generator=data)
            target = torch.randn(8, 4, generator=data)
            loss = (model(tokens, step % 3 == 0).float() - target).pow(2).mean() / 2
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if on_step is not None:
            on_step(step)
    return sched


def same_params(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))
