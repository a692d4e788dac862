"""Scans of a collection's point store: pages, filter matches, keyword values.

Each reads the store in one read transaction and checks the caller's access on the record's
copy of its tenants (point_records.py), which every write keeps equal to the index's labels.
They are full scans (a filter over payloads has no index here): callers run them on a worker
thread.

Thread-safety: any thread (LMDB read transactions).
"""

from __future__ import annotations

from vectordb.collections.filters import Filter
from vectordb.collections.labels import keyword_labels
from vectordb.collections.point_records import PointRecord
from vectordb.collections.point_store import PointStore
from vectordb.collections.points import point_key

__all__ = ["keyword_grants", "matching_keys", "page"]


def page(
    store: PointStore, start: bytes | None, n: int, filt: Filter | None, tenant: str | None
) -> list[PointRecord]:
    """Up to ``n`` records the caller may read and ``filt`` matches, in point key order from
    the first key >= ``start``."""
    out: list[PointRecord] = []
    for _, record in store.keyed(start):
        if _visible(record, filt, tenant):
            out.append(record)
            if len(out) == n:
                break
    return out


def matching_keys(
    store: PointStore, filt: Filter | None, tenant: str | None
) -> list[tuple[bytes, int]]:
    """(point key, internal id) of every point the caller may read and ``filt`` matches."""
    return [
        (point_key(record.point_id), internal_id)
        for internal_id, record in store.scan()
        if _visible(record, filt, tenant)
    ]


def keyword_grants(store: PointStore, field: str) -> dict[str, list[int]]:
    """Each keyword label of ``field``'s values -> the internal ids holding that value."""
    grants: dict[str, list[int]] = {}
    for internal_id, record in store.scan():
        for label in keyword_labels(record.payload, [field]):
            grants.setdefault(label, []).append(internal_id)
    return grants


def _visible(record: PointRecord, filt: Filter | None, tenant: str | None) -> bool:
    if tenant is not None and tenant not in record.tenants:
        return False
    return filt is None or filt.matches(record.point_id, record.payload)
