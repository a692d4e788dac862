"""How shortlists change: place (grant, insert), split, settle (revoke, delete), bulk place.

- **place** pairs of one tenant (Curator's grant): walk each vector's path from the root; the
  first node that holds the tenant's shortlist takes it; a node the tenant has nothing under
  gets a new shortlist; internal nodes are passed through. Copies are appended (tail pages
  only) or written as new runs, one submission each. A shortlist pushed past the limit whose
  node is not a leaf **splits**: its run is read, its live records go to the children on their
  paths (recursively while a child would still be over the limit) and the node becomes internal.
- **settle** a shortlist that lost pairs (revoke, delete): an empty one is dropped, and internal
  nodes left without children after it; then, going up, siblings that are all shortlists and
  together hold at most the limit **merge** into their parent. A run whose stale records
  outnumber its live ones (and 16) is rewritten.
- **bulk place** (build, or a young index's tree trained again): every pair of a tenant at
  once, top down: a node whose share of the tenant fits the limit, or a leaf, is a shortlist.
  The result satisfies the same invariants as the incremental path.

Records are filtered whenever a run is rewritten: only pairs the access table still holds,
at the vector's current location, each id once.
Concurrency: under the index's update lock.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from vectordb.build import posting_capacity
from vectordb.posting_store import PostingItem
from vectordb.tenancy.shortlists import Shortlist, TenantTreeMap, mark_internal
from vectordb.tenancy.tenant_store import location_versions

if TYPE_CHECKING:
    from vectordb.tenancy.tenancy import Tenancy

__all__ = ["bulk_items", "live_records", "place", "settle"]

_COMPACT_MIN_STALE = 16


def live_records(tenancy: Tenancy, records: np.ndarray, tenant: int) -> np.ndarray:
    """The records of ``records`` that ``tenant`` may read now, at their current copy, once."""
    kept = records[tenancy.table.readable(records["id"], records["version"], tenant)]
    _, first = np.unique(kept["id"], return_index=True)
    return kept[np.sort(first)] if len(first) < len(kept) else kept


async def place(
    tenancy: Tenancy, tenant: int, ids: np.ndarray, leaves: np.ndarray, locations: np.ndarray,
    vectors: np.ndarray,
) -> None:  # fmt: skip
    """Put pairs (already in the access table) into ``tenant``'s shortlists."""
    tree, shortlists = tenancy.tree, tenancy.shortlists.edit(tenant)
    rows_of: dict[int, list[int]] = {}
    fresh: set[int] = set()
    for row, leaf in enumerate(leaves.tolist()):
        for node in tree.path(leaf):
            if node not in shortlists:
                shortlists[node] = Shortlist(tenancy.store.take_pid(), 0)
                fresh.add(node)
            entry = shortlists[node]
            if entry is None:
                continue  # internal: on down the path
            entry.live += 1
            rows_of.setdefault(node, []).append(row)
            break
    for node in [n for n in fresh if len(rows_of[n]) > tenancy.limit and not tree.is_leaf(n)]:
        _split_fresh(tenancy, shortlists, node, leaves, rows_of, fresh)
    versions = location_versions(locations)
    writes, appends = [], []
    over = [n for n in rows_of if n not in fresh and _over(tenancy, shortlists, n)]
    switch = await _split_with(tenancy, tenant, over, rows_of, ids, versions, vectors, leaves)
    for _, _, made in switch:
        writes += [item for _, _, item in made]
    for node, rows in rows_of.items():
        sl = shortlists[node]
        assert sl is not None
        item = PostingItem(sl.pid, ids[rows], versions[rows], vectors[rows])
        if node in fresh:
            item.capacity = posting_capacity(len(rows), tenancy.limit)
            writes.append(item)
        else:
            appends.append(item)
    await tenancy.store.write(writes)  # every new run of the call in one submission
    await tenancy.store.append(appends)
    for node, old, made in switch:  # written: the map may point at them now
        shortlists[node] = None
        for child, entry, _ in made:
            shortlists[child] = entry
            mark_internal(shortlists, child, tree.parent, node)
        tenancy.store.release(old.pid)
        tenancy.counters["shortlist_splits"] += 1
    for node in rows_of:
        entry = shortlists.get(node)
        if entry is not None and entry.live > tenancy.limit and not tree.is_leaf(node):
            await _split(tenancy, tenant, node)


def _over(tenancy: Tenancy, shortlists: TenantTreeMap, node: int) -> bool:
    entry = shortlists[node]
    return entry is not None and entry.live > tenancy.limit and not tenancy.tree.is_leaf(node)


