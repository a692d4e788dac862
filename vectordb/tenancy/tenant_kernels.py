"""Compiled passes of a tenant search batch: the tree walk, the records' ids, the scoring.

A batch of small tenants' queries spent ~100 us a query in Python and small numpy calls (a
heap walk per query, a product, a concatenation and a top-k per query); these loops do the
same work for the whole batch in three numba calls, none holding the GIL.

* ``walk``: per query, Curator's best-first walk over its tenant's tree (``nodes`` sorted
  per tenant; ``pids`` -1 at an internal node): pop the nearest node (squared L2 to its
  centroid, ties to the lower node number, as a heap of (distance, node) pops), take a
  shortlist whole, push an internal node's children that the tenant has; stop once
  ``budget`` vectors are taken (0: all of them).
* ``gather``: the id and version of every record each query reads, in order (its parts in
  order, each part's records in order), for the access check.
* ``score``: per query, the ``k`` nearest distinct ids among the records the access check
  let through: float records (float32 or uint8 values) by the metric, compact twins by their
  codes (sq8: ``-(codes . scaled + bias)``). Ties keep the earlier record, and a repeated id
  counts once, at its nearest copy (a re-granted id may sit twice).

Records are read where they landed (posting_format: id at word 0, version in the low half of
word 1, the vector from byte 24): a part is (source, byte offset, records), sources 0 (runs),
1 (twins) and 2 (pending grants' home copies); ``values`` of a source is its buffer seen as
its element type (float16 widened to float32 keeps the element positions: ``elem_bytes`` is the
stored element's size), ``words`` as uint64.

Compiled on first use (cached by numba beside this module). Thread-safety: pure; callers own
their outputs (two threads may score two ranges of queries).
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["gather", "score", "walk"]

_VECTOR_BYTES_AT = 24  # posting_format: the vector follows the 24-byte header


@njit(nogil=True, cache=True)
def walk(  # type: ignore[no-untyped-def,unused-ignore]
    query_tenant, t_ptr, nodes, pids, lives, first_child, n_children,
    node_row, centres, norms, queries, budget, out_ptr, out_pids,
):  # fmt: skip
    """``out_pids[out_ptr[q]:...]`` the pids query ``q`` reads, nearest first; returns the
    count of each query (the rest of its slot is unused)."""
    n_queries = len(query_tenant)
    taken = np.zeros(n_queries, np.int64)
    width = 1
    for t in range(len(t_ptr) - 1):
        width = max(width, t_ptr[t + 1] - t_ptr[t])
    front_d = np.empty(width, np.float32)
    front_at = np.empty(width, np.int64)
    for q in range(n_queries):
        t = query_tenant[q]
        if t < 0:
            continue
        lo, hi = t_ptr[t], t_ptr[t + 1]
        if hi == lo or nodes[lo] != 0:
            continue
        n_front = 1
        front_d[0], front_at[0] = 0.0, lo
        held = 0
        out = out_ptr[q]
        while n_front > 0 and (budget == 0 or held < budget):
            best = 0
            for f in range(1, n_front):
                if front_d[f] < front_d[best] or (
                    front_d[f] == front_d[best] and nodes[front_at[f]] < nodes[front_at[best]]
                ):
                    best = f
            at = front_at[best]
            n_front -= 1
            front_d[best], front_at[best] = front_d[n_front], front_at[n_front]
            if pids[at] >= 0:
                out_pids[out + taken[q]] = pids[at]
                taken[q] += 1
                held += lives[at]
                continue
            first = first_child[nodes[at]]
            stop = first + n_children[nodes[at]]
            j = lo + np.searchsorted(nodes[lo:hi], first)
            while j < hi and nodes[j] < stop:
                row = node_row[nodes[j]]
                dot = _dot(centres[row], queries[q])
                front_d[n_front] = norms[row] - np.float32(2.0) * dot
                front_at[n_front] = j
                n_front += 1
                j += 1
    return taken


@njit(nogil=True, cache=True)
def gather(  # type: ignore[no-untyped-def,unused-ignore]
    parts, part_of, part_query, u_src, u_off, u_cnt, words0, words1, words2, rec_bytes,
    tenants, ids, versions, owners,
):  # fmt: skip
    """Fill ``ids``, ``versions`` and ``owners`` (the part's query's tenant) with every
    record of ``parts``, in order; returns how many."""
    j = 0
    for p in parts:
        u = part_of[p]
        src = u_src[u]
        words = words0 if src == 0 else (words1 if src == 1 else words2)
        size = rec_bytes[src]
        w = u_off[u] // 8
        step = size // 8
        tenant = tenants[part_query[p]]
        for _ in range(u_cnt[u]):
            ids[j] = np.int64(words[w])
            versions[j] = np.uint32(words[w + 1] & np.uint64(0xFFFFFFFF))
            owners[j] = tenant
            j += 1
            w += step
    return j


# no nnan / ninf: the top lists are padded with inf
@njit(nogil=True, fastmath={"reassoc", "contract", "arcp", "nsz"}, cache=True)
def score(  # type: ignore[no-untyped-def,unused-ignore]
    parts, part_of, part_query, u_src, u_off, u_cnt, readable, ids, values0, values2,
    elem_bytes, codes, rec_bytes, queries, scaled, bias, l2, out_ids, out_dist, filled,
):  # fmt: skip
    """Offer every readable record of ``parts`` (``readable`` and ``ids`` in gather's
    order) to its query's row of ``out_ids`` / ``out_dist`` (k columns, pre-filled with -1 /
    inf; ``filled[q]`` entries held)."""
    k = out_ids.shape[1]
    dim = queries.shape[1]
    j = 0
    for p in parts:
        q = part_query[p]
        top_id = out_ids[q]
        top_d = out_dist[q]
        query = queries[q]
        n = filled[q]
        u = part_of[p]
        src = u_src[u]
        size = rec_bytes[src]
        at = u_off[u] + _VECTOR_BYTES_AT
        for _ in range(u_cnt[u]):
            if not readable[j]:
                j += 1
                at += size
                continue
            vid = ids[j]
            j += 1
            # slices, not ``values[at + d]``: a slice's loop is vectorised (~10x here)
            if src == 1:
                dist = -(_dot(codes[at : at + dim], scaled[q]) + bias[q])
            else:
                values = values0 if src == 0 else values2
                first = at // elem_bytes
                vector = values[first : first + dim]
                dist = _l2(vector, query) if l2 else -_dot(vector, query)
            at += size
            n = _offer(top_id, top_d, n, k, vid, dist)
        filled[q] = n


@njit(nogil=True, fastmath={"reassoc", "contract", "arcp", "nsz"}, cache=True)
def _dot(vector, query):  # type: ignore[no-untyped-def,unused-ignore]
    acc = np.float32(0.0)
    for d in range(len(query)):
        acc += np.float32(vector[d]) * query[d]
    return acc


@njit(nogil=True, fastmath={"reassoc", "contract", "arcp", "nsz"}, cache=True)
def _l2(vector, query):  # type: ignore[no-untyped-def,unused-ignore]
    acc = np.float32(0.0)
    for d in range(len(query)):
        diff = np.float32(vector[d]) - query[d]
        acc += diff * diff
    return acc


@njit(nogil=True, cache=True)
def _offer(top_id, top_d, n, k, vid, dist):  # type: ignore[no-untyped-def,unused-ignore]
    """Insert (vid, dist) into the sorted top list of ``n`` entries; returns the new n."""
    if n == k and not dist < top_d[n - 1]:
        return n
    for i in range(n):
        if top_id[i] == vid:
            if not dist < top_d[i]:
                return n
            for m in range(i, n - 1):  # the id's farther copy leaves
                top_id[m], top_d[m] = top_id[m + 1], top_d[m + 1]
            n -= 1
            top_id[n], top_d[n] = -1, np.inf
            break
    at = n
    while at > 0 and dist < top_d[at - 1]:
        at -= 1
    last = n if n < k else k - 1
    for m in range(last, at, -1):
        top_id[m], top_d[m] = top_id[m - 1], top_d[m - 1]
    top_id[at], top_d[at] = vid, dist
    return n + 1 if n < k else n
