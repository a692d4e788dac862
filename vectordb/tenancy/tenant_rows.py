"""Tenant rows: which tenants may read each row of an insert, as the caller gives them.

Accepted forms, for ``n`` rows:

- a sequence of ``n`` iterables of tenant ids (``[["acme", 7], [], [7]]``);
- a CSR pair ``(indptr, tenant_ids)``: row i's tenants are ``tenant_ids[indptr[i]:indptr[i+1]]``
  (``indptr`` a numpy integer array of n + 1 non-decreasing offsets from 0; ``tenant_ids`` a
  numpy integer array or a sequence of ids), the form of ``debian-minilm/doc_tenants.npz``.

Normalised to wal_records.TenantRows: ``(indptr int64, refs int64, names)`` with each distinct
name once. A tenant repeated within a row counts once. Checked before anything is written.
Thread-safety: pure functions.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from vectordb.errors import InvalidTenantError
from vectordb.tenancy.tenant_names import TenantId, check_tenant
from vectordb.tenancy.wal_records import TenantRows

__all__ = ["no_rows", "tenant_rows"]


def no_rows(n: int) -> TenantRows:
    return np.zeros(n + 1, np.int64), np.zeros(0, np.int64), []


def tenant_rows(tenants: Any, n: int) -> TenantRows:
    if tenants is None:
        return no_rows(n)
    if _is_csr(tenants, n):
        indptr, flat = tenants
        indptr = _indptr(indptr, n)
        names, refs = _flat_names(flat, int(indptr[-1]))
    else:
        rows = list(tenants)
        if len(rows) != n:
            raise InvalidTenantError(f"tenants has {len(rows)} rows for {n} vectors")
        lengths = []
        flat_list: list[TenantId] = []
        for row in rows:
            if isinstance(row, (str, bytes)) or not hasattr(row, "__iter__"):
                raise InvalidTenantError(
                    f"each row of tenants is an iterable of tenant ids, got {type(row).__name__}"
                )
            items = list(row)
            lengths.append(len(items))
            flat_list += items
        indptr = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]).astype(np.int64)
        names, refs = _flat_names(flat_list, len(flat_list))
    return _dedup_rows(indptr, refs, names)


def _is_csr(tenants: Any, n: int) -> bool:
    """A 2-tuple whose first item is an integer numpy array of n + 1 offsets (a tuple of two
    rows for two vectors stays rows)."""
    if not (isinstance(tenants, tuple) and len(tenants) == 2):
        return False
    first = tenants[0]
    return (
        isinstance(first, np.ndarray)
        and np.issubdtype(first.dtype, np.integer)
        and first.shape == (n + 1,)
    )


def _indptr(indptr: Any, n: int) -> np.ndarray:
    array = np.asarray(indptr)
    if array.ndim != 1 or len(array) != n + 1 or not np.issubdtype(array.dtype, np.integer):
        raise InvalidTenantError(f"indptr must be {n + 1} integers, got shape {array.shape}")
    array = array.astype(np.int64)
    if array[0] != 0 or (np.diff(array) < 0).any():
        raise InvalidTenantError("indptr must start at 0 and never decrease")
    return array


def _flat_names(flat: Any, size: int) -> tuple[list[TenantId], np.ndarray]:
    if isinstance(flat, np.ndarray) and np.issubdtype(flat.dtype, np.integer):
        if flat.ndim != 1 or len(flat) != size:
            raise InvalidTenantError(f"tenant_ids must be {size} ids, got shape {flat.shape}")
        if size and flat.min() < 0:
            raise InvalidTenantError(f"a tenant id is an int >= 0, got {int(flat.min())}")
        values, refs = np.unique(flat.astype(np.int64), return_inverse=True)
        return [int(v) for v in values.tolist()], refs.astype(np.int64)
    items = list(flat)
    if len(items) != size:
        raise InvalidTenantError(f"tenant_ids must be {size} ids, got {len(items)}")
    numbers: dict[TenantId, int] = {}
    refs = np.fromiter(
        (numbers.setdefault(check_tenant(t), len(numbers)) for t in items), np.int64, len(items)
    )
    return list(numbers), refs


def _dedup_rows(indptr: np.ndarray, refs: np.ndarray, names: list[TenantId]) -> TenantRows:
    if not len(refs):
        return indptr, refs, names
    row = np.repeat(np.arange(len(indptr) - 1), np.diff(indptr))
    pairs = np.unique(row * len(names) + refs)
    row, refs = pairs // len(names), pairs % len(names)
    indptr = np.searchsorted(row, np.arange(len(indptr)), side="left").astype(np.int64)
    return indptr, refs.astype(np.int64), names
