"""ProbeScores: exact distances of a query batch to the posting lists it probes, and its top k.

A *probe* is one (query, list) pair the search decided to read. Probes are sorted by list, so
list ``u``'s probes are the rows ``bounds[u]:bounds[u + 1]``; the products of a group of lists
with their probing queries are one compiled call (dot_kernel, straight from the read buffer).
Everything else -- masking stale and deleted copies, adding norms, choosing the best ``k``
distinct ids per query -- is vectorised over the whole batch, so there is no Python work per
list, whatever ``k`` and the metric are.

Layout: ``dist`` is [probes, longest list] float32, inf past a list's end and for records that
are not the live copy of their id. The top-k step views the probes of one query side by side
([queries, max_postings x longest]), takes the ``k x max_postings`` nearest cells (a vector is
in at most one cell per list, so they hold the k nearest distinct ids), drops repeated ids
(replicas: the nearest copy stays) and sorts.

Thread-safety: one search owns one ProbeScores; its ``add`` calls may run on one worker thread
(never two at once), ``best`` after the last of them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np

from vectordb.dot_kernel import VectorSpan, score_lists
from vectordb.metric import Metric
from vectordb.version_map import VersionMap

__all__ = ["Access", "ProbeScores"]

# (may_read(ids, query rows) -> bool mask, per-query tenant): records a query may not read are
# left out of its top k (vectordb.tenancy's filtered route)
Access = tuple[Callable[[np.ndarray, np.ndarray], np.ndarray], np.ndarray]


class ProbeScores:
    def __init__(
        self,
        metric: Metric,
        queries: np.ndarray,
        probe_rows: np.ndarray,
        list_of: np.ndarray,
        bounds: np.ndarray,
        longest: int,
    ) -> None:
        """``queries`` [Q, dim] prepared; ``probe_rows`` each probe's query row, probes sorted
        by list; ``list_of`` each probe's list (0-based, non-decreasing); ``bounds``
        [lists + 1]."""
        self.metric = metric
        # internal distance = -q.v (ip, cosine) or |v|^2 - 2 q.v (+ |q|^2 at the end, l2);
        # scaled once per query, not copied per probe (tens of MB a batch in 784 dimensions)
        self._q = queries * np.float32(-2.0 if metric is Metric.L2 else -1.0)
        self._rows = np.ascontiguousarray(probe_rows, np.int64)
        self._list_of = list_of
        self._bounds = bounds
        n_lists = len(bounds) - 1
        self.dist = np.full((len(list_of), longest), np.inf, np.float32)
        self.ids = np.full((n_lists, longest), -1, np.int64)
        self.valid = np.zeros((n_lists, longest), bool)
        self._norms = np.zeros((n_lists, longest), np.float32) if metric is Metric.L2 else None
        self.corrupt: list[int] = []  # batch lists that failed their check (skip_corrupt)

    def widen(self, longest: int) -> None:
        """Room for lists of up to ``longest`` records (a list appended to while a chunk read
        its lists in rounds: search_chunk); between ``add`` calls only."""
        more = longest - self.dist.shape[1]
        if more <= 0:
            return
        self.dist = np.pad(self.dist, ((0, 0), (0, more)), constant_values=np.inf)
        self.ids = np.pad(self.ids, ((0, 0), (0, more)), constant_values=-1)
        self.valid = np.pad(self.valid, ((0, 0), (0, more)), constant_values=False)
        if self._norms is not None:
            self._norms = np.pad(self._norms, ((0, 0), (0, more)), constant_values=0.0)

    @property
    def live_counts(self) -> np.ndarray:
        """Live records seen in each list."""
        return self.valid.sum(axis=1)

    @staticmethod
    def live_mask(lists: list[np.ndarray], versions: VersionMap) -> tuple[np.ndarray, np.ndarray]:
        """(ids, live) of the records of ``lists`` (concatenated): their ids, and which are
        the live copy of their id. On the loop thread: the version map changes under updates."""
        if not lists:
            return np.zeros(0, np.int64), np.zeros(0, bool)
        ids = np.concatenate([r["id"] for r in lists])
        return ids, versions.valid(ids, np.concatenate([r["version"] for r in lists]))

    def add(
        self,
        first: int,
        counts: np.ndarray,
        ids_live: tuple[np.ndarray, np.ndarray],
        spans: Iterable[tuple[int, VectorSpan]],
        skip_corrupt: bool = False,
    ) -> None:
        """Score lists ``first``, ``first + 1``, ... (``counts`` records each; ``ids_live``
        from :meth:`live_mask` over them; ``spans``: their vectors, ``(offset, span)`` for
        lists ``first + offset`` ..., as PostingRead.spans gives them). The products run in
        dot_kernel without the GIL: may run on a worker thread, one ``add`` at a time.
        Raises CorruptionError for a record that fails its check; with ``skip_corrupt`` its
        list is noted in :attr:`corrupt` instead and none of its records is an answer."""
        sizes = np.asarray(counts, np.int64)
        total = int(sizes.sum())
        if total == 0:
            return
        row = np.repeat(np.arange(first, first + len(sizes)), sizes)
        col = np.arange(total) - np.repeat(np.cumsum(sizes) - sizes, sizes)
        self.ids[row, col], self.valid[row, col] = ids_live
        for offset, span in spans:
            base = first + offset
            bad = score_lists(
                span, self._bounds, base, self._q, self.dist, self._norms, self._rows, skip_corrupt
            )
            for u in (bad + base).tolist():
                self.valid[u] = False  # records before the bad one verified; still, not one
                self.corrupt.append(u)

    def best(
        self,
        probe_query: np.ndarray,
        probe_slot: np.ndarray,
        queries: np.ndarray,
        width: int,
        k: int,
        access: Access | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """(ids [Q, k] padded with -1, internal distances [Q, k] padded with inf), nearest
        first, each id once. ``probe_query``/``probe_slot``: each probe's query row and its
        column among that query's ``width`` probes."""
        n_queries, longest = len(queries), self.dist.shape[1]
        out_ids = np.full((n_queries, k), -1, np.int64)
        out_dist = np.full((n_queries, k), np.inf, np.float32)
        if longest == 0 or len(self._list_of) == 0:
            return out_ids, out_dist
        dist = self.dist
        if self._norms is not None:
            dist += self._norms[self._list_of]
        dist[~self.valid[self._list_of]] = np.inf
        if access is not None:
            may_read, tenants = access
            ids = self.ids[self._list_of]
            rows = np.repeat(tenants[self._rows], ids.shape[1])
            dist[~may_read(ids.reshape(-1), rows).reshape(ids.shape)] = np.inf
        if n_queries == 1:  # a lone query: the same answer with flat indexing, ~3x cheaper
            self._best_one(width, k, out_ids[0], out_dist[0])
            if self.metric is Metric.L2:
                out_dist += np.einsum("ij,ij->i", queries, queries)[:, None]
            return out_ids, out_dist
        grid = np.full((n_queries, width, longest), np.inf, np.float32)
        grid[probe_query, probe_slot] = dist
        grid_ids = np.full((n_queries, width, longest), -1, np.int64)
        grid_ids[probe_query, probe_slot] = self.ids[self._list_of]
        grid, grid_ids = grid.reshape(n_queries, -1), grid_ids.reshape(n_queries, -1)  # type: ignore[assignment]
        cells = min(k * width, grid.shape[1])
        if cells < grid.shape[1]:
            part = np.argpartition(grid, cells - 1, axis=1)[:, :cells]
            grid = np.take_along_axis(grid, part, axis=1)
            grid_ids = np.take_along_axis(grid_ids, part, axis=1)
        by_id = np.lexsort((grid, grid_ids), axis=1)  # per row: by id, nearest copy first
        grid = np.take_along_axis(grid, by_id, axis=1)
        grid_ids = np.take_along_axis(grid_ids, by_id, axis=1)
        grid[:, 1:][grid_ids[:, 1:] == grid_ids[:, :-1]] = np.inf
        nearest = np.argsort(grid, axis=1, kind="stable")[:, :k]
        take = nearest.shape[1]
        out_dist[:, :take] = np.take_along_axis(grid, nearest, axis=1)
        out_ids[:, :take] = np.take_along_axis(grid_ids, nearest, axis=1)
        found = np.isfinite(out_dist)
        out_ids[~found] = -1
        if self.metric is Metric.L2:
            out_dist += np.einsum("ij,ij->i", queries, queries)[:, None]
        return out_ids, out_dist

    def _best_one(self, width: int, k: int, out_ids: np.ndarray, out_dist: np.ndarray) -> None:
        """``best`` for a batch of one query (every probe is its): into ``out_ids``/``out_dist``."""
        dist = self.dist.ravel()
        ids = self.ids[self._list_of].ravel()
        cells = min(k * width, len(dist))  # a vector is in a list once: k ids among these
        if cells < len(dist):
            part = np.argpartition(dist, cells - 1)[:cells]
            dist, ids = dist[part], ids[part]
        by_id = np.lexsort((dist, ids))  # by id, nearest copy first
        dist, ids = dist[by_id], ids[by_id]
        dist[1:][ids[1:] == ids[:-1]] = np.inf
        nearest = np.argsort(dist, kind="stable")[:k]
        found = np.isfinite(dist[nearest])
        out_dist[: len(nearest)] = np.where(found, dist[nearest], np.inf)
        out_ids[: len(nearest)] = np.where(found, ids[nearest], -1)
