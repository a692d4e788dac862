"""Epoch order and rank slices: pure functions of (seed, epoch), disjoint, equal, complete."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dataload.order import RankPlan, epoch_order, rank_slice
from tiers.io.errors import InvalidArgumentError


def test_same_seed_and_epoch_same_order_next_epoch_differs() -> None:
    a = epoch_order(1000, seed=3, epoch=5)
    assert np.array_equal(a, epoch_order(1000, seed=3, epoch=5))
    assert not np.array_equal(a, epoch_order(1000, seed=3, epoch=6))
    assert not np.array_equal(a, epoch_order(1000, seed=4, epoch=5))
    assert np.array_equal(np.sort(a), np.arange(1000))


def test_no_shuffle_is_index_order() -> None:
    assert epoch_order(5, 0, 3, shuffle=False).tolist() == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("world_size", [1, 2, 3, 8])
@pytest.mark.parametrize("remainder", ["pad", "drop"])
@pytest.mark.parametrize("num_samples", [1, 7, 24, 101])
def test_ranks_are_disjoint_equal_and_complete(
    world_size: int, remainder: str, num_samples: int
) -> None:
    if remainder == "drop" and num_samples < world_size:
        pytest.skip("dropping leaves nothing")
    order = epoch_order(num_samples, seed=1, epoch=0)
    shares = [rank_slice(order, r, world_size, remainder) for r in range(world_size)]
    assert len({len(s) for s in shares}) == 1  # equal lengths: DDP never waits
    seen = np.concatenate(shares)
    counts = np.bincount(seen, minlength=num_samples)
    if remainder == "drop":
        assert counts.max() == 1 and counts.sum() == num_samples // world_size * world_size
    else:
        assert counts.min() >= 1  # every sample seen
        assert counts.sum() - num_samples == (-num_samples) % world_size  # only the padding twice


@given(
    num_samples=st.integers(1, 500),
    world_size=st.integers(1, 9),
    batch_size=st.integers(1, 40),
    drop_last=st.booleans(),
    remainder=st.sampled_from(["pad", "drop"]),
)
@settings(max_examples=60, deadline=None)
def test_plan_batches_cover_each_rank_share(
    num_samples: int, world_size: int, batch_size: int, drop_last: bool, remainder: str
) -> None:
    if remainder == "drop" and num_samples < world_size:
        return
    plans = [
        RankPlan(num_samples, batch_size, 9, r, world_size, remainder, drop_last)
        for r in range(world_size)
    ]
    assert len({len(p) for p in plans}) == 1  # the same number of batches at every rank
    per_rank = [p.indices(2) for p in plans]
    for plan, indices in zip(plans, per_rank, strict=True):
        assert len(indices) == plan.samples_per_epoch
        if drop_last:
            assert len(indices) % batch_size == 0
    union = np.concatenate(per_rank)
    if remainder == "drop" or world_size == 1:
        assert len(np.unique(union)) == len(union)  # nothing twice
    if not drop_last and remainder == "pad":
        assert set(union.tolist()) == set(range(num_samples))  # nothing missed


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(InvalidArgumentError):
        rank_slice(np.arange(4), 2, 2)
    with pytest.raises(InvalidArgumentError):
        rank_slice(np.arange(4), 0, 2, "round")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        RankPlan(10, 0)
    with pytest.raises(InvalidArgumentError):
        epoch_order(10, seed=-1, epoch=0)
