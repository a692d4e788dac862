"""The exact flat head scan, fast: a bfloat16 matrix product bounds every query-head distance;
exact distances are taken only for the heads the bounds cannot rule out.

Why: the head scan is a search's largest CPU cost on small and mid-sized indexes (1,000 784-d
queries against 4,976 heads: 3.9 GFLOP, ~70 ms of one core in float32 BLAS here). CPUs with
native bfloat16 dot products (x86 AVX512_BF16 / AMX, Arm BF16) run the same product ~7x
faster through torch; the result is rounded, so it only bounds the distances, and a second pass
makes the answer exact.

The bound. Heads are centred on their mean ``m`` (the order of distances is unchanged, and the
error below is proportional to the vectors' lengths, which centring shrinks). With the query
operand ``x`` (``q - m`` for l2; ``q`` for inner product) and ``y = h - m``, a head's key is
``a(h) - s * x.y`` (l2: ``a = |y|^2``, ``s = 2``; inner product: ``a = 0``, ``s = 1``), which
orders heads as their distances do. Rounding ``x`` and ``y`` to bfloat16 (unit roundoff
``u = 2^-8``) errs each product by at most ``(2u + u^2)|x_i y_i|``; summing in float32 adds at
most ``(dim + 2) 2^-24`` of the sum of ``|x_i y_i|``; rounding the result to bfloat16 adds
``u |x.y|``; and the sum of ``|x_i y_i|`` is at most ``|x| |y|``. So the approximate key is
within ``s c |x| |y| + e(h)`` of the exact one, with ``c = 4u + (dim + 8) 2^-24`` (rounded up;
``e(h) = 2^-20 a(h) + dim 2^-125`` absorbs the float32 rounding of the key itself and
products flushed to zero below float32's normal range).

Per query: ``t`` = the ``want``-th smallest upper bound. At least ``want`` heads have exact keys
at most ``t``, so a head whose lower bound is above ``t`` is not among the ``want`` nearest.
The others (measured: about 13 of 4,976 heads when 8 are wanted, on fashion-mnist and
debian-minilm) get exact distances, summed in float64 from the float32 vectors, and the
``want`` nearest of them are the answer: the heads the float32 scan finds (up to ties, and
where that scan's float32 cancellation does not swap them).

Used where torch is installed and the CPU has native bfloat16 dot products (``/proc/cpuinfo``);
elsewhere the navigator keeps its float32 product. The product runs on the calling thread
alone: a search scans heads on two threads of its own (search.py), and torch's OpenMP team,
given a second thread, waits for a core the other search thread holds (measured: 22 ms
instead of ~7 ms per 500 queries in 32-query pieces). Only the calling thread's OpenMP
setting is changed, for the call (``tiers.io.cpu_threads.this_thread_openmp_alone``), never torch's
process-wide one.
Shapes. torch keeps compiled code for every shape its bfloat16 product has seen, for the life
of the process (measured: 6,000 shapes, +950 MiB; ~650 KiB a shape at 384-d). A live index
changes its head count with every split and its batch size with every gather, so the product
is taken in a fixed set of shapes only: ``HEAD_CHUNK`` heads at a time (the last piece ends at
the last head and overlaps the one before: recomputed, never padded) times a query piece of a
power of two up to ``QUERY_PIECE`` rows: at most 7 shapes per dimension, whatever the index
does. (Rounding the head count up by a sixteenth instead still made 16 new head counts per
doubling, times 7 batch sizes: in the REST soak, +31 MiB within a minute once the heads
passed navigator.BFLOAT16_FROM_CELLS, 2,731 at 384-d, and +4.5 MiB per 128 heads after.)
``warm_up(dim)`` runs each shape once, so an index that will scan heads this way pays the
kernels' one-time code when it opens, not in the middle of serving.
Thread-safety: ``nearest`` may run on several threads at once; ``BfloatHeads.put``/``move``
only while no search runs (the navigator's heads change under the same rule).
"""

from __future__ import annotations

import functools
import importlib.util
import platform
from typing import Any

import numpy as np
from numba import njit

from tiers.io import this_thread_openmp_alone

__all__ = ["BfloatHeads", "bfloat16_is_native", "nearest", "warm_up"]

_U = 2.0**-8  # bfloat16 unit roundoff (8 significant bits)
HEAD_CHUNK = 1024  # heads per product; ~15% slower than one product, measured
QUERY_PIECE = 64  # queries per product; fewer: rounded up to a power of two


@functools.cache
def bfloat16_is_native() -> bool:
    """torch is installed and this CPU computes bfloat16 dot products in hardware."""
    if importlib.util.find_spec("torch") is None:
        return False
    try:
        with open("/proc/cpuinfo") as info:
            text = info.read()
    except OSError:
        return False
    words = set(text.split())
    if platform.machine() in ("aarch64", "arm64"):
        return "bf16" in words
    return bool(words & {"avx512_bf16", "amx_bf16"})


