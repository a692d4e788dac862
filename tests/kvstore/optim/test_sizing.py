"""Automatic subgroup sizes: enough subgroups for the pipeline to overlap, within bounds and
within the host budget; the optimizer uses them when ``subgroup_bytes`` is not given."""

from __future__ import annotations

import pytest
import torch

from kvstore.optim import OffloadedOptimizer
from kvstore.optim.sizing import (
    MAX_SUBGROUP_BYTES,
    MIN_SUBGROUP_BYTES,
    TARGET_SUBGROUPS,
    auto_subgroup_bytes,
)

MB = 10**6


@pytest.mark.parametrize(
    ("params", "want"),
    [
        (1_000, MIN_SUBGROUP_BYTES),  # a small model: one subgroup of the minimum
        (100 * MB, 4 * 100 * MB // TARGET_SUBGROUPS),  # 100M: 16 subgroups of ~25 MB
        (500 * MB, MAX_SUBGROUP_BYTES),  # 500M: capped, ~30 subgroups
    ],
)
def test_subgroups_are_many_enough_and_bounded(params: int, want: int) -> None:
    got = auto_subgroup_bytes(4 * params, 3)
    assert got % 4096 == 0 and abs(got - want) < 4096


def test_the_host_budget_lowers_the_subgroup() -> None:
    budget = 40 << 20
    got = auto_subgroup_bytes(4 * 100 * MB, 3, budget)
    assert 3 * 3 * got + got <= budget  # three objects of three sections and the gradients
    assert got < 4 * 100 * MB // TARGET_SUBGROUPS
    assert auto_subgroup_bytes(4 * 100 * MB, 2, budget) > got  # fewer sections stored


def test_the_optimizer_sizes_its_subgroups_itself() -> None:
    params = [torch.nn.Parameter(torch.zeros(3 << 20)) for _ in range(2)]  # 24 MiB fp32
    with OffloadedOptimizer(params, torch.optim.AdamW, resident=False) as opt:
        assert opt.subgroup_bytes == MIN_SUBGROUP_BYTES
        assert len(opt.subgroups) == 3  # 24 MiB in 8 MiB pieces
    budget = 3 * 3 * (1 << 20) + (1 << 20)
    with OffloadedOptimizer(params, resident=False, host_budget_bytes=budget) as opt:
        assert opt.staging.host_bytes <= budget and len(opt.staging.slots) == 3
