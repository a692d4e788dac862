"""The default number of lists a query reads, measured on the index itself.

``config.default_postings(heads)`` grows as sqrt(heads), but how far a query's neighbours spread
over the lists depends on the data as much as on the head count: at 165k heads, sqrt gives 46
lists, which reach recall@10 0.92 on one 2M set and 0.70 on a more diffuse one (a diagonal
Gaussian mixture, whose neighbours sit in ~150 lists). So the index measures the spread on
its own vectors (``measure_postings``), after a build, an open and a checkpoint:

1. ``SAMPLES`` stored vectors, one each from lists spread over the index (a fixed seed, so
   every open of the same index measures the same), are the queries;
2. for each, its ``WIDE`` x floor nearest heads (an exact scan of the heads, a piece at a
   time: the same answer at every open) have their lists read (a few at a time, within the
   read buffer) and every live member's exact distance taken; its 10 nearest other vectors
   among them, and for each the rank (by head distance) of the first list holding it;
3. the default is the least list count at which the samples find ``TARGET`` of those
   neighbours, never under the sqrt rule (the floor) and at most the wide count.

``TARGET`` is relative to what the wide read finds, so it sits above the issue's 0.9 of exact
recall: what a wide read misses (~2-5%) is missed at the default too. The samples are stored
vectors, so the rule holds for queries drawn like the data; queries far from it (another
distribution) may need more -- the floor keeps today's default for them, and ``max_postings``
stays the caller's knob. Cost: ``SAMPLES`` x wide lists read once (2M vectors, 165k heads:
~12k lists, ~1-3 s of an open); under ``MIN_HEADS`` heads the floor is taken unmeasured.
The measure is kept with the checkpoint it was taken on (``record``, in the checkpoint's
state: ``MetaStore.update_state``), so reopening an index reads it (``saved_postings``)
instead of measuring again: an open under a tight budget then reads no list and holds no
scratch for it (at 13.7 MiB on debian-minilm the measure's reads and the memory they left
behind, ~2.2 MiB, took the process over its limit). A saved figure is used only for the same
rule (``RULE``) and the same head count; otherwise the index measures at open as before.
Thread-safety: the index's loop thread; nothing is cached in the list cache (reads bypass it).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import numpy as np

from tiers.io import CorruptionError
from vectordb.config import default_postings
from vectordb.metric import distances, pairwise_distances
from vectordb.posting_format import PAGE_BYTES

if TYPE_CHECKING:
    from vectordb.index import SpannIndex

__all__ = [
    "MIN_HEADS",
    "RULE",
    "SAMPLES",
    "STATE_KEY",
    "TARGET",
    "WIDE",
    "measure_postings",
    "postings_for_target",
    "record",
    "saved_postings",
    "worth_measuring",
]

SAMPLES = 32
WIDE = 10  # lists read per sample: this many times the floor
TARGET = 0.97  # of the neighbours the wide read finds: 3% left for what it misses
MIN_HEADS = 256  # below, the floor (a small index reads a good share of its lists anyway)
K = 10
_SEED = 14
# what a saved measure was taken by: a change to any of these measures again
RULE = f"samples={SAMPLES} wide={WIDE} target={TARGET} min_heads={MIN_HEADS} seed={_SEED}"
STATE_KEY = "measured_postings"  # the checkpoint state's entry (``record``)


def record(postings: int, n_heads: int) -> dict[str, Any]:
    """The checkpoint state's entry for a measure of ``postings`` lists on ``n_heads`` heads."""
    return {"postings": int(postings), "heads": int(n_heads), "rule": RULE}


def saved_postings(state: dict[str, Any], n_heads: int) -> int | None:
    """The saved measure in a checkpoint's ``state`` if it holds for ``n_heads`` heads and
    this rule, else None (measure again)."""
    saved = state.get(STATE_KEY)
    if not isinstance(saved, dict) or saved.get("rule") != RULE or saved.get("heads") != n_heads:
        return None
    postings = saved.get("postings")
    if isinstance(postings, bool) or not isinstance(postings, int) or postings < 1:
        return None
    return postings


def postings_for_target(ranks: np.ndarray, target: float, floor: int, wide: int) -> int:
    """The least list count ``p`` in [floor, wide] at which the neighbours' first-list ranks
    (int [samples, K], -1: a neighbour slot left empty, not counted) fall below ``p`` for at
    least ``target`` of the counted neighbours; ``wide`` when none does."""
    counted = ranks[ranks >= 0]
    if len(counted) == 0:
        return floor
    needed = np.sort(counted)
    # the smallest p with #(rank < p) >= target * n: the ceil(target * n)-th smallest rank + 1
    index = max(0, int(np.ceil(target * len(needed) - 1e-9)) - 1)
    return int(min(max(floor, int(needed[index]) + 1), wide))


def worth_measuring(index: SpannIndex) -> bool:
    """Whether ``measure_postings`` measures (else it gives the floor at once)."""
    return index.navigator.n_heads >= MIN_HEADS and index.versions.live_count >= 4 * K


