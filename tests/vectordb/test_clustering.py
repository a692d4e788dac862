"""Head selection (hierarchical k-means, one medoid per leaf) and the 2-means used by splits."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.vectordb.helpers import clustered
from vectordb.clustering import select_heads, two_means

DIM = 8


@pytest.mark.parametrize(("n", "fraction"), [(1200, 0.1), (2000, 0.02), (400, 0.3), (1000, 0.12)])
def test_select_heads_count_and_shape(n: int, fraction: float) -> None:
    x = clustered(n, DIM, seed=n)
    progress: list[int] = []
    heads = select_heads(x, fraction, seed=1, on_progress=progress.append)
    assert heads.dtype == np.int64
    assert len(np.unique(heads)) == len(heads), "unique"
    assert heads.min() >= 0 and heads.max() < n
    assert 0.5 * n * fraction <= len(heads) <= 1.5 * n * fraction, len(heads)
    # every row lands in exactly one leaf, and each leaf gives one head
    assert sum(progress) == n
    assert len(progress) == len(heads)


def test_heads_cover_every_blob_and_are_central() -> None:
    """On well separated blobs every blob gets heads, and each head is a central member (the
    member nearest its leaf's mean), not an outlier."""
    rng = np.random.default_rng(3)
    centres = rng.normal(size=(10, DIM)).astype(np.float32) * 100
    labels = rng.integers(10, size=1000)
    x = centres[labels] + rng.normal(size=(1000, DIM)).astype(np.float32)
    heads = select_heads(x, 0.05, seed=0)
    assert set(labels[heads].tolist()) == set(range(10))
    to_centre = np.linalg.norm(x - centres[labels], axis=1)
    assert np.median(to_centre[heads]) < np.median(to_centre)


@given(seed=st.integers(0, 2**31 - 1), n=st.integers(1, 200))
@settings(max_examples=15, deadline=None)
def test_select_heads_deterministic(seed: int, n: int) -> None:
    x = clustered(n, DIM, seed=7)
    a = select_heads(x, 0.1, seed=seed)
    b = select_heads(x.copy(), 0.1, seed=seed)
    np.testing.assert_array_equal(a, b)
    assert len(a) >= 1 and len(np.unique(a)) == len(a) and a.max() < n


def test_select_heads_small_inputs() -> None:
    assert select_heads(np.zeros((0, DIM), np.float32), 0.1).shape == (0,)
    assert select_heads(np.ones((1, DIM), np.float32), 0.1).tolist() == [0]
    # fraction 1: leaves of at most 2 rows (the limit is ~1.9x the mean leaf)
    x = clustered(50, DIM, seed=0)
    heads = select_heads(x, 1.0)
    assert 25 <= len(heads) <= 50 and len(np.unique(heads)) == len(heads)


def test_select_heads_duplicates_terminate() -> None:
    """All rows identical: k-means cannot separate them; leaves are cut by position."""
    x = np.ones((600, DIM), np.float32)
    heads = select_heads(x, 0.05, seed=0)
    assert len(np.unique(heads)) == len(heads)
    assert 0.5 * 600 * 0.05 <= len(heads) <= 1.5 * 600 * 0.05


def _check_two_sides(labels: np.ndarray, n: int) -> None:
    assert labels.shape == (n,)
    assert set(np.unique(labels).tolist()) <= {0, 1}
    if n >= 2:
        assert labels.min() == 0 and labels.max() == 1


@pytest.mark.parametrize("seed", range(5))
def test_two_means_separates_far_blobs(seed: int) -> None:
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 80, 2)
    a = rng.normal(size=(sizes[0], DIM)).astype(np.float32)
    b = rng.normal(size=(sizes[1], DIM)).astype(np.float32) + 50
    x = np.concatenate([a, b])
    perm = rng.permutation(len(x))
    truth = (perm >= sizes[0]).astype(np.int64)
    labels = two_means(x[perm], seed=seed)
    _check_two_sides(labels, len(x))
    assert (labels == truth).all() or (labels == 1 - truth).all()


@given(
    n=st.integers(0, 60),
    distinct=st.integers(1, 4),
    seed=st.integers(0, 1000),
)
@settings(max_examples=40, deadline=None)
def test_two_means_both_sides_non_empty(n: int, distinct: int, seed: int) -> None:
    """Any data, including heavy duplicates: both sides non-empty whenever n >= 2."""
    rng = np.random.default_rng(seed)
    points = rng.normal(size=(distinct, DIM)).astype(np.float32)
    x = points[rng.integers(distinct, size=n)]
    labels = two_means(x, seed=seed)
    _check_two_sides(labels, n)
    if n >= 2 and len(np.unique(x, axis=0)) == 2:  # two distinct points: split along them
        for value in np.unique(x, axis=0):
            same = (x == value).all(axis=1)
            assert len(np.unique(labels[same])) == 1


def test_two_means_identical_points() -> None:
    for n in [2, 3, 10]:
        labels = two_means(np.full((n, DIM), 3.0, np.float32))
        _check_two_sides(labels, n)
        assert labels.sum() == n - n // 2
    assert two_means(np.ones((1, DIM), np.float32)).tolist() == [0]
    assert two_means(np.ones((0, DIM), np.float32)).shape == (0,)


def test_heads_come_in_depth_first_order() -> None:
    """Heads next to each other in the returned order are near each other in space (the order
    is the k-means tree's depth-first order; posting lists are laid out on disk in it): with
    two levels of clusters, consecutive heads are far closer than random pairs."""
    rng = np.random.default_rng(5)
    groups = rng.normal(size=(8, DIM)).astype(np.float32) * 1000
    blobs = groups.repeat(8, axis=0) + rng.normal(size=(64, DIM)).astype(np.float32) * 30
    x = blobs[rng.integers(64, size=20_000)] + rng.normal(size=(20_000, DIM)).astype(np.float32)
    heads = select_heads(x, 0.01, seed=0)  # ~200 leaves: more than one k-means level
    gaps = np.linalg.norm(np.diff(x[heads], axis=0), axis=1)
    shuffled = x[rng.permutation(heads)]
    random_gaps = np.linalg.norm(np.diff(shuffled, axis=0), axis=1)
    assert np.median(gaps) < 0.1 * np.median(random_gaps)
