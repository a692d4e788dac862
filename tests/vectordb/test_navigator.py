"""Navigator (flat scan, float32 or bfloat16-bounded, and faiss HNSW) against brute force in
numpy: nearest heads, removal, rebuild after many removals, vectors_of and snapshot."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import vectordb.navigator as navigator_module
from tests.vectordb.helpers import clustered
from vectordb import head_scan
from vectordb.metric import Metric, pairwise_distances, prepare
from vectordb.navigator import Navigator

DIM = 16
METRICS = [Metric.L2, Metric.IP, Metric.COSINE]
SCANS = ["float32", "bfloat16"]


@contextmanager
def _scan(kind: str) -> Iterator[None]:
    """The flat scan forced to one kind whatever the size and the CPU (bfloat16 needs torch:
    without native bfloat16 it is slow, not wrong)."""
    if kind == "bfloat16":
        pytest.importorskip("torch")
    saved = navigator_module.BFLOAT16_FROM_CELLS, head_scan.bfloat16_is_native
    navigator_module.BFLOAT16_FROM_CELLS = 0 if kind == "bfloat16" else 1 << 62
    head_scan.bfloat16_is_native = lambda: kind == "bfloat16"  # type: ignore[assignment]
    try:
        yield
    finally:
        navigator_module.BFLOAT16_FROM_CELLS, head_scan.bfloat16_is_native = saved


def _heads(n: int, metric: Metric, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(pids, prepared vectors): pids deliberately not 0..n-1."""
    vectors = prepare(metric, clustered(n, DIM, seed=seed))
    pids = np.random.default_rng(seed).permutation(n).astype(np.int64) * 3 + 100
    return pids, vectors


def _truth(
    metric: Metric, pids: np.ndarray, vectors: np.ndarray, queries: np.ndarray, k: int
) -> tuple[np.ndarray, np.ndarray]:
    dist = pairwise_distances(metric, queries, vectors).astype(np.float64)
    if metric is Metric.L2:  # exact, without the norm-expansion rounding
        dist = ((queries[:, None, :] - vectors[None, :, :]).astype(np.float64) ** 2).sum(-1)
    order = np.argsort(dist, axis=1, kind="stable")[:, :k]
    return pids[order], np.take_along_axis(dist, order, axis=1)


def _check_flat_exact(
    nav: Navigator, pids: np.ndarray, vectors: np.ndarray, queries: np.ndarray, k: int
) -> None:
    """Flat search is exact: the returned distances are the k smallest (ties may swap pids),
    each returned pid's true distance matches its reported one, nearest first."""
    got, dist = nav.search(queries, k)
    want_pids, want_dist = _truth(nav.metric, pids, vectors, queries, k)
    take = min(k, len(pids))
    _check_padding(got, dist, k, take)
    got, dist = got[:, :take], dist[:, :take]
    assert (got >= 0).all()
    assert (np.diff(dist, axis=1) >= -1e-5).all()
    np.testing.assert_allclose(dist, want_dist, rtol=1e-4, atol=1e-3)
    by_pid = dict(zip(pids.tolist(), range(len(pids)), strict=True))
    rows = np.array([[by_pid[p] for p in row] for row in got.tolist()]).reshape(got.shape)
    true_of_got = pairwise_distances(nav.metric, queries, vectors)
    np.testing.assert_allclose(np.take_along_axis(true_of_got, rows, axis=1), dist,
                               rtol=1e-4, atol=1e-3)  # fmt: skip
    for row in got:
        assert len(set(row.tolist())) == take
    # the nearest one is the true nearest (no ties in continuous random data)
    np.testing.assert_array_equal(got[:, 0], want_pids[:, 0])


def _check_padding(got: np.ndarray, dist: np.ndarray, k: int, live: int) -> None:
    """At least min(k, live) columns (at most k: a navigator may trim columns it could never
    fill), anything past the live heads padded with -1 / +inf."""
    assert got.shape == dist.shape
    assert min(k, live) <= got.shape[1] <= k
    assert (got[:, live:] == -1).all() and np.isinf(dist[:, live:]).all()


@pytest.mark.parametrize("scan", SCANS)
@pytest.mark.parametrize("metric", METRICS)
def test_flat_is_exact(metric: Metric, scan: str) -> None:
    pids, vectors = _heads(300, metric)
    with _scan(scan):
        nav = Navigator(DIM, metric, kind="flat")
        nav.add(vectors[:100], pids[:100])
        nav.add(vectors[100:], pids[100:])  # grows its buffer
        assert nav.n_heads == 300
        queries = prepare(metric, clustered(40, DIM, seed=7))
        for k in [1, 5, 17]:
            _check_flat_exact(nav, pids, vectors, queries, k)
        assert (nav._bfloat is not None) == (scan == "bfloat16")


