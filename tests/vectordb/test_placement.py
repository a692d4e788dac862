"""place(): SPANN's closure with the RNG rule, checked against a plain recomputation of the rule
for every row: accepted heads are distinct, nearest first, padded with -1, at most
replica_count, and no accepted head is "covered" by an earlier accepted one."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.vectordb.helpers import clustered
from vectordb.config import IndexConfig
from vectordb.metric import Metric, pairwise_distances, prepare
from vectordb.navigator import Navigator
from vectordb.placement import place

DIM = 8


def _setup(
    metric: Metric, n_heads: int, seed: int, kind: str = "flat"
) -> tuple[Navigator, np.ndarray, np.ndarray]:
    heads = prepare(metric, clustered(n_heads, DIM, seed=seed, clusters=6))
    pids = np.arange(n_heads, dtype=np.int64) * 2 + 1  # not positions
    nav = Navigator(DIM, metric, kind=kind)
    nav.add(heads, pids)
    return nav, heads, pids


def _sq_l2(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    return ((a64[:, None, :] - b64[None, :, :]) ** 2).sum(-1)


def _check_rule(
    out: np.ndarray,
    x: np.ndarray,
    heads: np.ndarray,
    pids: np.ndarray,
    config: IndexConfig,
    exact_nearest: bool = True,
) -> None:
    metric = Metric(config.metric)
    assert out.shape == (len(x), config.replica_count)
    assert out.dtype == np.int64
    row_of = {p: r for r, p in enumerate(pids.tolist())}
    d_xh = _sq_l2(x, heads)  # squared L2 in every metric (placement's geometric reading)
    d_hh = _sq_l2(heads, heads)
    internal = pairwise_distances(metric, x, heads)
    tol = 1e-3
    for i, row in enumerate(out.tolist()):
        chosen = [p for p in row if p >= 0]
        assert row == chosen + [-1] * (len(row) - len(chosen)), "padding only at the end"
        assert chosen, "every vector goes somewhere"
        assert len(set(chosen)) == len(chosen)
        rows = [row_of[p] for p in chosen]
        if exact_nearest:  # first replica: the nearest head in the index's own metric
            assert internal[i, rows[0]] <= internal[i].min() + tol
        for j, h in enumerate(rows):
            if j:  # the closure: no replica much farther than the nearest head
                assert d_xh[i, h] <= config.closure * d_xh[i, rows[0]] + tol * (1 + d_xh[i, h])
            for a in rows[:j]:
                # h was accepted after a: a does not cover it
                scale = tol * (1 + d_xh[i, h])
                assert config.rng_factor * d_hh[h, a] >= d_xh[i, h] - scale, (i, j)


@pytest.mark.parametrize("metric", [Metric.L2, Metric.IP, Metric.COSINE])
@pytest.mark.parametrize("rng_factor", [0.5, 1.0, 2.0])
def test_rng_rule_holds_for_every_accepted_pair(metric: Metric, rng_factor: float) -> None:
    nav, heads, pids = _setup(metric, 120, seed=1)
    config = IndexConfig(dim=DIM, metric=metric, replica_count=6, rng_factor=rng_factor,
                         candidate_heads=32)  # fmt: skip
    x = prepare(metric, clustered(300, DIM, seed=2, clusters=6))
    out = place(x, nav, config)
    _check_rule(out, x, heads, pids, config)
    if metric is not Metric.IP:  # a stricter rule (larger factor) keeps more replicas
        assert (out >= 0).sum(axis=1).mean() > 1.0


def test_rng_rule_is_a_complete_greedy_scan() -> None:
    """Recompute the greedy rule over the 16 nearest candidates in plain Python: the result
    must be exactly place()'s (no accepted head missing, none extra)."""
    nav, heads, pids = _setup(Metric.L2, 80, seed=3)
    config = IndexConfig(dim=DIM, replica_count=5, rng_factor=1.0, candidate_heads=16)
    x = clustered(100, DIM, seed=4, clusters=6)
    out = place(x, nav, config)
    d_xh = _sq_l2(x, heads)
    d_hh = _sq_l2(heads, heads)
    for i in range(len(x)):
        candidates = np.argsort(d_xh[i], kind="stable")[:16]
        accepted: list[int] = []
        for h in candidates.tolist():
            if len(accepted) == config.replica_count:
                break
            if accepted and d_xh[i, h] > config.closure * d_xh[i, candidates[0]]:
                continue
            if all(config.rng_factor * d_hh[h, a] >= d_xh[i, h] for a in accepted):
                accepted.append(h)
        want = [int(pids[h]) for h in accepted]
        got = [p for p in out[i].tolist() if p >= 0]
        assert got == want, i


