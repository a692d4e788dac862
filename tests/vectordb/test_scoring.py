"""ProbeScores against a plain model: per query, every live record of its lists, each id once
at its nearest copy, sorted, the first k. Random lists share ids (replicas), carry stale
copies, and are probed by random subsets of the queries; all three metrics."""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from vectordb.dot_kernel import VectorSpan
from vectordb.metric import Metric, pairwise_distances, prepare
from vectordb.posting_format import record_dtype
from vectordb.scoring import ProbeScores
from vectordb.version_map import VersionMap

DIM = 6


def _lists(rng: np.random.Generator, n_lists: int, n_ids: int, dtype: str) -> list[np.ndarray]:
    """Posting lists: each id at most once per list, some copies stale (version 1, current 2)."""
    out = []
    vectors = rng.normal(size=(n_ids, DIM)).astype(np.float32)
    for _ in range(n_lists):
        n = int(rng.integers(0, min(n_ids, 12) + 1))
        ids = rng.choice(n_ids, n, replace=False)
        records = np.zeros(n, record_dtype(DIM, dtype))
        records["id"] = ids
        records["version"] = np.where(rng.random(n) < 0.2, 1, 2)
        records["vector"] = vectors[ids]
        out.append(records)
    return out


def _model(
    metric: Metric, queries: np.ndarray, lists: list[np.ndarray], probes: list[list[int]], k: int
) -> list[list[tuple[float, int]]]:
    answers = []
    for q, mine in enumerate(probes):
        best: dict[int, float] = {}
        for u in mine:
            records = lists[u][lists[u]["version"] == 2]
            if not len(records):
                continue
            vectors = records["vector"].astype(np.float32)
            dist = pairwise_distances(metric, queries[q : q + 1], vectors)[0]
            for i, d in zip(records["id"].tolist(), dist.tolist(), strict=True):
                best[i] = min(best.get(i, np.inf), d)
        answers.append(sorted((d, i) for i, d in best.items())[:k])
    return answers


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    metric=st.sampled_from(list(Metric)),
    dtype=st.sampled_from(["float32", "float16", "uint8"]),
    n_queries=st.integers(1, 6),
    n_lists=st.integers(1, 8),
    width=st.integers(1, 5),
    k=st.integers(1, 12),
    groups=st.integers(1, 3),
)
def test_top_k_matches_the_model(
    seed: int,
    metric: Metric,
    dtype: str,
    n_queries: int,
    n_lists: int,
    width: int,
    k: int,
    groups: int,
) -> None:
    rng = np.random.default_rng(seed)
    lists = _lists(rng, n_lists, n_ids=20, dtype=dtype)
    queries = prepare(metric, rng.normal(size=(n_queries, DIM)).astype(np.float32))
    probes = [
        sorted(rng.choice(n_lists, int(rng.integers(0, min(width, n_lists) + 1)), replace=False))
        for _ in range(n_queries)
    ]
    # the search's layout: probes sorted by list, each with its query and its slot
    pairs = sorted((u, q, j) for q, mine in enumerate(probes) for j, u in enumerate(mine))
    list_of = np.array([u for u, _, _ in pairs], np.int64)
    probe_query = np.array([q for _, q, _ in pairs], np.int64)
    probe_slot = np.array([j for _, _, j in pairs], np.int64)
    bounds = np.searchsorted(list_of, np.arange(n_lists + 1))
    longest = max(len(r) for r in lists)
    scores = ProbeScores(metric, queries, probe_query, list_of, bounds, longest)
    versions = VersionMap(np.arange(20), np.full(20, 2, np.uint32))
    edges = np.linspace(0, n_lists, groups + 1).astype(int)
    for first, stop in reversed(list(itertools.pairwise(edges))):  # any order
        mine = lists[first:stop]
        span = VectorSpan.of_records(mine)
        scores.add(int(first), span.counts, ProbeScores.live_mask(mine, versions), [(0, span)])
    ids, dist = scores.best(probe_query, probe_slot, queries, width, k)

    for q, expected in enumerate(_model(metric, queries, lists, probes, k)):
        found = [(float(d), int(i)) for d, i in zip(dist[q], ids[q], strict=True) if i >= 0]
        assert len(found) == len(expected)
        assert len({i for _, i in found}) == len(found)  # each id once
        np.testing.assert_allclose(
            [d for d, _ in found], [d for d, _ in expected], rtol=1e-4, atol=1e-4
        )
        assert (ids[q, len(found) :] == -1).all() and np.isinf(dist[q, len(found) :]).all()
        live_counts = scores.live_counts
        assert live_counts.tolist() == [int((r["version"] == 2).sum()) for r in lists]
