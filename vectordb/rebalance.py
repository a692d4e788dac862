"""Split and merge posting lists, and reassign the vectors a split may have misplaced (LIRE).

See updates.py for the protocol. Every list a split or merge replaces is written to a new run
(copy-on-write), so the last checkpoint's pages stay intact until the next one.
Concurrency: callers hold ``index.update_lock``.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import numpy as np

from vectordb.build import posting_capacity
from vectordb.clustering import two_means
from vectordb.metric import Metric, pairwise_distances
from vectordb.placement import place
from vectordb.posting_store import PostingItem

if TYPE_CHECKING:
    from vectordb.index import SpannIndex

__all__ = ["merge_lists", "split_lists"]

_MAX_SPLITS_PER_CALL = 10_000  # a cascade always ends (each split adds a head); a safety net


async def split_lists(index: SpannIndex, pids: list[int]) -> None:
    queue = list(dict.fromkeys(pids))
    budget = _MAX_SPLITS_PER_CALL
    while queue and budget:
        pid = queue.pop()
        if index.store.count[pid] <= index.config.posting_limit:
            continue
        budget -= 1
        queue.extend(await _split(index, pid))


async def _split(index: SpannIndex, pid: int) -> list[int]:
    """Split one list; returns lists that grew over the limit while reassigning."""
    config = index.config
    batch = await index.store.read(np.array([pid]))
    records = batch.records[index.versions.valid(batch.records["id"], batch.records["version"])]
    ids, versions = records["id"].copy(), records["version"].copy()
    stored = records["vector"].copy()
    limit = config.posting_limit
    if len(records) <= limit:  # stale copies were the excess: rewrite without them
        await index.store.write(
            [PostingItem(pid, ids, versions, stored, posting_capacity(len(ids), limit))]
        )
        return []
    vectors = stored.astype(np.float32)
    labels = two_means(vectors, config.seed + pid)
    old_head = index.navigator.vectors_of(np.array([pid]))
    new_pids, new_heads, items = [], [], []
    for side in (0, 1):
        rows = np.flatnonzero(labels == side)
        centre = vectors[rows].mean(axis=0, keepdims=True)
        head_row = rows[np.argmin(pairwise_distances(Metric.L2, centre, vectors[rows])[0])]
        new_pid = index.take_pid()
        new_pids.append(new_pid)
        new_heads.append(vectors[head_row])
        items.append(PostingItem(new_pid, ids[rows], versions[rows], stored[rows]))
        items[-1].capacity = posting_capacity(len(rows), limit)
    await index.store.write(items)
    await index.heads_quiet()
    index.store.drop(pid)
    index.navigator.remove([pid])
    heads = np.stack(new_heads)
    index.navigator.add(heads, np.array(new_pids))
    index.counters["splits"] += 1
    own = np.where(labels == 0, new_pids[0], new_pids[1])
    lopsided = [p for p in new_pids if index.store.count[p] > limit]  # 2-means can be uneven
    moved = await _reassign(index, pid, old_head, heads, np.array(new_pids), ids, vectors, own)
    return lopsided + moved


async def _reassign(
    index: SpannIndex,
    old_pid: int,
    old_head: np.ndarray,
    heads: np.ndarray,
    new_pids: np.ndarray,
    ids: np.ndarray,
    vectors: np.ndarray,
    own: np.ndarray,
) -> list[int]:
    metric = index.metric
    # members of the split list that are nearer the old head than to both new ones
    to_new = pairwise_distances(metric, vectors, heads)
    to_old = pairwise_distances(metric, vectors, old_head)[:, 0]
    suspect = (to_old <= to_new[:, 0]) & (to_old <= to_new[:, 1])
    cand_ids, cand_vectors, cand_home = [ids[suspect]], [vectors[suspect]], [own[suspect]]
    # members of neighbouring lists that are nearer a new head than the old one
    near, _ = index.navigator.search(old_head, index.config.reassign_neighbours + 2)
    neighbours = np.array([p for p in near[0].tolist() if p >= 0 and p not in new_pids])
    if len(neighbours):
        batch = await index.store.read(neighbours)
        rec = batch.records
        valid = index.versions.valid(rec["id"], rec["version"])
        home = np.repeat(neighbours, np.diff(batch.starts))
        vec = np.asarray(rec["vector"], np.float32)
        to_new = pairwise_distances(metric, vec, heads).min(axis=1)
        to_old = pairwise_distances(metric, vec, old_head)[:, 0]
        home_heads = index.navigator.vectors_of(neighbours)[np.repeat(
            np.arange(len(neighbours)), np.diff(batch.starts))]  # fmt: skip
        to_home = _rowwise(metric, vec, home_heads)
        # SPFresh's condition (a new head nearer than the old one), narrowed to vectors that
        # a new head is nearer to than their own list's head: others keep their list
        moved = valid & (to_new <= to_old) & (to_new < to_home)
        cand_ids.append(rec["id"][moved])
        cand_vectors.append(vec[moved])
        cand_home.append(home[moved])
    ids_all = np.concatenate(cand_ids)
    if len(ids_all) == 0:
        return []
    ids_all, first = np.unique(ids_all, return_index=True)
    vec_all = np.concatenate(cand_vectors)[first]
    home_all = np.concatenate(cand_home)[first]
    placement = place(vec_all, index.navigator, index.config)
    stays = (placement == home_all[:, None]).any(axis=1)
    move = ~stays
    if not move.any():
        return []
    from vectordb.updates import append_placed

    ids_m = ids_all[move]
    versions = index.versions.next_versions(ids_m)
    stored = vec_all[move].astype(index.config.numpy_dtype)
    touched = await append_placed(index, placement[move], ids_m, versions, stored)
    # A search that took its view of the lists before these appends would see neither copy
    # once the version moves on: let those finish first (later ones see both copies).
    readers = list(index.searches)
    if readers:
        await asyncio.gather(*readers, return_exceptions=True)
    index.versions.set(ids_m, versions)
    index.counters["reassigned"] += int(move.sum())
    return [p for p in touched if index.store.count[p] > index.config.posting_limit]


async def merge_lists(index: SpannIndex, pids: list[int]) -> None:
    for pid in pids:
        if index.navigator.n_heads <= 1 or pid >= len(index.store.capacity):
            return
        if not index.store.capacity[pid] and not index.store.count[pid]:
            continue
        await _merge(index, pid)


async def _merge(index: SpannIndex, pid: int) -> None:
    config = index.config
    batch = await index.store.read(np.array([pid]))
    rec = batch.records[index.versions.valid(batch.records["id"], batch.records["version"])]
    if len(rec) > config.merge_threshold:
        return
    head = index.navigator.vectors_of(np.array([pid]))
    near, _ = index.navigator.search(head, 9)
    target = next(
        (p for p in near[0].tolist() if p >= 0 and p != pid
         and index.store.count[p] + len(rec) <= config.posting_limit),
        None,
    )  # fmt: skip
    if target is None:
        return
    if len(rec):
        there = (await index.store.read(np.array([target]))).records
        live_there = there["id"][index.versions.valid(there["id"], there["version"])]
        rec = rec[~np.isin(rec["id"], live_there)]  # never two valid copies in one list
    if len(rec):
        item = PostingItem(target, rec["id"].copy(), rec["version"].copy(), rec["vector"].copy())
        await index.store.append([item])
    await index.heads_quiet()
    index.store.drop(pid)
    index.navigator.remove([pid])
    index.counters["merges"] += 1


def _rowwise(metric: Metric, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Distance of a[i] to b[i] in the internal metric."""
    if metric is Metric.L2:
        diff = a - b
        return np.einsum("ij,ij->i", diff, diff)
    return -np.einsum("ij,ij->i", a, b)