@given(
    n_heads=st.integers(1, 40),
    replica_count=st.integers(1, 8),
    rng_factor=st.floats(0.25, 4.0),
    closure=st.one_of(st.floats(1.0, 4.0), st.just(float("inf"))),
    metric=st.sampled_from([Metric.L2, Metric.IP, Metric.COSINE]),
    seed=st.integers(0, 1000),
)
@settings(max_examples=40, deadline=None)
def test_place_properties(
    n_heads: int, replica_count: int, rng_factor: float, closure: float, metric: Metric, seed: int
) -> None:
    nav, heads, pids = _setup(metric, n_heads, seed=seed)
    config = IndexConfig(dim=DIM, metric=metric, replica_count=replica_count,
                         rng_factor=rng_factor, closure=closure,
                         candidate_heads=max(replica_count, 8))  # fmt: skip
    x = prepare(metric, clustered(30, DIM, seed=seed + 1, clusters=6))
    _check_rule(place(x, nav, config), x, heads, pids, config)


def test_hnsw_navigator_placement() -> None:
    nav, heads, pids = _setup(Metric.L2, 300, seed=5, kind="hnsw")
    config = IndexConfig(dim=DIM, replica_count=4, candidate_heads=16)
    x = clustered(200, DIM, seed=6, clusters=6)
    out = place(x, nav, config)
    _check_rule(out, x, heads, pids, config, exact_nearest=False)
    nearest = pids[np.argmin(_sq_l2(x, heads), axis=1)]
    assert (out[:, 0] == nearest).mean() >= 0.95


def test_chunks_and_removed_heads() -> None:
    """More rows than one chunk (512); removed heads are never chosen."""
    nav, heads, pids = _setup(Metric.L2, 60, seed=7)
    gone = pids[::3]
    nav.remove(gone.tolist())
    keep = np.isin(pids, gone, invert=True)
    config = IndexConfig(dim=DIM, replica_count=3, candidate_heads=8)
    x = clustered(1100, DIM, seed=8, clusters=6)
    out = place(x, nav, config)
    assert not np.isin(out, gone).any()
    _check_rule(out, x, heads[keep], pids[keep], config)
    # the same rows placed one chunk at a time give the same answer
    parts = np.concatenate([place(x[s : s + 100], nav, config) for s in range(0, 1100, 100)])
    np.testing.assert_array_equal(out, parts)


def test_degenerate_inputs() -> None:
    config = IndexConfig(dim=DIM, replica_count=3, candidate_heads=8)
    empty_nav = Navigator(DIM, Metric.L2, kind="flat")
    out = place(np.ones((4, DIM), np.float32), empty_nav, config)
    assert out.shape == (4, 3) and (out == -1).all()
    nav, _, _ = _setup(Metric.L2, 5, seed=9)
    assert place(np.zeros((0, DIM), np.float32), nav, config).shape == (0, 3)
    # a single head: everything goes there, once
    one = Navigator(DIM, Metric.L2, kind="flat")
    one.add(np.zeros((1, DIM), np.float32), np.array([42]))
    out = place(clustered(10, DIM, seed=0), one, config)
    assert (out[:, 0] == 42).all() and (out[:, 1:] == -1).all()