async def measure_postings(index: SpannIndex) -> int:
    """The index's default ``max_postings`` (module docstring). Registered as a search (a
    checkpoint frees no run it may read); the list cache and the read counters are left as
    they were; a list failing its check gives the floor (scrub repairs it)."""
    n_heads = index.navigator.n_heads
    floor = default_postings(n_heads)
    if not worth_measuring(index):
        return floor
    wide = min(n_heads, WIDE * floor)
    store = index.store
    cache, counters = store.cache, dict(store.counters)
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    index.searches.add(done)
    store.cache = None
    try:
        queries, own_ids = await _samples(index)
        if len(queries) == 0:
            return floor
        head_pids = _nearest_heads(index, queries, wide)
        ranks = np.full((len(queries), K), -1, np.int64)
        for row in range(len(queries)):
            ranks[row] = await _neighbour_ranks(index, queries[row], own_ids[row], head_pids[row])
    except CorruptionError:
        return floor
    finally:
        store.cache = cache
        store.counters.update(counters)
        index.searches.discard(done)
        done.set_result(None)
    return postings_for_target(ranks, TARGET, floor, wide)


def _nearest_heads(index: SpannIndex, queries: np.ndarray, wide: int) -> np.ndarray:
    """pids int64 [S, wide] of each query's nearest heads by exact distance, nearest first: a
    scan of the heads a piece at a time (the HNSW graph is built by several threads, so its
    answers, and a measure taken through it, would differ from one open to the next)."""
    rows = max(64, _scratch_bytes(index) // (4 * index.config.dim))
    best_pids = np.zeros((len(queries), 0), np.int64)
    best_dist = np.zeros((len(queries), 0), np.float32)
    for pids, vectors in index.navigator.pieces(rows):
        dist = np.concatenate([best_dist, pairwise_distances(index.metric, queries, vectors)], 1)
        both = np.concatenate([best_pids, np.broadcast_to(pids, (len(queries), len(pids)))], 1)
        keep = np.argpartition(dist, wide - 1, axis=1)[:, :wide] if dist.shape[1] > wide else None
        if keep is not None:
            dist = np.take_along_axis(dist, keep, axis=1)
            both = np.take_along_axis(both, keep, axis=1)
        best_dist, best_pids = dist, both
    order = np.argsort(best_dist, axis=1, kind="stable")
    return np.take_along_axis(best_pids, order, axis=1)


def _scratch_bytes(index: SpannIndex) -> int:
    """Bytes of lists read, or of heads widened, at a time: a quarter of the budget's read
    buffer (the measure runs while an index opens, beside what it already holds: at a 13.7
    MiB limit a full buffer's worth of reads and copies took the opening over), 4 MiB without
    a budget."""
    read = index.memory.read_buffer_bytes
    return (4 << 20) if read is None else max(64 << 10, read // 4)


async def _samples(index: SpannIndex) -> tuple[np.ndarray, np.ndarray]:
    """(prepared vectors float32 [S, dim], their ids): a live member of each of ``SAMPLES``
    lists picked evenly at random."""
    rng = np.random.default_rng(_SEED)
    lists = np.flatnonzero(index.store.count > 0)
    if len(lists) == 0:
        return np.zeros((0, index.config.dim), np.float32), np.zeros(0, np.int64)
    picked = np.sort(rng.choice(lists, min(SAMPLES, len(lists)), replace=False))
    batch = await index.store.read(picked)
    vectors, ids = [], []
    for i in range(len(picked)):
        records = batch.records[batch.starts[i] : batch.starts[i + 1]]
        live = records[index.versions.valid(records["id"], records["version"])]
        if len(live):
            one = live[int(rng.integers(len(live)))]
            vectors.append(np.asarray(one["vector"], np.float32))
            ids.append(int(one["id"]))
    if not vectors:
        return np.zeros((0, index.config.dim), np.float32), np.zeros(0, np.int64)
    return np.stack(vectors), np.asarray(ids, np.int64)


async def _neighbour_ranks(
    index: SpannIndex, query: np.ndarray, own_id: int, head_pids: np.ndarray
) -> np.ndarray:
    """int64 [K]: for the query's K nearest other live vectors in the lists ``head_pids``
    (nearest head first), the rank of the first list holding each; -1 for slots left empty."""
    head_pids = head_pids[head_pids >= 0]
    sizes = index.store.pages_of(head_pids) * PAGE_BYTES
    limit = max(_scratch_bytes(index), int(sizes.max(initial=0)))
    best_ids = np.zeros(0, np.int64)
    best_dist = np.zeros(0, np.float32)
    best_rank = np.zeros(0, np.int64)
    first = 0
    while first < len(head_pids):  # a few lists at a time: the read stays within a buffer
        last = first + max(1, int(np.searchsorted(np.cumsum(sizes[first:]), limit, "right")))
        batch = await index.store.read(head_pids[first:last])
        records = batch.records
        keep = index.versions.valid(records["id"], records["version"]) & (records["id"] != own_id)
        list_rank = np.repeat(np.arange(first, last), np.diff(batch.starts))[keep]
        ids = records["id"][keep]
        vectors = records["vector"]  # a view: float32 records are not copied again
        vectors = vectors if vectors.dtype == np.float32 else vectors.astype(np.float32)
        dist = distances(index.metric, query, vectors)[keep]
        del batch, records, vectors
        best_ids = np.concatenate([best_ids, ids])
        best_dist = np.concatenate([best_dist, dist])
        best_rank = np.concatenate([best_rank, list_rank])
        # replicas: keep each id's first list (the lists come nearest first); then the K best
        _, first_seen = np.unique(best_ids, return_index=True)
        order = first_seen[np.argsort(best_dist[first_seen], kind="stable")][:K]
        best_ids, best_dist, best_rank = best_ids[order], best_dist[order], best_rank[order]
        first = last
    out = np.full(K, -1, np.int64)
    out[: len(best_rank)] = best_rank
    return out
