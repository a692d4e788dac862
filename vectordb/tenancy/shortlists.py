"""TenantShortlists: each tenant's tree of shortlists over the shared TenantTree (Curator's TCT).

For tenant t, ``trees[t]`` maps a tree node to a Shortlist (a run in tenant_store holding
copies of t's vectors under that node) or to None (an internal node of t's tree: t has vectors
below it, held by shortlists deeper down). Invariants, kept by tenant_updates:

- each (vector, tenant) pair is in exactly one shortlist: the first node on the vector's path
  from the root that holds a shortlist for its tenant;
- the ancestors of every shortlist node are internal nodes of that tenant, and an internal
  node has at least one child in the tenant's tree;
- a shortlist holds at most ``shortlist_limit`` live vectors unless its node is a leaf, and
  siblings whose live vectors together fit are merged into their parent.

Per-node Bloom filters (Curator) answer "has t anything below node n?" with false positives
and ~1.2 KB per node; the per-tenant map answers it exactly, in memory proportional to the
tenant's own tree, and a tenant that was deleted costs nothing.

Thread-safety: loop thread only.
"""

from __future__ import annotations

import sys

import numpy as np

__all__ = ["Shortlist", "TenantShortlists", "TenantTreeMap", "mark_internal"]


class Shortlist:
    __slots__ = ("live", "pid")

    def __init__(self, pid: int, live: int) -> None:
        self.pid = pid
        self.live = live  # pairs it holds; its run may also hold stale records


TenantTreeMap = dict[int, Shortlist | None]


def mark_internal(tree: TenantTreeMap, node: int, parent: np.ndarray, stop: int = -1) -> None:
    """Make the ancestors of ``node`` (below ``stop``) internal nodes of the tenant's tree."""
    up = int(parent[node])
    while up != stop and up >= 0 and up not in tree:
        tree[up] = None
        up = int(parent[up])


class TenantShortlists:
    """Tenant -> its map; a tenant whose whole tree is one root shortlist (most tenants of a
    real index: a handful of vectors each) is held as that bare Shortlist, not a dict."""

    def __init__(self) -> None:
        self._trees: dict[int, TenantTreeMap | Shortlist] = {}

    def __contains__(self, tenant: int) -> bool:
        return tenant in self._trees

    def view(self, tenant: int) -> TenantTreeMap | None:
        """The tenant's map to read (None: the tenant has nothing)."""
        tree = self._trees.get(tenant)
        return {0: tree} if isinstance(tree, Shortlist) else tree

    def root(self, tenant: int) -> Shortlist | None:
        """The tenant's only shortlist when its tree is the root alone."""
        tree = self._trees.get(tenant)
        if isinstance(tree, Shortlist):
            return tree
        entry = tree.get(0) if tree is not None else None
        return entry if isinstance(entry, Shortlist) else None

    def edit(self, tenant: int) -> TenantTreeMap:
        """The tenant's map to change (made if missing); call ``compact`` when done."""
        tree = self._trees.get(tenant)
        if not isinstance(tree, dict):
            tree = self._trees[tenant] = {} if tree is None else {0: tree}
        return tree

    def compact(self, tenant: int) -> None:
        tree = self._trees.get(tenant)
        if isinstance(tree, dict):
            if not tree:
                del self._trees[tenant]
            elif len(tree) == 1 and isinstance(tree.get(0), Shortlist):
                self._trees[tenant] = tree[0]  # type: ignore[assignment]

    def compact_all(self) -> None:
        for tenant in list(self._trees):
            self.compact(tenant)

    def pop(self, tenant: int) -> list[Shortlist]:
        tree = self._trees.pop(tenant, None)
        if isinstance(tree, Shortlist):
            return [tree]
        return [e for e in (tree or {}).values() if e is not None]

    def entries(self) -> list[Shortlist]:
        out: list[Shortlist] = []
        for tree in self._trees.values():
            if isinstance(tree, Shortlist):
                out.append(tree)
            else:
                out += [e for e in tree.values() if e is not None]
        return out

    def locate(self, tenant: int, path: tuple[int, ...]) -> int | None:
        """The node on ``path`` holding ``tenant``'s shortlist, None if there is none."""
        tree = self.view(tenant)
        if tree is None:
            return None
        for node in path:
            entry = tree.get(node, False)
            if entry is False:
                return None
            if entry is not None:
                return node
        return None

    def count(self) -> int:
        return len(self.entries())

    def snapshot(self) -> dict[str, np.ndarray]:
        rows = []
        for tenant in self._trees:
            tree = self.view(tenant)
            assert tree is not None
            rows += [(tenant, node, e.pid, e.live) for node, e in tree.items() if e is not None]
        table = np.array(rows, np.int64).reshape(-1, 4)
        return {"shortlists": table}

    def restore(self, table: np.ndarray, parent: np.ndarray) -> None:
        self._trees = {}
        for tenant, node, pid, live in table.tolist():
            tree = self.edit(tenant)
            tree[node] = Shortlist(pid, live)
            mark_internal(tree, node, parent)
        self.compact_all()

    def resident_bytes(self) -> int:
        """The maps' and entries' own bytes (sys.getsizeof: dicts, Shortlists, their ints)."""
        entry_bytes = sys.getsizeof(Shortlist(1 << 20, 1 << 20)) + 2 * sys.getsizeof(1 << 20)
        total = sys.getsizeof(self._trees) + len(self._trees) * sys.getsizeof(1 << 20)
        for tree in self._trees.values():
            if isinstance(tree, Shortlist):
                total += entry_bytes
            else:
                shortlists = sum(1 for e in tree.values() if e is not None)
                total += sys.getsizeof(tree) + len(tree) * 28 + shortlists * entry_bytes
        return total
