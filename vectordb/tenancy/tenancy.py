"""Tenancy: who may read which vector, and each tenant's shortlists (Curator on the disk index).

Held by a SpannIndex created with ``IndexConfig(tenancy=True)``; the index logs every change
first (wal_records) and calls these ``apply_*`` methods under its update lock, at the call and
again when the log is replayed (each is idempotent: a pair already there is not added twice).

- access_table: the truth of access (a search filters by it), home locations, tree leaves;
- tenant_tree: the frozen hierarchy; trained on the first vectors (build, or the first inserts,
  and trained again, with every shortlist placed again, while the index is younger than two
  leaves' worth of vectors, so that a tree grown from a handful of vectors does not stay a root);
- shortlists + tenant_updates: each tenant's shortlists and how they split and merge;
- tenant_store: home copies and shortlist runs in ``tenants.dat``.

Concurrency: loop thread; changes under the index's update lock; searches (tenant_search) read
concurrently and filter by the access table after their reads land.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from vectordb.build import posting_capacity
from vectordb.metric import Metric, prepare
from vectordb.posting_store import PostingItem
from vectordb.tenancy.access_table import AccessTable
from vectordb.tenancy.shortlists import TenantShortlists
from vectordb.tenancy.tenant_names import TenantId, TenantNames
from vectordb.tenancy.tenant_store import POSITION_BITS, TenantStore, location_versions
from vectordb.tenancy.tenant_tree import TenantTree
from vectordb.tenancy.tenant_updates import bulk_items, place, settle
from vectordb.tenancy.wal_records import TenantRows

__all__ = ["Tenancy"]

_WRITE_BATCH_BYTES = 64 << 20


class Tenancy:
    def __init__(self, config: Any, metric: Metric, store: TenantStore) -> None:
        self.config = config
        self.metric = metric
        self.store = store
        self.limit = int(config.shortlist_limit)
        self.names = TenantNames()
        self.table = AccessTable()
        self.shortlists = TenantShortlists()
        self.tree = TenantTree.single(config.dim)
        self.counters = {"grants": 0, "revokes": 0, "shortlist_splits": 0, "shortlist_merges": 0}

    # ----------------------------------------------------------------- reads
    def number(self, name: TenantId) -> int | None:
        return self.names.number(name)

    def count(self, name: TenantId) -> int:
        number = self.names.number(name)
        return 0 if number is None else self.table.count(number)

    def tenants_of(self, vid: int) -> list[TenantId]:
        entry = self.table.get(int(vid))
        return [] if entry is None else [self.names.name(t) for t in entry.tenants]

    def resident_bytes(self) -> int:
        """What tenancy holds in memory: access table, tree, shortlist maps, run directory."""
        directory = sum(a.nbytes for a in self.store.lists.snapshot().values())
        return (
            self.table.resident_bytes()
            + self.tree.resident_bytes()
            + self.shortlists.resident_bytes()
            + directory
            + 64 * len(self.names)
        )

    def stats(self) -> dict[str, int]:
        return {
            "tenants": int((self.table.counts > 0).sum()),
            "access_pairs": int(self.table.counts.sum()),
            "shortlists": self.shortlists.count(),
            "tenant_tree_nodes": self.tree.n_nodes,
            "tenant_resident_bytes": self.resident_bytes(),
            "tenant_disk_bytes": self.store.disk_bytes(),
            "tenant_disk_used_bytes": self.store.used_bytes(),
            **self.counters,
        }

    # ----------------------------------------------------------------- checkpoints
    def snapshot(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        state = {
            "names": self.names.snapshot(),
            "next_pid": self.store.next_pid,
            "home_pid": self.store.home_pid,
        }
        arrays = {
            **self.tree.snapshot(),
            **self.table.snapshot(),
            **self.shortlists.snapshot(),
            **self.store.snapshot(),
        }
        return state, arrays

    def restore(self, state: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        self.names = TenantNames(state["names"])
        self.tree = TenantTree.restore(arrays)
        self.table.restore(arrays)
        self.shortlists.restore(arrays["shortlists"], self.tree.parent)
        self.store.restore(arrays, int(state["next_pid"]), int(state["home_pid"]))
        used = {e.pid for e in self.shortlists.entries()}
        used.update((self.table.loc.astype(np.int64) >> POSITION_BITS).tolist())
        if self.store.home_pid >= 0:
            used.add(self.store.home_pid)
        self.store.free_pids = sorted(set(range(self.store.next_pid)) - used, reverse=True)

    # ----------------------------------------------------------------- changes
    async def apply_insert(self, ids: np.ndarray, vectors: np.ndarray, rows: TenantRows) -> None:
        """Add checked vectors (ids new to the table) with their tenants."""
        if not len(ids):
            return
        numbers = self._numbers(rows)
        stored = self.stored(vectors)
        if self._young(len(ids)):
            await self._retrain(ids, stored, rows[0], numbers)
            return
        leaves = self.tree.descend(prepare(self.metric, stored))
        locations = await self.store.put_home(ids, stored)
        indptr = rows[0]
        for i, vid in enumerate(ids.tolist()):
            tenants = tuple(numbers[indptr[i] : indptr[i + 1]].tolist())
            self.table.put(vid, int(locations[i]), int(leaves[i]), tenants)
        pair_rows = np.repeat(np.arange(len(ids)), np.diff(indptr))
        for tenant in np.unique(numbers).tolist():
            mine = pair_rows[numbers == tenant]
            await place(self, tenant, ids[mine], leaves[mine], locations[mine], stored[mine])
            self.shortlists.compact(tenant)
        self.counters["grants"] += len(numbers)

    async def apply_grant(self, ids: np.ndarray, name: TenantId) -> int:
        tenant = self.names.number_or_new(name)
        found, locations, leaves = self.table.lookup(ids)
        new = np.array([bool(f) and self.table.add_pair(v, tenant) for v, f in
                        zip(ids.tolist(), found.tolist(), strict=True)], bool)  # fmt: skip
        if not new.any():
            return 0
        ids, locations, leaves = ids[new], locations[new], leaves[new]
        vectors = await self.store.read_home(ids, locations)
        await place(self, tenant, ids, leaves, locations, vectors)
        self.shortlists.compact(tenant)
        self.counters["grants"] += len(ids)
        return len(ids)

    async def apply_revoke(self, ids: np.ndarray, name: TenantId) -> int:
        tenant = self.names.number(name)
        if tenant is None:
            return 0
        _, _, leaves = self.table.lookup(ids)
        gone = [
            int(leaf)
            for vid, leaf in zip(ids.tolist(), leaves.tolist(), strict=True)
            if self.table.remove_pair(vid, tenant)
        ]
        await self._settle_removed(tenant, gone)
        self.counters["revokes"] += len(gone)
        return len(gone)

    async def apply_delete(self, ids: np.ndarray) -> None:
        """Forget deleted ids, and every grant they had."""
        lost: dict[int, list[int]] = {}
        for vid in ids.tolist():
            entry = self.table.remove(vid)
            if entry is not None:
                for tenant in entry.tenants:
                    lost.setdefault(tenant, []).append(entry.leaf)
        for tenant, leaves in lost.items():
            await self._settle_removed(tenant, leaves)

    async def apply_delete_tenant(self, name: TenantId) -> int:
        tenant = self.names.number(name)
        if tenant is None:
            return 0
        for entry in self.shortlists.pop(tenant):
            self.store.release(entry.pid)
        return self.table.remove_tenant(tenant)

    async def _settle_removed(self, tenant: int, leaves: list[int]) -> None:
        touched: dict[int, int] = {}
        for leaf in leaves:
            node = self.shortlists.locate(tenant, self.tree.path(leaf))
            if node is not None:
                entry = self.shortlists.edit(tenant)[node]
                assert entry is not None
                entry.live -= 1
                touched[node] = int(self.tree.depth[node])
        for node in sorted(touched, key=touched.__getitem__, reverse=True):
            await settle(self, tenant, node)
        self.shortlists.compact(tenant)

    def _numbers(self, rows: TenantRows) -> np.ndarray:
        _, refs, names = rows
        lookup = np.array([self.names.number_or_new(n) for n in names], np.int64)
        return lookup[refs] if len(refs) else np.zeros(0, np.int64)

    def stored(self, vectors: np.ndarray) -> np.ndarray:
        """Vectors as copies hold them: normalised for cosine (as the posting lists)."""
        return prepare(self.metric, vectors) if self.metric is Metric.COSINE else vectors

    # ----------------------------------------------------------------- bulk
    def _young(self, adding: int) -> bool:
        """The tree is a root alone and the index reaches two leaves' worth of vectors."""
        leaf_size = int(self.config.tenant_leaf_size)
        return self.tree.n_nodes == 1 and self.table.n_ids + adding >= 2 * leaf_size

    async def _retrain(
        self, ids: np.ndarray, stored: np.ndarray, indptr: np.ndarray, numbers: np.ndarray
    ) -> None:
        """Train the tree on every vector so far and place every pair again."""
        self.table.merge()
        old = self.table
        old_ids, old_loc = old.id_array(), old.loc.astype(np.int64)
        old_vectors = await self.store.read_home(old_ids, old_loc) if len(old_ids) else stored[:0]
        for entry in self.shortlists.entries():
            self.store.release(entry.pid)
        for pid in np.unique(old_loc >> POSITION_BITS).tolist():
            self.store.release(pid)  # home blocks: every vector gets a new home copy
        self.store.home_pid = -1
        self.shortlists = TenantShortlists()
        new_lengths = np.diff(indptr)
        all_ids = np.concatenate([old_ids, ids])
        all_vectors = np.concatenate([old_vectors, stored])
        lengths = np.concatenate([np.diff(old.ptr.astype(np.int64)), new_lengths])
        tenants = np.concatenate([old.tenants.astype(np.int64), numbers])
        await self.bulk_load(all_ids, all_vectors, lengths, tenants)

    async def build(self, ids: np.ndarray, vectors: np.ndarray, rows: TenantRows) -> None:
        """An empty tenancy from a bulk build's checked vectors and their tenants."""
        numbers = self._numbers(rows)
        await self.bulk_load(ids, self.stored(vectors), np.diff(rows[0]), numbers)

    async def bulk_load(
        self, ids: np.ndarray, stored: np.ndarray, lengths: np.ndarray, tenants: np.ndarray
    ) -> None:
        """Every vector and pair at once (build; a young index): train, home copies, runs.
        ``stored``: as copies hold them (Tenancy.stored)."""
        prepared = prepare(self.metric, stored)
        config = self.config
        self.tree = TenantTree.train(
            prepared, len(ids), config.tenant_tree_branching, config.tenant_leaf_size, config.seed
        )
        leaves = self.tree.descend(prepared)
        del prepared
        locations = await self.store.put_home(ids, stored)
        self.table = AccessTable()
        self.table.load(ids, locations, leaves, lengths, tenants)
        pair_rows = np.repeat(np.arange(len(ids)), lengths)
        order = np.argsort(tenants, kind="stable")
        bounds = np.flatnonzero(np.diff(tenants[order])) + 1
        versions = location_versions(locations)
        items: list[PostingItem] = []
        pending = 0
        for group in np.split(order, bounds) if len(order) else []:
            tenant = int(tenants[group[0]])
            shortlists = self.shortlists.edit(tenant)
            for node, rows in bulk_items(self, tenant, pair_rows[group], leaves):
                entry = shortlists[node]
                assert entry is not None
                capacity = posting_capacity(len(rows), self.limit)
                part = (ids[rows], versions[rows], stored[rows])
                items.append(PostingItem(entry.pid, *part, capacity=capacity))
                pending += len(rows) * self.store.lists.rec_bytes
            if pending >= _WRITE_BATCH_BYTES:
                await self.store.write(items)
                items, pending = [], 0
        await self.store.write(items)
        self.shortlists.compact_all()
        self.counters["grants"] += len(tenants)
