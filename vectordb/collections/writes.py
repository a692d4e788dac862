"""How each write changes the point store, and what it then owes the index.

Every function here reads the store, checks the caller's right to each point, and returns a
Plan: the StoreChange to commit and the intent (intents.py) to apply after it. None writes;
the collection commits the plan under its write lock, so what a plan read is still true when
it commits. A refused write (PointNotWritableError, QuotaExceededError) raises before any plan.

Rights: the admin (tenant None) may change any point. A tenant may overwrite and delete the
points it owns (wrote first); deleting a point it was only granted revokes its own grant.
A write never changes who else may read a point: overwriting keeps its owner and grants.

Thread-safety: loop thread, under the collection's write lock.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vectordb.collections.errors import PointNotWritableError, QuotaExceededError
from vectordb.collections.labels import tenant_label
from vectordb.collections.point_records import PointRecord
from vectordb.collections.point_store import PointStore, StoreChange
from vectordb.collections.points import PointId, point_key

__all__ = ["Plan", "plan_access", "plan_delete", "plan_upsert"]


@dataclass
class Plan:
    change: StoreChange
    ops: list[list[Any]]
    records: dict[int, PointRecord] = field(default_factory=dict)  # of inserted ids
    affected: int = 0


def plan_upsert(
    store: PointStore,
    point_ids: list[PointId],
    vectors: np.ndarray,
    payloads: list[dict[str, Any] | None],
    tenant: str | None,
    visible_now: int,
    max_points: int | None,
) -> Plan:
    """``visible_now``: points the tenant may read now (for ``max_points``)."""
    keys = [point_key(p) for p in point_ids]
    olds = store.lookup(keys)
    old_ids = [o for o in olds if o is not None]
    old_records = dict(zip(old_ids, store.records(old_ids), strict=True))
    for point_id, old in zip(point_ids, olds, strict=True):
        record = old_records.get(old) if old is not None else None
        if tenant is not None and record is not None and record.owner != tenant:
            raise PointNotWritableError(f"point {point_id!r} cannot be written with this key")
    new_points = sum(o is None for o in olds)
    if tenant is not None and max_points is not None and visible_now + new_points > max_points:
        raise QuotaExceededError(
            f"the key's tenant may hold {max_points} points: it holds {visible_now}, "
            f"this write adds {new_points}"
        )
    # an overwrite keeps the point's internal id (the index re-inserts it as a new version), so
    # the ids, and what the index keeps per id, grow with the points, not with the writes
    fresh = iter(store.take_ids(new_points))
    ids = [old if old is not None else next(fresh) for old in olds]
    change = StoreChange()
    records = {}
    for i, (point_id, old) in enumerate(zip(point_ids, olds, strict=True)):
        before = old_records.get(old) if old is not None else None
        owner = before.owner if before is not None else tenant
        tenants = before.tenants if before is not None else ([tenant] if tenant else [])
        records[ids[i]] = PointRecord(point_id, owner, tenants, payloads[i], vectors[i])
        if old is None:
            change.mapped[keys[i]] = ids[i]
    change.records = records
    ops = [["delete", old_ids], ["insert", ids]]  # in this order: an overwrite re-inserts
    return Plan(change, ops, records, len(point_ids))


def plan_delete(store: PointStore, point_ids: list[PointId], tenant: str | None) -> Plan:
    keys = [point_key(p) for p in point_ids]
    found = [(k, i) for k, i in zip(keys, store.lookup(keys), strict=True) if i is not None]
    records = store.records([i for _, i in found])
    return _delete_found(found, records, tenant)


def plan_delete_records(
    found: list[tuple[bytes, int]], records: list[PointRecord | None], tenant: str | None
) -> Plan:
    """Delete points already looked up (a filter's scan): (point key, internal id) pairs."""
    return _delete_found(found, records, tenant)


def _delete_found(
    found: list[tuple[bytes, int]], records: list[PointRecord | None], tenant: str | None
) -> Plan:
    change = StoreChange()
    revoked = []
    for (key, internal_id), record in zip(found, records, strict=True):
        if record is None:
            continue
        if tenant is None or record.owner == tenant:
            change.dropped.append(internal_id)
            change.unmapped.append(key)
        elif tenant in record.tenants:
            record.tenants = [t for t in record.tenants if t != tenant]
            change.records[internal_id] = record
            revoked.append(internal_id)
    ops: list[list[Any]] = [["delete", change.dropped]]
    if revoked:
        ops.append(["revoke", tenant_label(tenant or ""), revoked])
    return Plan(change, ops, affected=len(change.dropped) + len(revoked))


def plan_access(store: PointStore, point_ids: list[PointId], tenant: str, grant: bool) -> Plan:
    """Grant ``tenant`` reading ``point_ids``, or revoke it (admin only). Revoking a point's
    owner leaves the point to the admin (a writer must be able to read what it writes)."""
    keys = [point_key(p) for p in point_ids]
    internal = [i for i in store.lookup(keys) if i is not None]
    change = StoreChange()
    changed = []
    for internal_id, record in zip(internal, store.records(internal), strict=True):
        if record is None or (tenant in record.tenants) == grant:
            continue
        if grant:
            record.tenants = [*record.tenants, tenant]
        else:
            record.tenants = [t for t in record.tenants if t != tenant]
            record.owner = None if record.owner == tenant else record.owner
        change.records[internal_id] = record
        changed.append(internal_id)
    ops = [["grant" if grant else "revoke", tenant_label(tenant), changed]]
    return Plan(change, ops, affected=len(changed))
