"""OffloadedOptimizer steps bit-exactly like the torch optimizer it wraps, in memory.

For each supported optimizer and its flags: two param groups, gradient accumulation, clipping,
an LR scheduler and a parameter whose gradient is often None; subgroup sizes that cut
parameters into pieces (7 and 97 elements), and one that holds a whole group; DRAM and NVMe.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from kvstore.optim import OffloadedOptimizer
from tests.kvstore.optim.train_loop import groups, make_model, same_params, train

STEPS = 30
NVME_STEPS = 10  # every step is durable writes; the many-step exactness is the DRAM tests'
OPTIMIZERS: list[tuple[type[torch.optim.Optimizer], dict[str, Any]]] = [
    (torch.optim.AdamW, {"lr": 0.01}),
    (torch.optim.AdamW, {"lr": 0.01, "foreach": True, "amsgrad": True}),
    (torch.optim.AdamW, {"lr": 0.01, "fused": True}),
    (torch.optim.Adam, {"lr": 0.01, "betas": (0.8, 0.95)}),
    (torch.optim.SGD, {"lr": 0.05, "momentum": 0.9, "nesterov": True}),
    (torch.optim.SGD, {"lr": 0.05, "momentum": 0.9, "dampening": 0.1, "foreach": True}),
    (torch.optim.Adagrad, {"lr": 0.05, "initial_accumulator_value": 0.1}),
    (torch.optim.RMSprop, {"lr": 0.01, "momentum": 0.5}),
    (torch.optim.NAdam, {"lr": 0.01}),
]


def _ids(item: tuple[type, dict[str, Any]]) -> str:
    cls, kwargs = item
    flags = "-".join(k for k in ("foreach", "fused", "amsgrad", "nesterov") if kwargs.get(k))
    return cls.__name__ + (f"-{flags}" if flags else "")


def _run_pair(
    cls: type[torch.optim.Optimizer], kwargs: dict[str, Any], steps: int = STEPS, **offload: Any
) -> tuple[bool, OffloadedOptimizer, torch.optim.Optimizer]:
    ours_model, ref_model = make_model(), make_model()
    ours = OffloadedOptimizer(groups(ours_model), cls, **offload, **kwargs)
    ref = cls(groups(ref_model), **kwargs)
    schedule = "cosine" if cls is torch.optim.SGD else "lambda"
    train(ours_model, ours, steps, schedule=schedule)
    train(ref_model, ref, steps, schedule=schedule)
    return same_params(ours_model, ref_model), ours, ref


CASES = [(optimizer, 97) for optimizer in OPTIMIZERS] + [
    (OPTIMIZERS[0], 1 << 20),  # one subgroup per group
    (OPTIMIZERS[4], 1 << 20),
]


@pytest.mark.parametrize(
    ("optimizer", "subgroup_elems"), CASES, ids=[f"{_ids(o)}-{n}" for o, n in CASES]
)
def test_dram_steps_exactly_like_torch(
    optimizer: tuple[type[torch.optim.Optimizer], dict[str, Any]], subgroup_elems: int
) -> None:
    cls, kwargs = optimizer
    exact, ours, ref = _run_pair(cls, kwargs, subgroup_bytes=4 * subgroup_elems)
    with ours:
        assert exact
        assert [g["lr"] for g in ours.param_groups] == [g["lr"] for g in ref.param_groups]


@pytest.mark.parametrize("optimizer", [OPTIMIZERS[i] for i in (0, 5, 6)], ids=_ids)
def test_tiny_subgroups_split_every_parameter_and_stay_exact(
    optimizer: tuple[type[torch.optim.Optimizer], dict[str, Any]],
) -> None:
    """7-element subgroups: every parameter is cut, most pieces start mid-vector."""
    cls, kwargs = optimizer
    exact, ours, _ = _run_pair(cls, kwargs, steps=12, subgroup_bytes=4 * 7)
    with ours:
        assert exact
        assert len(ours.subgroups) > 100


@pytest.mark.parametrize("optimizer", [OPTIMIZERS[i] for i in (0, 4, 6)], ids=_ids)
def test_nvme_steps_exactly_like_torch(
    optimizer: tuple[type[torch.optim.Optimizer], dict[str, Any]], tmp_path: Path
) -> None:
    cls, kwargs = optimizer
    # the stepping is the DRAM tests' (30 steps each); here the state goes through the disk
    offload: dict[str, Any] = {"tier": "nvme", "directory": tmp_path, "subgroup_bytes": 4 * 700}
    exact, ours, _ = _run_pair(cls, kwargs, steps=NVME_STEPS, **offload)
    with ours:
        assert exact
        assert ours.committed_step == NVME_STEPS


def test_bf16_params_step_like_torch_on_fp32_masters() -> None:
    """bf16 parameters: the reference is torch's AdamW on fp32 copies of them, given the bf16
    gradients (cast) and cast back to bf16 after each step."""
    model, shadow = make_model(dtype=torch.bfloat16), make_model(dtype=torch.bfloat16)
    masters = make_model(dtype=torch.bfloat16).float()
    with OffloadedOptimizer(
        groups(model), torch.optim.AdamW, subgroup_bytes=4 * 97, lr=0.01
    ) as ours:
        train(model, ours, 10)
        train(shadow, _Shadowed(torch.optim.AdamW(groups(masters), lr=0.01), masters, shadow), 10)
        assert same_params(model, shadow)
        saved = ours.state_dict()["state"]
        in_order = [p for group in groups(masters) for p in group["params"]]
        for index, master in enumerate(in_order):
            assert torch.equal(saved[index]["master"], master)


class _Shadowed(torch.optim.Optimizer):
    """What mixed-precision training with fp32 masters does by hand: step ``inner`` over the
    fp32 ``masters`` with the bf16 ``model``'s gradients, then cast the masters into it."""

    def __init__(
        self, inner: torch.optim.Optimizer, masters: torch.nn.Module, model: torch.nn.Module
    ) -> None:
        self.inner, self.masters, self.model = inner, masters, model
        self.param_groups = inner.param_groups
        self.defaults = inner.defaults
        self.state = inner.state

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        pairs = list(zip(self.model.parameters(), self.masters.parameters(), strict=True))
        for p, m in pairs:
            m.grad = None if p.grad is None else p.grad.float()
        self.inner.step()
        for p, m in pairs:
            p.copy_(m)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.model.zero_grad(set_to_none)