class BfloatHeads:
    """The heads, centred and rounded to bfloat16, with what the bound needs, by position
    (the navigator's flat positions: kept in step by ``put`` and ``move``). The centre is
    fixed when made: any centre keeps the bound valid; the mean keeps it tight. Rows are
    stored with the navigator's capacity, so adding heads does not remake the copy."""

    def __init__(self, heads: np.ndarray, metric_is_l2: bool, capacity: int = 0) -> None:
        self.l2 = metric_is_l2
        self.dim = heads.shape[1]
        self.centre = heads.mean(axis=0, dtype=np.float64).astype(np.float32)
        self.scale = 2.0 if metric_is_l2 else 1.0
        self.c = 4 * _U + (self.dim + 8) * 2.0**-24
        self.count = 0
        self.bits = np.zeros((0, self.dim), np.uint16)
        self.norms = self.upper_base = self.lower_base = np.zeros(0, np.float32)
        self._grow(max(capacity, len(heads), HEAD_CHUNK))  # a whole chunk is always there
        self.put(0, heads)

    def _grow(self, capacity: int) -> None:
        old = self.count
        bits = np.zeros((capacity, self.dim), np.uint16)
        columns = [np.zeros(capacity, np.float32) for _ in range(3)]
        if old:
            bits[:old] = self.bits[:old]
            held = [self.norms, self.upper_base, self.lower_base]
            for column, kept in zip(columns, held, strict=True):
                column[:old] = kept[:old]
        self.bits = bits
        self.norms, self.upper_base, self.lower_base = columns

    @property
    def nbytes(self) -> int:
        return self.bits.nbytes + 3 * self.norms.nbytes

    def put(self, start: int, heads: np.ndarray) -> None:
        """Rows ``start...`` hold ``heads`` (float32 [n, dim]); the count grows to cover them."""
        import torch

        stop = start + len(heads)
        if stop > len(self.bits):
            self._grow(max(stop, len(self.bits) + len(self.bits) // 16))
        centred = np.ascontiguousarray(heads - self.centre, np.float32)
        rounded = torch.from_numpy(centred).to(torch.bfloat16).view(torch.int16)
        self.bits[start:stop] = rounded.numpy().view(np.uint16)
        norms = np.sqrt(np.einsum("ij,ij->i", centred, centred, dtype=np.float64))
        base = norms**2 if self.l2 else np.zeros(len(heads))
        # float32 rounding of the key; products below 2^-126 flushed to zero by bfloat16 units
        slack_add = 2.0**-20 * base + self.dim * 2.0**-125
        self.norms[start:stop] = norms
        self.upper_base[start:stop] = base + slack_add  # a(h) + e(h)
        self.lower_base[start:stop] = base - slack_add
        self.count = max(self.count, stop)

    def move(self, source: int, target: int) -> None:
        """Row ``target`` takes row ``source``'s head (the navigator's swap-out)."""
        for column in (self.bits, self.norms, self.upper_base, self.lower_base):
            column[target] = column[source]

    def approximate_dots(self, queries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(the products x.y from bfloat16, float32 [>= Q, >= count]: row q, column h is query
        q's product with head h, the rest is padding; |x| [Q] in float64)."""
        import torch

        x = queries - self.centre if self.l2 else queries
        x_norms = np.sqrt(np.einsum("ij,ij->i", x, x, dtype=np.float64))
        # fixed shapes only: torch keeps code per shape for good (the module's docstring)
        piece = _padded_queries(len(x))
        pieces = -(-len(x) // piece)
        rows = np.zeros((pieces * piece, self.dim), np.float32)
        rows[: len(x)] = x
        rounded_x = torch.from_numpy(rows).to(torch.bfloat16).view(pieces, piece, self.dim)
        n_heads = max(self.count, HEAD_CHUNK)  # the rows past count are held (zero or stale)
        heads = torch.from_numpy(self.bits[:n_heads].view(np.int16)).view(torch.bfloat16)
        out = torch.empty((pieces, n_heads, piece), dtype=torch.bfloat16)
        with this_thread_openmp_alone():
            for p in range(pieces):
                x_t = rounded_x[p].T
                for first in range(0, n_heads, HEAD_CHUNK):
                    first = min(first, n_heads - HEAD_CHUNK)  # the last chunk overlaps
                    chunk = slice(first, first + HEAD_CHUNK)
                    torch.matmul(heads[chunk], x_t, out=out[p, chunk])
            # to rows of queries in the same pass that widens: the selection reads by rows
            wide = out.transpose(1, 2).float().contiguous().view(pieces * piece, n_heads)
            return wide.numpy(), x_norms


def _padded_queries(n: int) -> int:
    """The query piece for ``n`` queries: a power of two, at most QUERY_PIECE."""
    return min(QUERY_PIECE, 1 << max(n - 1, 0).bit_length())


def nearest(
    bf: BfloatHeads, queries: np.ndarray, heads: np.ndarray, want: int
) -> tuple[np.ndarray, np.ndarray]:
    """(distances float32 [Q, want], positions int64 [Q, want]) of each query's ``want``
    nearest heads, nearest first: l2 ``|q - h|^2``, else ``-q.h``, summed in float64 (more
    exact than the float32 scan's ``|q|^2 + |h|^2 - 2 q.h``).
    Preconditions: ``1 <= want <= len(heads)``; ``heads`` are the heads of ``bf``'s first ``count``
    rows; ``queries`` float32 [Q, dim] prepared."""
    queries = np.ascontiguousarray(queries, np.float32)
    dots, x_norms = bf.approximate_dots(queries)
    out_pos = np.empty((len(queries), want), np.int64)
    out_dist = np.empty((len(queries), want), np.float32)
    x_slack = (bf.scale * bf.c * x_norms).astype(np.float32)
    _select(dots, np.float32(bf.scale), bf.upper_base, bf.lower_base, x_slack, bf.norms,
            queries, heads, bf.l2, out_pos, out_dist)  # fmt: skip
    return out_dist, out_pos


@njit(nogil=True, cache=True)
def _sift_down(heap: np.ndarray, size: int) -> None:
    """Restore the max-heap property from the root."""
    i = 0
    while True:
        child = 2 * i + 1
        if child >= size:
            return
        if child + 1 < size and heap[child + 1] > heap[child]:
            child += 1
        if heap[child] <= heap[i]:
            return
        heap[i], heap[child] = heap[child], heap[i]
        i = child


@njit(nogil=True, cache=True, fastmath=True)
def _dot(a: Any, b: Any) -> float:
    """float64 sum of float32 products (any order: it is exact to ~1e-16 relative)."""
    total = 0.0
    for j in range(len(a)):
        total += np.float64(a[j]) * np.float64(b[j])
    return total


@njit(nogil=True, cache=True, fastmath=True)
def _squared_distance(a: Any, b: Any) -> float:
    """float64 sum of squared differences (no |a|^2 + |b|^2 - 2 a.b cancellation)."""
    total = 0.0
    for j in range(len(a)):
        gap = np.float64(a[j]) - np.float64(b[j])
        total += gap * gap
    return total


@njit(nogil=True, cache=True)
def _select(
    dots: Any, scale: Any, upper_base: Any, lower_base: Any, x_slack: Any, y_norms: Any,
    queries: Any, heads: Any, l2: bool, out_pos: Any, out_dist: Any,
) -> None:  # fmt: skip
    n_queries, n_heads = queries.shape[0], heads.shape[0]  # dots may be padded beyond both
    want = out_pos.shape[1]
    upper = np.empty(want, np.float32)  # max-heap of the want smallest upper bounds
    candidates = np.empty(n_heads, np.int64)
    exact = np.empty(n_heads, np.float64)
    for qi in range(n_queries):
        row = dots[qi]
        slack = x_slack[qi]
        for h in range(want):
            upper[h] = np.inf
        for h in range(n_heads):
            bound = upper_base[h] + slack * y_norms[h] - scale * row[h]
            if bound < upper[0]:
                upper[0] = bound
                _sift_down(upper, want)
        limit = upper[0]
        query = queries[qi]
        n_candidates = 0
        for h in range(n_heads):
            if lower_base[h] - slack * y_norms[h] - scale * row[h] > limit:
                continue
            candidates[n_candidates] = h
            if l2:
                exact[n_candidates] = _squared_distance(query, heads[h])
            else:
                exact[n_candidates] = -_dot(query, heads[h])
            n_candidates += 1
        order = np.argsort(exact[:n_candidates], kind="mergesort")
        for r in range(want):
            out_pos[qi, r] = candidates[order[r]]
            out_dist[qi, r] = exact[order[r]]


def warm_up(dim: int | None = None) -> None:
    """Compile (or load from numba's cache) the selection pass; import torch; with ``dim``,
    run the bfloat16 product once in each of its shapes at that dimension (torch's one-time
    code for them: made now, not while serving)."""
    import torch  # noqa: F401  (seconds on a first import)

    one = np.zeros((1, 2), np.float32)
    two, scale = np.zeros(2, np.float32), np.float32(2.0)
    pos, dist = np.zeros((1, 1), np.int64), np.zeros((1, 1), np.float32)
    _select(np.zeros((1, 2), np.float32), scale, two, two, np.zeros(1, np.float32), two,
            one, one, True, pos, dist)  # fmt: skip
    if dim is not None:
        heads = BfloatHeads(np.zeros((1, dim), np.float32), True)
        n = QUERY_PIECE
        while n >= 1:
            heads.approximate_dots(np.zeros((n, dim), np.float32))
            n //= 2