async def _split_with(
    tenancy: Tenancy, tenant: int, nodes: list[int], rows_of: dict[int, list[int]],
    ids: np.ndarray, versions: np.ndarray, vectors: np.ndarray, leaves: np.ndarray,
) -> list[tuple[int, Shortlist, list[tuple[int, Shortlist, PostingItem]]]]:  # fmt: skip
    """Split written shortlists that this call's rows push past the limit, with those rows,
    before anything is appended (one read of the old runs and one write of the new ones,
    not an append, a read back and a rewrite). Takes the nodes' rows out of ``rows_of``;
    returns (node, old shortlist, [(child, shortlist, run to write)]) for the caller to write
    and then to switch the map to (a search meanwhile reads the old run, whole)."""
    if not nodes:
        return []
    shortlists = tenancy.shortlists.edit(tenant)
    olds = [shortlists[n] for n in nodes]
    batch = await tenancy.store.read(np.array([e.pid for e in olds if e is not None]))
    out = []
    for k, (node, old) in enumerate(zip(nodes, olds, strict=True)):
        assert old is not None
        rows = np.array(rows_of.pop(node), np.int64)
        held = live_records(tenancy, batch.records[batch.starts[k] : batch.starts[k + 1]], tenant)
        held = held[~np.isin(held["id"], ids[rows])]  # a stale copy of an id granted again
        _, _, held_leaves = tenancy.table.lookup(held["id"])
        all_ids = np.concatenate([held["id"], ids[rows]])
        all_versions = np.concatenate([held["version"], versions[rows]])
        all_vectors = np.concatenate([held["vector"], vectors[rows]])
        all_leaves = np.concatenate([held_leaves, leaves[rows]])
        made = []
        for child, part in _distribute(tenancy, node, all_leaves, np.arange(len(all_ids))):
            entry = Shortlist(tenancy.store.take_pid(), len(part))
            capacity = posting_capacity(len(part), tenancy.limit)
            fields = (all_ids[part], all_versions[part], all_vectors[part])
            made.append((child, entry, PostingItem(entry.pid, *fields, capacity=capacity)))
        out.append((node, old, made))
    return out


def _split_fresh(
    tenancy: Tenancy, shortlists: TenantTreeMap, node: int, leaves: np.ndarray,
    rows_of: dict[int, list[int]], fresh: set[int],
) -> None:  # fmt: skip
    """Split a shortlist this call made, in memory, before anything is written (a tenant's
    first thousand vectors are written once, not written, read back and split)."""
    entry = shortlists[node]
    assert entry is not None
    tenancy.store.free_pids.append(entry.pid)  # never written: nothing to free on disk
    shortlists[node] = None
    fresh.discard(node)
    for child, rows in _distribute(tenancy, node, leaves, np.array(rows_of.pop(node))):
        shortlists[child] = Shortlist(tenancy.store.take_pid(), len(rows))
        mark_internal(shortlists, child, tenancy.tree.parent, node)
        rows_of[child] = rows.tolist()
        fresh.add(child)


async def _split(tenancy: Tenancy, tenant: int, node: int) -> None:
    shortlists = tenancy.shortlists.edit(tenant)
    old = shortlists[node]
    assert old is not None
    batch = await tenancy.store.read(np.array([old.pid]))
    records = live_records(tenancy, batch.records, tenant)
    _, _, leaves = tenancy.table.lookup(records["id"])
    items: list[PostingItem] = []
    made: list[tuple[int, Shortlist]] = []
    for child, rows in _distribute(tenancy, node, leaves, np.arange(len(records))):
        made.append((child, Shortlist(tenancy.store.take_pid(), len(rows))))
        part = records[rows]
        capacity = posting_capacity(len(rows), tenancy.limit)
        items.append(PostingItem(made[-1][1].pid, *_fields(part), capacity=capacity))
    # the new runs are written before the map points at them: a search meanwhile still
    # reads the old shortlist, whole
    await tenancy.store.write(items)
    shortlists[node] = None
    for child, entry in made:
        shortlists[child] = entry
        mark_internal(shortlists, child, tenancy.tree.parent, node)
    tenancy.store.release(old.pid)
    tenancy.counters["shortlist_splits"] += 1
    if not made:  # nothing live was left under it
        del shortlists[node]
        _prune(tenancy, tenant, int(tenancy.tree.parent[node]))


