"""Index changes a committed point-store write owes, applied now or replayed after a crash.

An intent is a list of operations, committed in the same LMDB transaction as the points they
concern (point_store.py), then applied to the index::

    ["insert", [internal id, ...]]          index the points' records (vectors, labels)
    ["delete", [internal id, ...]]
    ["grant", label, [internal id, ...]]    let a label (labels.py) read them
    ["revoke", label, [internal id, ...]]

Applying is idempotent: an insert skips ids the index holds already and ids whose record has
gone since (a later write dropped them: its own intent deletes them), and the index ignores
deletes, grants and revokes that changed nothing. An overwrite keeps the point's internal id
and deletes it before inserting it again from its record (the current one: replaying an older
overwrite indexes the newest vector, which a later intent then replaces with itself). So a
restart replays every intent still in the store, in order, and the index catches up.

Thread-safety: loop thread only (the index's).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from vectordb.collections.labels import keyword_labels, tenant_label
from vectordb.collections.point_records import PointRecord
from vectordb.collections.point_store import PointStore
from vectordb.index import SpannIndex

__all__ = ["BUILD_MIN_POINTS", "apply_intent", "record_labels"]

# an empty index takes a first batch of at least this many points as a bulk build (heads
# chosen from all of them at once) rather than as inserts that choose heads as they come
BUILD_MIN_POINTS = 1000


def record_labels(record: PointRecord, indexed_fields: list[str]) -> list[str]:
    return [tenant_label(t) for t in record.tenants] + keyword_labels(
        record.payload, indexed_fields
    )


async def apply_intent(
    index: SpannIndex,
    store: PointStore,
    ops: list[list[Any]],
    indexed_fields: list[str],
    records: dict[int, PointRecord] | None = None,
) -> None:
    """Apply ``ops`` to ``index``; ``records``: those of inserted ids, when the caller has
    them (else they are read from ``store``)."""
    for op in ops:
        kind = op[0]
        if kind == "insert":
            await _insert(index, store, op[1], indexed_fields, records or {})
        elif kind == "delete" and op[1]:
            await index.delete(np.asarray(op[1], np.int64))
        elif kind == "grant" and op[2]:
            await index.grant(np.asarray(op[2], np.int64), op[1])
        elif kind == "revoke" and op[2]:
            await index.revoke(np.asarray(op[2], np.int64), op[1])


async def _insert(
    index: SpannIndex,
    store: PointStore,
    internal_ids: list[int],
    indexed_fields: list[str],
    given: dict[int, PointRecord],
) -> None:
    ids = np.asarray(internal_ids, np.int64)
    if len(ids) == 0:
        return
    ids = ids[~index.versions.is_live(ids)]
    missing = [int(i) for i in ids if int(i) not in given]
    found = dict(zip(missing, store.records(missing), strict=True)) if missing else {}
    chosen: list[int] = []
    rows: list[PointRecord] = []
    for internal_id in ids.tolist():
        record = given.get(internal_id) or found.get(internal_id)
        if record is not None:  # None: dropped by a later write
            chosen.append(internal_id)
            rows.append(record)
    if not chosen:
        return
    vectors = np.stack([r.vector for r in rows])
    labels = [record_labels(r, indexed_fields) for r in rows]
    chosen_ids = np.asarray(chosen, np.int64)
    empty = index.versions.live_count == 0 and index.navigator.n_heads == 0
    if empty and len(chosen) >= BUILD_MIN_POINTS:
        await index.build(chosen_ids, vectors, tenants=labels)
    else:
        await index.insert(chosen_ids, vectors, tenants=labels)
