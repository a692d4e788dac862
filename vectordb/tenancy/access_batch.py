"""AccessTable's batch forms: entries of many ids, pair changes of a batch, array helpers.

A grant or revoke of many ids searches the table's arrays once for the batch (a search per id
took most of a batch grant's time); what changes is one Entry per id in the table's dict of
changes, as single changes are. A search's access check of every record it read is one
compiled pass over the arrays (``may_read``: the numpy form took ~100 ns a record, most of a
small tenant batch's CPU). Thread-safety: loop thread only (the table's).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import numpy as np
from numba import njit

if TYPE_CHECKING:
    from vectordb.tenancy.access_table import AccessTable

__all__ = ["Entry", "change_pairs", "entries", "may_read", "narrow", "sort_runs"]


class Entry(NamedTuple):
    loc: int
    leaf: int
    tenants: tuple[int, ...]  # sorted tenant numbers


def entries(table: AccessTable, ids: np.ndarray) -> list[Entry | None]:
    """``[table.get(v) for v in ids]`` with one search of the arrays for all of them."""
    ids = np.asarray(ids, np.int64)
    out: list[Entry | None] = [None] * len(ids)
    if table.n_rows and len(ids):
        pos, found = table._find(ids)
        hit = np.flatnonzero(found)
        rows = pos[hit]
        starts = table.ptr[rows].astype(np.int64)
        lengths = table.ptr[rows + 1].astype(np.int64) - starts
        ends = np.cumsum(lengths)
        flat = table.tenants[
            np.repeat(starts, lengths) + np.arange(int(ends[-1]) if len(ends) else 0)
            - np.repeat(ends - lengths, lengths)
        ].tolist()  # fmt: skip
        bounds = np.concatenate([[0], ends]).tolist()
        locs, leaves = table.loc[rows].tolist(), table.leaf[rows].tolist()
        for j, i in enumerate(hit.tolist()):
            out[i] = Entry(locs[j], leaves[j], tuple(flat[bounds[j] : bounds[j + 1]]))
    if table.delta:
        for i in np.flatnonzero(np.isin(ids, table._delta_array())).tolist():
            out[i] = table.delta[int(ids[i])]
    return out


def change_pairs(table: AccessTable, ids: np.ndarray, tenant: int, adding: bool) -> np.ndarray:
    """Add (or remove) ``tenant``'s pair with each id, in order (a repeated id counts once);
    the mask of the pairs changed. One search of the arrays for the batch."""
    changed = np.zeros(len(ids), bool)
    done: set[int] = set()
    for i, (vid, entry) in enumerate(zip(ids.tolist(), table.entries(ids), strict=True)):
        if entry is None or vid in done or (tenant in entry.tenants) == adding:
            continue
        done.add(vid)
        if adding:
            tenants = tuple(sorted((*entry.tenants, tenant)))
        else:
            tenants = tuple(t for t in entry.tenants if t != tenant)
        table._set(vid, entry._replace(tenants=tenants), counted=False, merge=False)
        changed[i] = True
    if done:
        table._count((tenant,), len(done) if adding else -len(done))
        table._maybe_merge()
    return changed


def narrow(values: np.ndarray) -> np.ndarray:
    """Non-negative int64 values as uint32 when they fit (half the bytes; reads widen)."""
    values = np.asarray(values, np.int64)
    if not len(values) or (values.min() >= 0 and values.max() < 2**32):
        return values.astype(np.uint32)
    return values


def sort_runs(values: np.ndarray, ptr: np.ndarray) -> None:
    """Sort each run ``values[ptr[i]:ptr[i+1]]`` in place (runs are short: share degree)."""
    if len(values) < 2:
        return
    run = np.repeat(np.arange(len(ptr) - 1), np.diff(ptr))
    order = np.lexsort((values, run))
    values[:] = values[order]


def may_read(
    table: AccessTable, ids: np.ndarray, tenants: np.ndarray, versions: np.ndarray | None
) -> np.ndarray:
    """Mask over the table's arrays (not its dict of changes): may ``tenants[i]`` read
    ``ids[i]``, and (``versions`` given) is its home location's version ``versions[i]``?"""
    out = np.zeros(len(ids), bool)
    dense = table._first is not None
    checked = np.zeros(0, np.uint32) if versions is None else np.asarray(versions, np.uint32)
    _may_read(
        np.ascontiguousarray(ids, np.int64), np.ascontiguousarray(tenants, np.int64), checked,
        versions is not None, table._first if dense else 0, dense, table.ids, table.n_rows,
        table.loc, table.ptr, table.tenants, out,
    )  # fmt: skip
    return out


@njit(nogil=True, cache=True)
def _may_read(  # type: ignore[no-untyped-def,unused-ignore]
    ids, tenants, versions, with_versions, first, dense, table_ids, n_rows, loc, ptr,
    table_tenants, out,
):  # fmt: skip
    for i in range(len(ids)):
        vid = ids[i]
        if dense:
            pos = vid - first
            if pos < 0 or pos >= n_rows:
                continue
        else:
            pos = np.searchsorted(table_ids, vid)
            if pos >= n_rows or table_ids[pos] != vid:
                continue
        if with_versions and np.uint32(np.int64(loc[pos]) & 0xFFFFFFFF) != versions[i]:
            continue  # a copy of an earlier incarnation does not count
        tenant = tenants[i]
        for m in range(np.int64(ptr[pos]), np.int64(ptr[pos + 1])):
            if table_tenants[m] == tenant:
                out[i] = True
                break
