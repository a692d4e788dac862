"""The shortlists each query of a tenant batch reads: Curator's best-first walk, batched.

Per query (one tenant each), best-first over the tenant's own tree: from the root, pop the
node nearest the query (squared L2 to its centroid, in the prepared space); a shortlist is
taken whole, an internal node's children that the tenant has are pushed; stop once the
shortlists taken hold ``budget`` vectors (0: take them all, an exact search). A tenant of at
most ``shortlist_limit`` vectors is one shortlist: one read.

Each tenant of the batch is laid out once (its tree's nodes, sorted, with their pids and live
counts); the centroids the walks may need are widened once; the walks of all queries then run
in one compiled call (tenant_kernels.walk). Shortlists whose first run is still being written
(a grant not yet acknowledged: its pairs are not visible yet) are dropped.

Thread-safety: loop thread (reads the live shortlist maps, with no await).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from vectordb.tenancy import tenant_kernels

if TYPE_CHECKING:
    from vectordb.tenancy.tenancy import Tenancy

__all__ = ["choose"]


def choose(
    tenancy: Tenancy, prepared: np.ndarray, tenants: np.ndarray, budget: int
) -> tuple[np.ndarray, np.ndarray]:
    """(ptr [Q + 1], pids): query ``q`` reads ``pids[ptr[q]:ptr[q + 1]]``, nearest first."""
    tenants = np.asarray(tenants, np.int64)
    distinct, which = np.unique(tenants, return_inverse=True)
    nodes, pids, lives, sizes = _layout(tenancy, distinct.tolist())
    t_ptr = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    tree = tenancy.tree
    inner = np.unique(nodes[nodes > 0])  # every node but the root may be pushed
    node_row = np.full(tree.n_nodes, -1, np.int64)
    node_row[inner] = np.arange(len(inner))
    centres = tree.centroids[inner].astype(np.float32)
    norms = np.einsum("ij,ij->i", centres, centres)
    slots = np.asarray(sizes, np.int64)[which]  # a query takes at most its tenant's entries
    out_ptr = np.concatenate([[0], np.cumsum(slots)]).astype(np.int64)
    out_pids = np.zeros(int(out_ptr[-1]), np.int64)
    query_tenant = np.where(tenants >= 0, which, -1).astype(np.int64)
    taken = tenant_kernels.walk(
        query_tenant, t_ptr, nodes, pids, lives,
        tree.first_child.astype(np.int64), tree.n_children.astype(np.int64),
        node_row, centres, norms, np.ascontiguousarray(prepared, np.float32),
        int(budget), out_ptr, out_pids,
    )  # fmt: skip
    used = np.arange(len(out_pids)) - np.repeat(out_ptr[:-1], slots) < np.repeat(taken, slots)
    capacity = tenancy.store.lists.capacity
    chosen = out_pids[used]
    inside = chosen < len(capacity)
    written = np.zeros(len(chosen), bool)
    written[inside] = capacity[chosen[inside]] > 0
    per_query = np.repeat(np.arange(len(tenants)), taken)
    ptr = np.concatenate([[0], np.cumsum(np.bincount(per_query[written], minlength=len(tenants)))])
    return ptr.astype(np.int64), chosen[written]


def _layout(
    tenancy: Tenancy, tenants: list[int]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[int]]:
    """Each tenant's tree as sorted nodes, their pids (-1: internal) and live counts, back to
    back; and each tenant's entry count (0: none, or tenant -1)."""
    nodes: list[int] = []
    pids: list[int] = []
    lives: list[int] = []
    sizes: list[int] = []
    shortlists = tenancy.shortlists
    for tenant in tenants:
        root = shortlists.root(tenant) if tenant >= 0 else None
        if root is not None:  # most tenants: one shortlist at the root
            nodes.append(0)
            pids.append(root.pid)
            lives.append(root.live)
            sizes.append(1)
            continue
        tree = shortlists.view(tenant) if tenant >= 0 else None
        if not tree:
            sizes.append(0)
            continue
        entries = sorted(tree.items())
        nodes += [node for node, _ in entries]
        pids += [-1 if e is None else e.pid for _, e in entries]
        lives += [0 if e is None else e.live for _, e in entries]
        sizes.append(len(entries))
    as_array = np.asarray
    return as_array(nodes, np.int64), as_array(pids, np.int64), as_array(lives, np.int64), sizes
