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

import numpy as np

__all__ = ["Shortlist", "TenantShortlists", "TenantTreeMap"]


class Shortlist:
    __slots__ = ("live", "pid")

    def __init__(self, pid: int, live: int) -> None:
        self.pid = pid
        self.live = live  # pairs it holds; its run may also hold stale records


TenantTreeMap = dict[int, Shortlist | None]


class TenantShortlists:
    def __init__(self) -> None:
        self.trees: dict[int, TenantTreeMap] = {}

    def locate(self, tenant: int, path: tuple[int, ...]) -> int | None:
        """The node on ``path`` holding ``tenant``'s shortlist, None if there is none."""
        tree = self.trees.get(tenant)
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
        return sum(1 for tree in self.trees.values() for e in tree.values() if e is not None)

    def snapshot(self) -> dict[str, np.ndarray]:
        rows = [
            (tenant, node, entry.pid, entry.live)
            for tenant, tree in self.trees.items()
            for node, entry in tree.items()
            if entry is not None
        ]
        table = np.array(rows, np.int64).reshape(-1, 4)
        return {"shortlists": table}

    def restore(self, table: np.ndarray, parent: np.ndarray) -> None:
        self.trees = {}
        for tenant, node, pid, live in table.tolist():
            tree = self.trees.setdefault(tenant, {})
            tree[node] = Shortlist(pid, live)
            up = int(parent[node])
            while up >= 0 and up not in tree:
                tree[up] = None
                up = int(parent[up])

    def resident_bytes(self) -> int:
        entries = sum(len(tree) for tree in self.trees.values())
        return 240 * len(self.trees) + 120 * entries