def _fields(records: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return records["id"], records["version"], records["vector"]


def _distribute(
    tenancy: Tenancy, node: int, leaves: np.ndarray, rows: np.ndarray
) -> list[tuple[int, np.ndarray]]:
    """(node, rows) shortlists for rows under ``node``: each fits, or sits at a leaf."""
    tree = tenancy.tree
    if len(rows) <= tenancy.limit or tree.is_leaf(node):
        return [(node, rows)] if len(rows) else []
    depth = int(tree.depth[node]) + 1
    child_of = tree.ancestor[leaves[rows], depth]
    out: list[tuple[int, np.ndarray]] = []
    for child in np.unique(child_of).tolist():
        out += _distribute(tenancy, child, leaves, rows[child_of == child])
    return out


async def settle(tenancy: Tenancy, tenant: int, node: int) -> None:
    """Restore the invariants after ``node``'s shortlist lost pairs."""
    if tenant not in tenancy.shortlists:
        return
    shortlists = tenancy.shortlists.edit(tenant)
    entry = shortlists.get(node)
    if entry is None:
        return  # merged away meanwhile
    parent = int(tenancy.tree.parent[node])
    if entry.live <= 0:
        tenancy.store.release(entry.pid)
        del shortlists[node]
        _prune(tenancy, tenant, parent)
    elif tenancy.store.run_count(entry.pid) - entry.live > max(entry.live, _COMPACT_MIN_STALE):
        await _rewrite(tenancy, tenant, node, [node])
    while parent >= 0 and parent not in shortlists:  # pruned away: merge from what is left
        parent = int(tenancy.tree.parent[parent])
    while parent >= 0 and await _merge(tenancy, tenant, parent):
        parent = int(tenancy.tree.parent[parent])


def _prune(tenancy: Tenancy, tenant: int, node: int) -> None:
    """Drop internal nodes of ``tenant`` left with no child, from ``node`` up."""
    shortlists = tenancy.shortlists.edit(tenant)
    tree = tenancy.tree
    while node >= 0 and shortlists.get(node, False) is None:
        if any(c in shortlists for c in tree.children(node)):
            return
        del shortlists[node]
        node = int(tree.parent[node])


async def _merge(tenancy: Tenancy, tenant: int, node: int) -> bool:
    """Merge ``node``'s children into it if they are all shortlists that fit together."""
    shortlists = tenancy.shortlists.edit(tenant)
    if shortlists.get(node, False) is not None:
        return False
    kids = [c for c in tenancy.tree.children(node) if c in shortlists]
    entries = [shortlists[c] for c in kids]
    if not kids or any(e is None for e in entries):
        return False
    if sum(e.live for e in entries if e is not None) > tenancy.limit:
        return False
    await _rewrite(tenancy, tenant, node, kids)
    tenancy.counters["shortlist_merges"] += 1
    return True


async def _rewrite(tenancy: Tenancy, tenant: int, node: int, sources: list[int]) -> None:
    """One new run at ``node`` from the live records of the shortlists at ``sources``; the
    map switches to it only once it is written (searches meanwhile read the old runs)."""
    shortlists = tenancy.shortlists.edit(tenant)
    old = [shortlists[s] for s in sources]
    batch = await tenancy.store.read(np.array([e.pid for e in old if e is not None]))
    records = live_records(tenancy, batch.records, tenant)
    entry = None
    if len(records):
        entry = Shortlist(tenancy.store.take_pid(), len(records))
        capacity = posting_capacity(len(records), tenancy.limit)
        await tenancy.store.write([PostingItem(entry.pid, *_fields(records), capacity=capacity)])
    for source, gone in zip(sources, old, strict=True):
        assert gone is not None
        tenancy.store.release(gone.pid)
        del shortlists[source]
    if entry is not None:
        shortlists[node] = entry
    else:
        _prune(tenancy, tenant, node if node not in sources else int(tenancy.tree.parent[node]))


def bulk_items(
    tenancy: Tenancy, tenant: int, rows: np.ndarray, leaves: np.ndarray
) -> list[tuple[int, np.ndarray]]:
    """(node, rows) of ``tenant``'s shortlists for all its rows at once (shortlist entries are
    made here; the caller writes the runs)."""
    shortlists = tenancy.shortlists.edit(tenant)
    placed = _distribute(tenancy, 0, leaves, rows)
    for node, part in placed:
        shortlists[node] = Shortlist(tenancy.store.take_pid(), len(part))
        mark_internal(shortlists, node, tenancy.tree.parent)
    return placed
