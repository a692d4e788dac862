"""Bulk load: every vector and (vector, tenant) pair of a tenancy at once.

Used by a build and by a young index whose tree is trained again (Tenancy._retrain): the tree
is trained on the vectors, each vector gets a home copy, the access table is loaded whole, and
each tenant's pairs are placed top down (tenant_updates.bulk_items: a node whose share of the
tenant fits the limit, or a leaf, is a shortlist), the runs written in submissions of about
``_WRITE_BATCH_BYTES``. The result satisfies the invariants of the incremental path.

Concurrency: under the index's update lock (or before the index is open to callers).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from vectordb.build import posting_capacity
from vectordb.metric import prepare
from vectordb.posting_store import PostingItem
from vectordb.tenancy.access_table import AccessTable
from vectordb.tenancy.tenant_store import location_versions
from vectordb.tenancy.tenant_tree import TenantTree
from vectordb.tenancy.tenant_updates import bulk_items

if TYPE_CHECKING:
    from vectordb.tenancy.tenancy import Tenancy

__all__ = ["bulk_load"]

_WRITE_BATCH_BYTES = 64 << 20


async def bulk_load(
    tenancy: Tenancy, ids: np.ndarray, stored: np.ndarray, lengths: np.ndarray,
    tenants: np.ndarray,
) -> None:  # fmt: skip
    """Replace the tree, the access table and every shortlist. ``stored``: the vectors as
    copies hold them (Tenancy.stored); ``lengths``: pairs of each row; ``tenants``: their
    tenant numbers, row after row."""
    prepared = prepare(tenancy.metric, stored)
    config = tenancy.config
    tenancy.tree = TenantTree.train(
        prepared, len(ids), config.tenant_tree_branching, config.tenant_leaf_size, config.seed
    )
    leaves = tenancy.tree.descend(prepared)
    del prepared
    store = tenancy.store
    store.train_codes(stored, tenancy.metric, config.seed)  # before any run is written
    locations = await store.put_home(ids, stored)
    tenancy.table = AccessTable()
    tenancy.table.load(ids, locations, leaves, lengths, tenants)
    pair_rows = np.repeat(np.arange(len(ids)), lengths)
    order = np.argsort(tenants, kind="stable")
    bounds = np.flatnonzero(np.diff(tenants[order])) + 1
    versions = location_versions(locations)
    items: list[PostingItem] = []
    pending = 0
    for group in np.split(order, bounds) if len(order) else []:
        tenant = int(tenants[group[0]])
        shortlists = tenancy.shortlists.edit(tenant)
        for node, rows in bulk_items(tenancy, tenant, pair_rows[group], leaves):
            entry = shortlists[node]
            assert entry is not None
            capacity = posting_capacity(len(rows), tenancy.limit)
            part = (ids[rows], versions[rows], stored[rows])
            items.append(PostingItem(entry.pid, *part, capacity=capacity))
            pending += len(rows) * store.lists.rec_bytes
        if pending >= _WRITE_BATCH_BYTES:
            await store.write(items)
            items, pending = [], 0
    await store.write(items)
    tenancy.shortlists.compact_all()
    tenancy.counters["grants"] += len(tenants)
