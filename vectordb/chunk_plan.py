"""How a search batch is cut into chunks of queries, and in what order the queries go.

A batch whose lists do not fit one read buffer is searched a chunk of queries at a time
(search.py). ``locality_order`` puts queries near each other side by side (so a chunk's
queries share lists, and its lists sit close in the file); ``query_chunks`` cuts the ordered
batch into consecutive ranges that fit the buffer and the distance-matrix budget.

Thread-safety: pure functions of their arguments (the store's directory is only read).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from vectordb.posting_store import PostingStore

__all__ = ["locality_order", "query_chunks"]


def locality_order(pids: np.ndarray, early_queries: int) -> np.ndarray:
    """The order queries are searched in: those with early reads first (as given), then the
    rest by their nearest head. Heads are numbered in the k-means tree's depth-first order, so
    queries near in space come together: a chunk of them shares more lists (fewer reads when a
    batch needs several chunks) and its lists sit closer in the file (fewer requests)."""
    order = np.arange(len(pids))
    if pids.shape[1] and len(pids) - early_queries > 1:
        rest = np.argsort(pids[early_queries:, 0], kind="stable")
        order[early_queries:] = early_queries + rest
    return order


def query_chunks(
    store: PostingStore,
    pids: np.ndarray,
    keep: np.ndarray,
    budget_pages: int,
    cell_budget: int,
    first_at_least: int = 0,
) -> list[slice]:
    """Consecutive query ranges, each as long as possible with the union of its lists fitting
    ``budget_pages`` (the reusable read buffer: fresh memory is slow to touch) and its distance
    matrix within ``cell_budget`` (probe, record) cells. A list two ranges share is read by
    both. The first range holds at least ``first_at_least`` queries (those whose lists were
    read early: they fit the buffer). ``pids``/``keep``: each query's probed lists."""
    width = pids.shape[1]
    pages = store.pages_of(np.where(keep, pids, 0)) * keep  # of each kept probe
    longest = max(int(store.count[pids[keep]].max(initial=1)), 1)
    most_queries = max(1, cell_budget // (width * longest))
    out, first, n = [], 0, len(pids)
    while first < n:
        stop = min(n, first + most_queries)
        probes = np.where(keep[first:stop], pids[first:stop], -1).ravel()
        kept = np.flatnonzero(probes >= 0)
        _, first_seen = np.unique(probes[kept], return_index=True)
        new_pages = np.zeros(stop - first, np.int64)  # pages each query adds to the union
        np.add.at(new_pages, kept[first_seen] // width, pages[first:stop].ravel()[kept[first_seen]])
        fits = int(np.searchsorted(np.cumsum(new_pages), budget_pages, side="right"))
        stop = first + max(1, fits, first_at_least if first == 0 else 0)
        out.append(slice(first, min(stop, n)))
        first = stop
    return out
