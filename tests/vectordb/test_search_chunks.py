"""search._chunks against a plain model: consecutive ranges covering every query, each range's
union of list pages within the read budget (unless it is one query), each as long as it can
be (one more query would not fit), and within the cell budget."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import vectordb.search as search_module
from vectordb.posting_format import PAGE_BYTES


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
)
def test_chunks_fit_the_budget_and_are_maximal(
    seed: int, n_queries: int, width: int, budget_pages: int
) -> None:
    rng = np.random.default_rng(seed)
    n_lists = 15
    pages = rng.integers(1, 8, n_lists)
    pids = rng.integers(0, n_lists, (n_queries, width))
    keep = rng.random((n_queries, width)) < 0.8
    index = SimpleNamespace(store=_Store(pages))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(search_module, "READ_BUDGET_BYTES", budget_pages * PAGE_BYTES)
        chunks = search_module._chunks(index, pids, keep)  # type: ignore[arg-type]

    def union_pages(rows: slice) -> int:
        return int(sum(pages[p] for p in set(pids[rows][keep[rows]].tolist())))

    assert chunks[0].start == 0 and chunks[-1].stop == n_queries
    for a, b in itertools.pairwise(chunks):
        assert a.stop == b.start
    for chunk in chunks:
        assert chunk.stop > chunk.start
        if chunk.stop - chunk.start > 1:
            assert union_pages(chunk) <= budget_pages
        if chunk.stop < n_queries:  # one more query would not fit
            assert union_pages(slice(chunk.start, chunk.stop + 1)) > budget_pages


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
    order = search_module._locality_order(pids.reshape(len(nearest), 2), early)
    assert sorted(order.tolist()) == list(range(len(nearest)))
    assert order[:early].tolist() == list(range(early))
    rest = order[early:]
    model = sorted(range(early, len(nearest)), key=lambda q: (nearest[q], q))
    assert rest.tolist() == model