def test_bfloat16_copy_counts_as_resident() -> None:
    pids, vectors = _heads(300, Metric.L2)
    sizes = {}
    for scan in SCANS:
        with _scan(scan):
            nav = Navigator(DIM, Metric.L2, kind="flat")
            nav.add(vectors, pids)
            sizes[scan] = nav.resident_bytes()  # before the copy is made: counted already
            nav.search(vectors[:2], 3)
            assert nav.resident_bytes() == sizes[scan]
    assert sizes["bfloat16"] - sizes["float32"] == len(nav._flat) * (2 * DIM + 12)


def test_flat_fewer_heads_than_k_pads() -> None:
    pids, vectors = _heads(3, Metric.L2)
    nav = Navigator(DIM, Metric.L2, kind="flat")
    nav.add(vectors, pids)
    got, dist = nav.search(vectors, 5)
    assert len(got) == 3
    _check_padding(got, dist, 5, 3)
    np.testing.assert_array_equal(got[:, 0], pids)  # each head is its own nearest


def test_empty_navigator() -> None:
    for kind in ["flat", "hnsw"]:
        nav = Navigator(DIM, Metric.L2, kind=kind)
        got, dist = nav.search(np.zeros((2, DIM), np.float32), 4)
        assert len(got) == 2 and got.shape[1] >= 1
        assert (got == -1).all() and np.isinf(dist).all()
        assert len(nav.search(np.zeros((0, DIM), np.float32), 4)[0]) == 0
        snap_pids, snap_vectors = nav.snapshot()
        assert snap_pids.shape == (0,) and snap_vectors.shape == (0, DIM)


def _recall(found: np.ndarray, truth: np.ndarray) -> float:
    hits = [len(set(f.tolist()) & set(t.tolist())) for f, t in zip(found, truth, strict=True)]
    return sum(hits) / truth.size


@pytest.mark.parametrize("metric", METRICS)
def test_hnsw_recall(metric: Metric) -> None:
    pids, vectors = _heads(1500, metric, seed=1)
    nav = Navigator(DIM, metric, kind="hnsw")
    nav.add(vectors, pids)
    queries = prepare(metric, clustered(100, DIM, seed=8))
    got, dist = nav.search(queries, 10)
    want, _ = _truth(metric, pids, vectors, queries, 10)
    assert _recall(got, want) >= 0.95
    assert (got >= 0).all()
    # reported distances are the internal ones for the returned pids
    row_of = {p: r for r, p in enumerate(pids.tolist())}
    rows = np.vectorize(row_of.__getitem__)(got)
    true = np.take_along_axis(pairwise_distances(metric, queries, vectors), rows, axis=1)
    np.testing.assert_allclose(dist, true, rtol=1e-3, atol=1e-3)
    assert (np.diff(dist, axis=1) >= -1e-4).all()


@given(data=st.data())
@settings(max_examples=40, deadline=None)
def test_flat_remove_against_model(data: st.DataObject) -> None:
    """Random adds and removes, searches between them; either flat scan is exact over exactly
    the live heads (the bfloat16 copy is remade after every change)."""
    with _scan(data.draw(st.sampled_from(SCANS), label="scan")):
        _remove_against_model(data)


def _remove_against_model(data: st.DataObject) -> None:
    metric = data.draw(st.sampled_from(METRICS), label="metric")
    pids, vectors = _heads(120, metric, seed=data.draw(st.integers(0, 3), label="seed"))
    nav = Navigator(DIM, metric, kind="flat")
    live: list[int] = []  # rows of pids/vectors in the navigator
    added = 0
    for _ in range(data.draw(st.integers(1, 6), label="steps")):
        n_add = data.draw(st.integers(0, min(30, len(pids) - added)), label="add")
        nav.add(vectors[added : added + n_add], pids[added : added + n_add])
        live += range(added, added + n_add)
        added += n_add
        if live:
            gone = data.draw(st.lists(st.sampled_from(live), unique=True, max_size=len(live)),
                             label="remove")  # fmt: skip
            nav.remove([int(pids[r]) for r in gone])
            live = [r for r in live if r not in gone]
        assert nav.n_heads == len(live)
        queries = prepare(metric, clustered(8, DIM, seed=added))
        if live:
            k = data.draw(st.integers(1, 7), label="k")  # small k: bfloat16 from 8k heads
            _check_flat_exact(nav, pids[live], vectors[live], queries, k)
            np.testing.assert_array_equal(nav.vectors_of(pids[live]), vectors[live])
        else:
            assert (nav.search(queries, 3)[0] == -1).all()
        snap_pids, snap_vectors = nav.snapshot()
        order = np.argsort(snap_pids)
        want = sorted(live, key=lambda r: pids[r])
        np.testing.assert_array_equal(snap_pids[order], pids[want])
        np.testing.assert_array_equal(snap_vectors[order], vectors[want])


