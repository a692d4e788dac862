"""Tenancy: who may read which vector, and each tenant's shortlists (Curator on the disk index).

Held by a SpannIndex created with ``IndexConfig(tenancy=True)``; the index logs every change
first (wal_records) and calls these ``apply_*`` methods under its update lock, at the call and
again when the log is replayed (each is idempotent: a pair already there is not added twice).

- access_table: the truth of access (a search filters by it), home locations, tree leaves;
- tenant_tree: the frozen hierarchy; trained on the first vectors (build, or the first inserts,
  and trained again, with every shortlist placed again, while the index is younger than two
  leaves' worth of vectors, so that a tree grown from a handful of vectors does not stay a root);
- shortlists + tenant_updates: each tenant's shortlists and how they split and merge;
- pending_grants: granted pairs whose copies wait for ``settle_pending`` (searches score them
  from their home copies meanwhile);
- tenant_store: home copies, shortlist runs and their compact twins (sq8) in ``tenants.dat``.

Concurrency: loop thread; changes under the index's update lock; searches (tenant_search) read
concurrently and filter by the access table after their reads land.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from vectordb.metric import Metric, prepare
from vectordb.tenancy.access_table import AccessTable
from vectordb.tenancy.pending_grants import PendingGrants, settle_pending_grants
from vectordb.tenancy.shortlists import TenantShortlists
from vectordb.tenancy.tenant_bulk import bulk_load
from vectordb.tenancy.tenant_names import TenantId, TenantNames
from vectordb.tenancy.tenant_store import POSITION_BITS, TenantStore
from vectordb.tenancy.tenant_tree import TenantTree
from vectordb.tenancy.tenant_updates import place, settle
from vectordb.tenancy.wal_records import TenantRows

__all__ = ["PENDING_TENANT_PAIRS", "SETTLE_AT_PAIRS", "SETTLE_GRANTS_AT_PAIRS", "Tenancy"]

# removed pairs whose shortlists' merges and rewrites wait for a checkpoint (searches filter by
# the access table, so a run holding revoked records answers rightly meanwhile); bounds the
# pending map and the stale records a search may read
SETTLE_AT_PAIRS = 1 << 16
# granted pairs whose copies wait for a checkpoint (pending_grants), in all; and per tenant:
# a search of the tenant reads its pending vectors' home copies (a page or two each), so a
# tenant past this many has its grants settled at once (twice a search's default candidates)
SETTLE_GRANTS_AT_PAIRS = 1 << 16
PENDING_TENANT_PAIRS = 2048


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
        # shortlists that lost pairs (revoke, delete) and wait for ``settle_pending`` (tenant ->
        # node -> depth): the next checkpoint, or once ``SETTLE_AT_PAIRS`` pairs have gathered
        self.unsettled: dict[int, dict[int, int]] = {}
        self.unsettled_pairs = 0
        self.pending = PendingGrants()

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
        directory = self.store.directory_bytes()  # runs' and twins' directories, codec
        return (
            self.table.resident_bytes()
            + self.tree.resident_bytes()
            + self.shortlists.resident_bytes()
            + directory
            + 64 * len(self.names)
            + self.pending.resident_bytes()
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
            "pending_grants": self.pending.pairs,
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
            **self.pending.snapshot(),
        }
        return state, arrays

    def restore(self, state: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        self.names = TenantNames(state["names"])
        self.tree = TenantTree.restore(arrays)
        self.table.restore(arrays)
        self.shortlists.restore(arrays["shortlists"], self.tree.parent)
        self.store.restore(arrays, int(state["next_pid"]), int(state["home_pid"]))
        self.pending.restore(arrays)
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
        """Add the pairs to the access table and to the pending grants: the copies into the
        tenant's shortlists wait for ``settle_pending`` (or a bound: ``PENDING_TENANT_PAIRS``,
        ``SETTLE_GRANTS_AT_PAIRS``); searches score pending pairs from their home copies."""
        tenant = self.names.number_or_new(name)
        new = self.table.add_pairs(ids, tenant)
        if not new.any():
            return 0
        granted = ids[new]
        self.pending.add(tenant, granted)
        self.counters["grants"] += len(granted)
        if self.pending.pairs >= SETTLE_GRANTS_AT_PAIRS:
            await self.settle_grants(self.pending.tenants())
        elif self.pending.count(tenant) > PENDING_TENANT_PAIRS:
            await self.settle_grants([tenant])
        return len(granted)

    async def apply_revoke(self, ids: np.ndarray, name: TenantId) -> int:
        tenant = self.names.number(name)
        if tenant is None:
            return 0
        removed, leaves = self.table.remove_pairs(ids, tenant)
        rows = np.flatnonzero(removed)
        if tenant in self.pending and len(rows):  # pending pairs are in no shortlist yet
            rows = rows[~self.pending.remove(tenant, ids[rows])]
        await self._settle_removed(tenant, leaves[rows].tolist())
        self.counters["revokes"] += int(removed.sum())
        return int(removed.sum())

    async def apply_delete(self, ids: np.ndarray) -> None:
        """Forget deleted ids, and every grant they had."""
        lost: dict[int, list[tuple[int, int]]] = {}
        for vid in ids.tolist():
            entry = self.table.remove(vid)
            if entry is not None:
                for tenant in entry.tenants:
                    lost.setdefault(tenant, []).append((vid, entry.leaf))
        for tenant, pairs in lost.items():
            if tenant in self.pending:
                was = self.pending.remove(tenant, np.array([v for v, _ in pairs], np.int64))
                pairs = [p for p, pending in zip(pairs, was.tolist(), strict=True) if not pending]
            await self._settle_removed(tenant, [leaf for _, leaf in pairs])

    async def apply_delete_tenant(self, name: TenantId) -> int:
        tenant = self.names.number(name)
        if tenant is None:
            return 0
        self.unsettled.pop(tenant, None)
        self.pending.pop(tenant)
        for entry in self.shortlists.pop(tenant):
            self.store.release(entry.pid)
        return self.table.remove_tenant(tenant)

    async def _settle_removed(self, tenant: int, leaves: list[int]) -> None:
        """Count the pairs out of their shortlists; the merges, drops and rewrites that
        restore the invariants are deferred (``settle_pending``): a batch of revokes then
        rewrites each run once, not once a call."""
        touched = self.unsettled.setdefault(tenant, {})
        view = self.shortlists.view(tenant)
        for leaf in leaves:
            node = self.shortlists.locate(tenant, self.tree.path(leaf))
            if node is not None:
                entry = view[node] if view is not None else None
                assert entry is not None
                entry.live -= 1
                touched[node] = int(self.tree.depth[node])
        if not touched:
            del self.unsettled[tenant]
        if not leaves:
            return
        self.unsettled_pairs += len(leaves)
        if self.unsettled_pairs >= SETTLE_AT_PAIRS:
            await self.settle_pending()

    async def settle_pending(self) -> None:
        """Copy the pending grants into their shortlists, then merge, drop and rewrite the
        shortlists that lost pairs since the last call, deepest first per tenant (under the
        update lock: before every checkpoint). Grants first: a revoked pair granted again is
        pending while its old record may still sit in a run; placed first, it is counted
        once (the rewrite after it keeps one record of an id)."""
        await self.settle_grants(self.pending.tenants())
        pending, self.unsettled, self.unsettled_pairs = self.unsettled, {}, 0
        for tenant, touched in pending.items():
            for node in sorted(touched, key=touched.__getitem__, reverse=True):
                await settle(self, tenant, node)
            self.shortlists.compact(tenant)

    async def settle_grants(self, tenants: list[int]) -> None:
        """Copy ``tenants``' pending pairs into their shortlists (pending_grants.settle)."""
        await settle_pending_grants(self, tenants)

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
        self.unsettled, self.unsettled_pairs = {}, 0
        self.pending.clear()  # the table holds every pair: all placed again below
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
        """Every vector and pair at once (build; a young index): tenant_bulk.bulk_load."""
        await bulk_load(self, ids, stored, lengths, tenants)
