"""A collection's nearest-neighbour query: route, search, filter, and grow until answered.

Route: a tenant's query searches through its tenant label, so the index itself returns only
vectors the tenant may read. The admin's query with a ``must`` match on a keyword-indexed
field searches through that value's label (the rarest one when there are several); otherwise
the whole index. The rest of the filter is checked on each hit's payload after scoring.

Growth: a filter can reject hits, so a filtered query first asks the index for more than it
needs (FIRST_ROUND_FACTOR), then, for the queries still short, many more with a wider search
(every shortlist of the label, or four times the posting lists), and last scores the matching
points exactly (brute_force.py). An unfiltered query asks for exactly what it needs, and is
short only when the route holds fewer points.

Thread-safety: loop thread (the index's); the exact fallback scans on a worker thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from vectordb.collections.brute_force import exact_hits
from vectordb.collections.filters import Filter
from vectordb.collections.labels import keyword_label, tenant_label
from vectordb.collections.point_records import PointRecord
from vectordb.collections.points import point_key
from vectordb.config import SearchParams, default_postings

if TYPE_CHECKING:
    from vectordb.collections.collection import Collection

__all__ = ["Hit", "run_query"]

FIRST_ROUND_FACTOR = 2
SECOND_ROUND_FACTOR = 16


@dataclass
class Hit:
    internal_id: int
    score: float
    key: bytes
    record: PointRecord | None  # read when a filter, payload or vector needs it


async def run_query(
    c: Collection,
    vectors: np.ndarray,
    need: int,
    filt: Filter | None,
    tenant: str | None,
    score_ok: Callable[[float], bool],
    need_records: bool,
    exact: bool,
    params: SearchParams,
) -> list[list[Hit]]:
    """Up to ``need`` hits per query row, nearest first."""
    label = _route(c, filt, tenant)
    visible = c.index.count(label) if label is not None else c.store.count()
    n_rows = len(vectors)
    if visible == 0 or need == 0:
        return [[] for _ in range(n_rows)]
    if exact:
        return await _exact(c, vectors, list(range(n_rows)), need, filt, tenant, score_ok)
    hits: list[list[Hit]] = [[] for _ in range(n_rows)]
    short = list(range(n_rows))
    k = need if filt is None else max(need * FIRST_ROUND_FACTOR, 20)
    for wide in (False, True):
        k = min(k, visible)
        result = await c.index.search(
            vectors[short], k, _params(c, label, wide, params), tenant=label
        )
        ids, scores = result[0], result[1]
        still = []
        for row, query in enumerate(short):
            hits[query], answered = _filtered(
                c, ids[row], scores[row], filt, tenant, need_records, score_ok, need
            )
            exhausted = k >= visible and bool((ids[row] >= 0).all())  # saw every point
            if not answered and not exhausted:
                still.append(query)
        short = still
        if not short:
            return hits
        k = max(need * SECOND_ROUND_FACTOR, k * 8)
    exact_rows = await _exact(c, vectors, short, need, filt, tenant, score_ok)
    for query, row_hits in zip(short, exact_rows, strict=True):
        hits[query] = row_hits
    return hits


def _route(c: Collection, filt: Filter | None, tenant: str | None) -> str | None:
    """The label to search through (None: the whole index)."""
    if tenant is not None:
        return tenant_label(tenant)
    indexed = set(c.payload_indexes)
    labels = [keyword_label(k, v) for k, v in (filt.equalities if filt else ()) if k in indexed]
    return min(labels, key=c.index.count) if labels else None


def _params(c: Collection, label: str | None, wide: bool, params: SearchParams) -> SearchParams:
    if not wide:
        return params
    if label is not None:
        return replace(params, tenant_candidates=0)  # every shortlist of the label
    postings = params.max_postings or default_postings(c.index.navigator.n_heads)
    return replace(params, max_postings=4 * postings)


def _filtered(
    c: Collection,
    ids: np.ndarray,
    scores: np.ndarray,
    filt: Filter | None,
    tenant: str | None,
    need_records: bool,
    score_ok: Callable[[float], bool],
    need: int,
) -> tuple[list[Hit], bool]:
    """The row's hits that pass; and whether the row is answered (enough hits, or a hit
    beyond the score threshold: every later one is farther)."""
    found = ids >= 0
    internal = ids[found].tolist()
    row_scores = c.to_scores(scores[found])
    # one LMDB read per hit: the record when anything needs it (its id gives the key), else
    # the bare key
    if need_records or filt is not None:
        records = c.store.records(internal)
        keys = [None if r is None else point_key(r.point_id) for r in records]
    else:
        records, keys = [None] * len(internal), c.store.point_keys(internal)
    out: list[Hit] = []
    for internal_id, score, key, record in zip(internal, row_scores, keys, records, strict=True):
        if key is None:
            continue  # deleted since the search read it
        if not score_ok(score):
            return out, True
        if record is not None and not _passes(record, filt, tenant):
            continue
        out.append(Hit(internal_id, score, key, record))
        if len(out) == need:
            return out, True
    return out, False


def _passes(record: PointRecord, filt: Filter | None, tenant: str | None) -> bool:
    if tenant is not None and tenant not in record.tenants:
        return False  # revoked since the search read it
    return filt is None or filt.matches(record.point_id, record.payload)


async def _exact(
    c: Collection,
    vectors: np.ndarray,
    rows: list[int],
    need: int,
    filt: Filter | None,
    tenant: str | None,
    score_ok: Callable[[float], bool],
) -> list[list[Hit]]:
    found = await asyncio.to_thread(
        exact_hits, c.store, c.config, vectors[rows], need, filt, tenant, score_ok
    )
    return [[Hit(i, s, k, r) for i, s, k, r in row] for row in found]