@pytest.mark.parametrize("metric", [Metric.L2, Metric.COSINE])
def test_hnsw_removed_heads_never_returned_and_rebuild(metric: Metric) -> None:
    pids, vectors = _heads(800, metric, seed=2)
    nav = Navigator(DIM, metric, kind="hnsw")
    nav.add(vectors, pids)
    queries = prepare(metric, clustered(60, DIM, seed=9))
    rng = np.random.default_rng(0)
    removed: set[int] = set()
    rebuilt = False
    for batch in np.array_split(rng.permutation(800)[:500], 10):
        nav.remove(pids[batch].tolist())
        removed |= set(pids[batch].tolist())
        rebuilt |= nav._dead == 0
        keep = np.array([p not in removed for p in pids.tolist()])
        assert nav.n_heads == keep.sum()
        # queries right at removed heads: the head itself must not come back
        at_removed = vectors[batch[:20]]
        for q in [queries, at_removed]:
            got, dist = nav.search(q, 10)
            assert not removed & set(got.ravel().tolist())
            assert (got >= 0).all()  # enough live heads remain to fill k
            assert np.isfinite(dist).all()
            want, _ = _truth(metric, pids[keep], vectors[keep], q, 10)
            assert _recall(got, want) >= 0.95
        np.testing.assert_allclose(nav.vectors_of(pids[keep][:50]), vectors[keep][:50],
                                   rtol=1e-6)  # fmt: skip
    assert rebuilt  # 500 of 800 removed: crossed the rebuild threshold more than once
    assert nav._index is not None and nav._index.ntotal < 800
    snap_pids, snap_vectors = nav.snapshot()
    assert set(snap_pids.tolist()) == set(pids.tolist()) - removed
    row_of = {p: r for r, p in enumerate(pids.tolist())}
    np.testing.assert_array_equal(snap_vectors, vectors[[row_of[p] for p in snap_pids.tolist()]])


def test_hnsw_add_after_removals() -> None:
    pids, vectors = _heads(400, Metric.L2, seed=4)
    nav = Navigator(DIM, Metric.L2, kind="hnsw")
    nav.add(vectors[:300], pids[:300])
    nav.remove(pids[:40].tolist())  # below the rebuild threshold: dead entries stay
    assert nav._dead == 40
    nav.add(vectors[300:], pids[300:])
    got, _ = nav.search(vectors[:40], 5)
    assert not set(pids[:40].tolist()) & set(got.ravel().tolist())
    got, _ = nav.search(vectors[300:], 1)
    assert (got[:, 0] == pids[300:]).mean() >= 0.95  # a new head finds itself
    np.testing.assert_array_equal(nav.vectors_of(pids[300:310]), vectors[300:310])


@pytest.mark.parametrize("kind", ["flat", "hnsw"])
def test_remove_or_look_up_a_non_head_raises_and_changes_nothing(kind: str) -> None:
    """A pid that is not (or no longer) a head is a KeyError, never a silent drop of another
    head (the pid -> position array holds -1 there, and -1 indexes the last slot)."""
    nav = Navigator(4, Metric.L2, kind=kind)
    nav.add(np.eye(4, dtype=np.float32)[:2], np.array([5, 9]))
    nav.remove([5])
    for bad in [[5], [3], [100], [-1], [9, 9]]:
        with pytest.raises(KeyError):
            nav.remove(bad)
    for bad_pids in [[5], [3], [100], [-1], [9, 3]]:
        with pytest.raises(KeyError):
            nav.vectors_of(np.array(bad_pids))
    assert nav.n_heads == 1
    assert nav.snapshot()[0].tolist() == [9]
    assert nav.search(np.eye(4, dtype=np.float32), 2)[0][:, 0].tolist() == [9] * 4
    np.testing.assert_array_equal(nav.vectors_of(np.array([9])), np.eye(4, dtype=np.float32)[1:2])
