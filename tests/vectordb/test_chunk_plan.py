"""chunk_plan against plain models. query_chunks: consecutive ranges covering every query, each
range's union of list pages within the read budget (unless it is one query) and its queries
within the cell budget, each as long as it can be (one more query would not fit).
locality_order: early queries first, the rest by nearest head."""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from vectordb.chunk_plan import locality_order, query_chunks


class _Store:
    def __init__(self, pages: np.ndarray) -> None:
        self.count = pages * 3  # 3 records a page: only the ratio matters here
        self._pages = pages

    def pages_of(self, pids: np.ndarray) -> np.ndarray:
        return self._pages[pids]


@settings(max_examples=80, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    n_queries=st.integers(1, 40),
    width=st.integers(1, 6),
    budget_pages=st.integers(1, 60),
    cell_budget=st.sampled_from([1, 200, 1000, 1 << 22]),
)
def test_chunks_fit_the_budgets_and_are_maximal(
    seed: int, n_queries: int, width: int, budget_pages: int, cell_budget: int
) -> None:
    rng = np.random.default_rng(seed)
    n_lists = 15
    pages = rng.integers(1, 8, n_lists)
    pids = rng.integers(0, n_lists, (n_queries, width))
    keep = rng.random((n_queries, width)) < 0.8
    store = _Store(pages)
    chunks = query_chunks(store, pids, keep, budget_pages, cell_budget)  # type: ignore[arg-type]
    longest = max(int(store.count[pids[keep]].max(initial=1)), 1)
    most_queries = max(1, cell_budget // (width * longest))

    def union_pages(rows: slice) -> int:
        return int(sum(pages[p] for p in set(pids[rows][keep[rows]].tolist())))

    assert chunks[0].start == 0 and chunks[-1].stop == n_queries
    for a, b in itertools.pairwise(chunks):
        assert a.stop == b.start
    for chunk in chunks:
        assert 0 < chunk.stop - chunk.start <= most_queries
        if chunk.stop - chunk.start > 1:
            assert union_pages(chunk) <= budget_pages
        if chunk.stop < n_queries:  # one more query would not fit
            longer = slice(chunk.start, chunk.stop + 1)
            full = chunk.stop - chunk.start == most_queries
            assert full or union_pages(longer) > budget_pages


@settings(max_examples=50, deadline=None)
@given(
    nearest=st.lists(st.integers(-1, 40), min_size=0, max_size=60),
    early=st.integers(0, 60),
)
def test_locality_order_keeps_early_queries_and_sorts_the_rest(
    nearest: list[int], early: int
) -> None:
    """A permutation: the queries whose lists were read early stay first, as given; the rest
    follow by nearest head, ties in their given order."""
    early = min(early, len(nearest))
    pids = np.stack([np.array(nearest, np.int64), np.zeros(len(nearest), np.int64)], axis=1)
    order = locality_order(pids.reshape(len(nearest), 2), early)
    assert sorted(order.tolist()) == list(range(len(nearest)))
    assert order[:early].tolist() == list(range(early))
    rest = order[early:]
    model = sorted(range(early, len(nearest)), key=lambda q: (nearest[q], q))
    assert rest.tolist() == model
