"""Bulk build: heads by hierarchical balanced k-means, replicas by the RNG rule, lists to disk.

1. validate every vector before anything is written (dimension, dtype, NaN/inf, duplicate ids);
2. choose heads (clustering.select_heads) and load them into the navigator;
3. place every vector in up to ``replica_count`` lists (placement.place);
4. trim lists over ``posting_limit`` to their nearest members, but never take a vector's last
   copy (such a vector stays in its nearest list);
5. split, in memory, the few lists that the rescued vectors took over the limit;
6. write the lists back to back in head order (heads come in the k-means tree's depth-first
   order, so lists near in space are near in the file and one request reads several; by default
   no room for appends beyond each list's last page (``append_reserve``): a list that grows
   moves, with headroom, to a new run) and checkpoint.

Atomic: the index is visibly built only when the checkpoint commits; a crash before leaves the
empty index of the last checkpoint (its posting pages are free space again on open).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
from tqdm import tqdm

from vectordb.clustering import medoid, select_heads, two_means
from vectordb.errors import IndexConfigError
from vectordb.metric import prepare
from vectordb.placement import place
from vectordb.posting_store import PostingItem
from vectordb.vectors_input import validate_batch

if TYPE_CHECKING:
    from vectordb.index import SpannIndex

__all__ = ["build", "posting_capacity"]

_WRITE_BATCH_BYTES = 64 << 20


def posting_capacity(n_records: int, limit: int) -> int:
    """Records a new run should hold: room for appends, up to the split limit."""
    return max(n_records, min(limit, n_records + max(8, n_records // 2)))


async def build(
    index: SpannIndex, ids: Any, vectors: Any, tenants: Any, *, progress: bool, batch_rows: int
) -> None:
    if index.versions.live_count or index.navigator.n_heads:
        raise IndexConfigError("build needs an empty index; use insert to add to this one")
    ids, vectors = validate_batch(ids, vectors, index.config)
    access = _tenant_rows(index, tenants, len(ids))
    if len(ids) == 0:
        return
    config = index.config
    prepared = prepare(index.metric, vectors)
    stored = prepared if index.metric.value == "cosine" else vectors
    with tqdm(total=len(ids), desc="heads", disable=not progress, unit="vec") as bar:
        heads = select_heads(prepared, config.head_fraction, config.seed, bar.update)
    pids = np.arange(len(heads), dtype=np.int64)
    index.next_pid = len(heads)
    index.navigator.add(prepared[heads], pids)
    placement = np.full((len(ids), config.replica_count), -1, np.int64)
    with tqdm(total=len(ids), desc="placement", disable=not progress, unit="vec") as bar:
        for start in range(0, len(ids), batch_rows):
            chunk = prepared[start : start + batch_rows]
            placement[start : start + len(chunk)] = place(chunk, index.navigator, config)
            bar.update(len(chunk))
    rows, pid_of = _trim(prepared, placement, index, config.posting_limit)
    rows, pid_of = _split_in_memory(index, prepared, rows, pid_of, config.posting_limit)
    versions = np.ones(len(ids), np.uint32)
    await _write_lists(index, rows, pid_of, ids, versions, stored, progress)
    index.versions.set(ids, versions)
    if index.tenancy is not None:
        await index.tenancy.build(ids, vectors, access)
    from vectordb.checkpoint import checkpoint

    await checkpoint(index)


def _tenant_rows(index: SpannIndex, tenants: Any, n: int) -> Any:
    if index.tenancy is None and tenants is None:
        return None
    from vectordb.tenancy import logged, tenant_rows

    logged.require(index)
    return tenant_rows(tenants, n)


def _trim(
    prepared: np.ndarray, placement: np.ndarray, index: SpannIndex, limit: int
) -> tuple[np.ndarray, np.ndarray]:
    """(row, pid) pairs to store, sorted by pid then distance, lists trimmed to ``limit``."""
    rows = np.repeat(np.arange(len(placement)), placement.shape[1])
    pid_of = placement.reshape(-1)
    keep = pid_of >= 0
    rows, pid_of = rows[keep], pid_of[keep]
    dist = np.empty(len(rows), np.float32)
    for start in range(0, len(rows), 1 << 18):
        r, p = rows[start : start + (1 << 18)], pid_of[start : start + (1 << 18)]
        diff = prepared[r] - index.navigator.vectors_of(p)
        dist[start : start + len(r)] = np.einsum("ij,ij->i", diff, diff)
    order = np.lexsort((dist, pid_of))
    rows, pid_of = rows[order], pid_of[order]
    first = np.searchsorted(pid_of, pid_of)  # index of each list's first pair
    rank = np.arange(len(pid_of)) - first
    kept = rank < limit
    copies = np.bincount(rows[kept], minlength=len(placement))
    orphans = np.flatnonzero((copies == 0) & (placement[:, 0] >= 0))  # back to the nearest list
    keep_rows = np.concatenate([rows[kept], orphans])
    keep_pids = np.concatenate([pid_of[kept], placement[orphans, 0]])
    order = np.argsort(keep_pids, kind="stable")
    return keep_rows[order], keep_pids[order]


def _split_in_memory(
    index: SpannIndex, prepared: np.ndarray, rows: np.ndarray, pid_of: np.ndarray, limit: int
) -> tuple[np.ndarray, np.ndarray]:
    """Split the lists that rescued vectors took over the limit, before anything is written:
    2-means until every part fits, each part under a new head (its medoid). No reassignment
    and no I/O: on disk, a split cascade over millions of vectors costs many times the data."""
    counts = np.bincount(pid_of, minlength=index.next_pid)
    over = np.flatnonzero(counts > limit)
    if len(over) == 0:
        return rows, pid_of
    keep = ~np.isin(pid_of, over)
    out_rows, out_pids = [rows[keep]], [pid_of[keep]]
    order = np.argsort(pid_of, kind="stable")
    bounds = np.searchsorted(pid_of[order], np.concatenate([over, over + 1]))
    new_heads: list[int] = []
    new_pids: list[int] = []
    for a, b in zip(bounds[: len(over)].tolist(), bounds[len(over) :].tolist(), strict=True):
        queue = [rows[order[a:b]]]
        while queue:
            members = queue.pop()
            if len(members) > limit:
                labels = two_means(prepared[members], index.config.seed + len(new_pids))
                queue.extend([members[labels == 0], members[labels == 1]])
                continue
            pid = index.take_pid()
            new_heads.append(medoid(prepared, members))
            new_pids.append(pid)
            out_rows.append(members)
            out_pids.append(np.full(len(members), pid, np.int64))
    index.navigator.remove(over.tolist())
    index.navigator.add(prepared[new_heads], np.array(new_pids, np.int64))
    rows, pid_of = np.concatenate(out_rows), np.concatenate(out_pids)
    order = np.argsort(pid_of, kind="stable")
    return rows[order], pid_of[order]


async def _write_lists(
    index: SpannIndex,
    rows: np.ndarray,
    pid_of: np.ndarray,
    ids: np.ndarray,
    versions: np.ndarray,
    stored: np.ndarray,
    progress: bool,
) -> None:
    bounds = np.flatnonzero(np.diff(pid_of)) + 1
    starts = np.concatenate([[0], bounds])
    ends = np.concatenate([bounds, [len(pid_of)]])
    items: list[PostingItem] = []
    pending_bytes = 0
    with tqdm(total=len(starts), desc="write", disable=not progress, unit="list") as bar:
        for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
            r = rows[a:b]
            reserve = int(np.ceil((b - a) * index.config.append_reserve))
            items.append(
                PostingItem(int(pid_of[a]), ids[r], versions[r], stored[r], b - a + reserve)
            )
            pending_bytes += (b - a) * index.store.rec_bytes
            if pending_bytes >= _WRITE_BATCH_BYTES:
                await index.store.write(items)
                bar.update(len(items))
                items, pending_bytes = [], 0
        await index.store.write(items)
        bar.update(len(items))
