"""PendingGrants: acknowledged grants whose copies are not yet in the tenant's shortlists.

A grant is logged (durable) and put in the access table at once; the copy of each granted
vector into the tenant's shortlist runs (a random read of its home copy, then appends, splits)
waits for ``Tenancy.settle_pending``: the next checkpoint, or a bound on the pending pairs (all
tenants, and per tenant: a search of a tenant reads its pending vectors' home copies, a page or
two each, beside its shortlists, so a tenant's pending set is kept to about one candidate
budget). Until then a tenant search scores the pending ids from their home copies, so every
acknowledged grant is found; the access table still decides what a search may return.

Invariants (kept by Tenancy under the index's update lock):

- a (vector, tenant) pair is pending only while the access table holds it, and then it is in
  none of the tenant's shortlists' ``live`` counts (a revoke or delete of a pending pair takes
  it out of here, not out of a shortlist);
- each tenant's ids are one sorted array without repeats.

The set is in the checkpoint (``pending_tenants``, ``pending_ids``), although a checkpoint
settles first; grants replayed from the log at open become pending again.
``settle_pending_grants`` copies a tenant's pending pairs into its shortlists.

Thread-safety: loop thread only; a search takes ``ids(tenant)`` (an array never changed in
place: every change makes a new one) and reads without the lock.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from vectordb.tenancy.tenant_updates import place

if TYPE_CHECKING:
    from vectordb.tenancy.tenancy import Tenancy

__all__ = ["PendingGrants", "settle_pending_grants"]


class PendingGrants:
    def __init__(self) -> None:
        self._ids: dict[int, np.ndarray] = {}
        self.pairs = 0

    def __bool__(self) -> bool:
        return bool(self._ids)

    def __contains__(self, tenant: int) -> bool:
        return tenant in self._ids

    def tenants(self) -> list[int]:
        return list(self._ids)

    def ids(self, tenant: int) -> np.ndarray:
        """The tenant's pending ids, sorted (empty if none); never changed in place."""
        return self._ids.get(tenant, _EMPTY)

    def count(self, tenant: int) -> int:
        return len(self._ids.get(tenant, _EMPTY))

    def add(self, tenant: int, ids: np.ndarray) -> None:
        """Pairs newly in the access table (none of them pending already)."""
        if not len(ids):
            return
        held = self._ids.get(tenant, _EMPTY)
        merged = np.union1d(held, np.asarray(ids, np.int64))
        self.pairs += len(merged) - len(held)
        self._ids[tenant] = merged

    def remove(self, tenant: int, ids: np.ndarray) -> np.ndarray:
        """Take ``ids`` out of the tenant's pending set; mask of those that were pending."""
        held = self._ids.get(tenant)
        ids = np.asarray(ids, np.int64)
        if held is None or not len(ids):
            return np.zeros(len(ids), bool)
        at = np.minimum(np.searchsorted(held, ids), len(held) - 1)
        hit = held[at] == ids
        if hit.any():
            kept = np.setdiff1d(held, ids[hit], assume_unique=False)
            self.pairs -= len(held) - len(kept)
            if len(kept):
                self._ids[tenant] = kept
            else:
                del self._ids[tenant]
        return hit

    def pop(self, tenant: int) -> np.ndarray:
        held = self._ids.pop(tenant, _EMPTY)
        self.pairs -= len(held)
        return held

    def clear(self) -> None:
        self._ids, self.pairs = {}, 0

    def snapshot(self) -> dict[str, np.ndarray]:
        tenants = [np.full(len(v), t, np.int64) for t, v in self._ids.items()]
        return {
            "pending_tenants": np.concatenate(tenants) if tenants else _EMPTY,
            "pending_ids": np.concatenate(list(self._ids.values())) if self._ids else _EMPTY,
        }

    def restore(self, arrays: dict[str, np.ndarray]) -> None:
        """From a checkpoint (one written before pending grants existed has none)."""
        self.clear()
        tenants = arrays.get("pending_tenants", _EMPTY).astype(np.int64)
        ids = arrays.get("pending_ids", _EMPTY).astype(np.int64)
        for tenant in np.unique(tenants).tolist():
            self.add(tenant, ids[tenants == tenant])

    def resident_bytes(self) -> int:
        return sum(a.nbytes + 120 for a in self._ids.values())


async def settle_pending_grants(tenancy: Tenancy, tenants: list[int]) -> None:
    """Copy ``tenants``' pending pairs into their shortlists: one read of their home copies a
    tenant (in file order), then ``place``. A pair leaves the pending set only once placed,
    so a search meanwhile finds it in one or the other (or both: one result an id)."""
    table, pending = tenancy.table, tenancy.pending
    for tenant in tenants:
        ids = pending.ids(tenant)
        if not len(ids):
            continue
        ids = ids[table.member(ids, np.full(len(ids), tenant, np.int64))]
        _, locations, leaves = table.lookup(ids)
        order = np.argsort(locations, kind="stable")
        ids, locations, leaves = ids[order], locations[order], leaves[order]
        vectors = await tenancy.store.read_home(ids, locations)
        await place(tenancy, tenant, ids, leaves, locations, vectors)
        tenancy.shortlists.compact(tenant)
        pending.pop(tenant)


_EMPTY = np.zeros(0, np.int64)
_EMPTY.flags.writeable = False
