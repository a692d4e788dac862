"""Inserts and deletes (SPFresh's LIRE): append, tombstone, split, merge, reassign.

- **insert**: validate, log (durable), then place each vector by the RNG rule and append it to
  its lists, rewriting only their tail pages. A list pushed over ``posting_limit`` splits.
- **delete**: log, then tombstone the ids in the version map; their copies stay on disk, masked,
  until their lists are rewritten.
- **split**: drop stale copies; if still too long, 2-means into two lists whose heads are real
  members; the old head leaves the navigator. Then *reassign* only vectors that may now be in
  the wrong place: members of the split list that are closer to the old head than to their new
  one, and members of the ``reassign_neighbours`` nearest lists that are closer to a new head
  than to the old one. Each is placed again; if its current list is no longer chosen, it gets a
  new version and new copies (older copies are stale at once).
- **merge**: a list seen (by searches) with <= ``merge_threshold`` live vectors moves its live
  vectors into the nearest neighbouring list that has room, and its head leaves.

All of it runs under ``index.update_lock``; replay of the log at open calls ``apply_insert``.
A checkpoint follows an update once the log is long or the runs copy-on-write freed (reusable
only after a checkpoint) reach a quarter of the file.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from vectordb.clustering import select_heads
from vectordb.errors import DuplicateIdError, InvalidVectorsError
from vectordb.metric import Metric, prepare
from vectordb.placement import place
from vectordb.posting_store import PostingItem
from vectordb.rebalance import merge_lists, split_lists
from vectordb.tenancy.tenant_rows import no_rows, tenant_rows
from vectordb.tenancy.wal_records import TENANT_INSERT, TenantRows, encode_insert
from vectordb.vectors_input import validate_batch
from vectordb.wal import DELETE, INSERT

if TYPE_CHECKING:
    from vectordb.index import SpannIndex

__all__ = [
    "append_placed",
    "apply_insert",
    "check_ids",
    "delete",
    "insert",
    "maybe_checkpoint",
]

_GARBAGE_MIN_PAGES = 1024  # 4 MiB: below this, freed runs never force a checkpoint


async def insert(index: SpannIndex, ids: Any, vectors: Any, tenants: Any = None) -> None:
    ids, vectors = validate_batch(ids, vectors, index.config)
    rows = _tenant_rows(index, tenants, len(ids))
    if len(ids) == 0:
        return
    async with index.update_lock:
        index.check_open()
        live = index.versions.is_live(ids)
        if live.any():
            dup = ids[live][:10].tolist()
            raise DuplicateIdError(f"ids already in the index: {dup}", dup)
        if index.tenancy is None:
            await index.wal.append(INSERT, ids, vectors)
            await apply_insert(index, ids, vectors)
        else:  # one record: the vectors and who may read them are durable together
            await index.wal.append_raw(TENANT_INSERT, len(ids), encode_insert(ids, vectors, rows))
            await apply_insert(index, ids, vectors)
            await index.tenancy.apply_insert(ids, vectors, rows)
        await _merge_pending(index)
        index.counters["inserts"] += len(ids)
    await maybe_checkpoint(index)


async def delete(index: SpannIndex, ids: Any) -> int:
    ids = check_ids(ids)
    if len(ids) == 0:
        return 0
    async with index.update_lock:
        index.check_open()
        await index.wal.append(DELETE, ids, None)
        deleted = int(index.versions.delete(ids).sum())
        if index.tenancy is not None:
            await index.tenancy.apply_delete(ids)
        await _merge_pending(index)
        index.counters["deletes"] += deleted
    await maybe_checkpoint(index)
    return deleted


def _tenant_rows(index: SpannIndex, tenants: Any, n: int) -> TenantRows:
    if index.tenancy is None:
        if tenants is not None:
            from vectordb.tenancy.logged import require

            require(index)  # raises: this index has no tenancy
        return no_rows(0)
    return tenant_rows(tenants, n)


def check_ids(ids: Any) -> np.ndarray:
    array = np.asarray(ids)
    if array.ndim == 0:
        array = array[None]
    if array.ndim != 1 or (array.size and not np.issubdtype(array.dtype, np.integer)):
        raise InvalidVectorsError(f"ids must be a 1-d array of integers, got {array.dtype}")
    return np.unique(array.astype(np.int64))


async def apply_insert(index: SpannIndex, ids: np.ndarray, vectors: np.ndarray) -> None:
    """Place and append validated vectors (no logging); used by insert and by log replay."""
    if len(ids) == 0:
        return
    prepared = prepare(index.metric, vectors)
    stored = prepared if index.metric is Metric.COSINE else vectors
    if index.navigator.n_heads == 0:  # an empty index: its first vectors choose the heads
        rows = select_heads(prepared, index.config.head_fraction, index.config.seed)
        index.navigator.add(prepared[rows], np.array([index.take_pid() for _ in rows]))
    versions = index.versions.next_versions(ids)
    placement = place(prepared, index.navigator, index.config)
    touched = await append_placed(index, placement, ids, versions, stored)
    index.versions.set(ids, versions)
    over = [p for p in touched if index.store.count[p] > index.config.posting_limit]
    if over:
        await split_lists(index, over)


async def append_placed(
    index: SpannIndex,
    placement: np.ndarray,
    ids: np.ndarray,
    versions: np.ndarray,
    stored: np.ndarray,
) -> list[int]:
    """Append row i to every list in ``placement[i]``; returns the lists touched."""
    rows = np.repeat(np.arange(len(ids)), placement.shape[1])
    pids = placement.reshape(-1)
    rows, pids = rows[pids >= 0], pids[pids >= 0]
    order = np.argsort(pids, kind="stable")
    rows, pids = rows[order], pids[order]
    bounds = np.flatnonzero(np.diff(pids)) + 1
    items = [
        PostingItem(int(pids[a]), ids[r], versions[r], stored[r])
        for a, r in zip(np.concatenate([[0], bounds]).tolist(), np.split(rows, bounds), strict=True)
        if len(r)
    ]
    await index.store.append(items)
    return [item.pid for item in items]


async def _merge_pending(index: SpannIndex) -> None:
    if index.merge_candidates:
        pids, index.merge_candidates = sorted(index.merge_candidates), set()
        await merge_lists(index, pids)


async def maybe_checkpoint(index: SpannIndex) -> None:
    """Checkpoint once the log is long, or once runs freed by copy-on-write (which only a
    checkpoint can hand back) are a quarter of the file: rewrites would grow the file."""
    space = index.store.space
    garbage = space.pending_pages >= max(_GARBAGE_MIN_PAGES, space.file_pages // 4)
    if garbage or index.wal.bytes_written >= index.config.checkpoint_wal_bytes:
        from vectordb.checkpoint import checkpoint

        await checkpoint(index)
