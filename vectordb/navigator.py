"""Navigator: the in-memory head vectors and the index that finds a query's nearest heads.

An exact scan while there are few heads (flat_scan.py), or, for larger head sets on CPUs with native
bfloat16 products, a bfloat16 product that bounds the distances plus exact distances for the few
heads the bounds leave in doubt (head_scan.py: the same answer, 4-10x less CPU); faiss HNSW
(M=32) above ``HNSW_ABOVE`` heads -- over SQ8 codes with an exact re-rank on float16 heads when
the heads are held in float16 (a tight budget: compact_hnsw.py). Heads are added when a posting
list splits and removed when one splits or merges away; the flat scan fills the hole with its
last head; HNSW cannot drop entries cheaply, so there a removed head is only marked dead
(searches ask for a few more results and skip it) and the graph is rebuilt once a tenth of it
is dead.

Distances are the index's internal ones (metric.py): smaller is nearer.
Concurrency: ``search`` may run on the loop and scoring threads at once (search.py); heads
change only while no search runs. faiss calls release the GIL and use its own OpenMP threads.
"""

from __future__ import annotations

from collections.abc import Iterator

import faiss
import numpy as np

from vectordb import flat_scan, head_scan
from vectordb.compact_hnsw import CompactHnsw
from vectordb.metric import Metric

__all__ = ["BFLOAT16_FROM_CELLS", "HNSW_ABOVE", "Navigator"]

HNSW_ABOVE = 20_000
# heads x dim from which the flat scan goes through head_scan (below, float32 BLAS is cheap
# and the bfloat16 copy not worth its memory)
BFLOAT16_FROM_CELLS = 1 << 20
# below this many queries the scan is a matrix-vector product, bound by memory traffic, where
# torch's bfloat16 kernel gains nothing and its setup and the exact second pass cost: measured
# on debian-minilm's 5,051 heads, one query: 562 us bfloat16 against ~290 us float32 BLAS
BFLOAT16_FROM_QUERIES = 8
_HNSW_M = 32


class Navigator:
    def __init__(self, dim: int, metric: Metric, kind: str = "auto") -> None:
        self.dim = dim
        self.metric = metric
        self.kind = kind
        self._half = False  # heads held in float16 (a tight budget: load_checkpoint's take)
        self._index: faiss.Index | CompactHnsw | None = self._new_index(0)
        self._flat = np.zeros((0, dim), np.float32)  # flat mode: head vectors by position
        self._flat_norms = np.zeros(0, np.float32)
        self._n_flat = 0
        self._pos_pid = np.zeros(0, np.int64)  # faiss position -> pid, -1 once removed
        self._pid_pos = np.zeros(0, np.int64)  # pid -> position, -1 when not a head
        self._n_heads = 0
        self._dead = 0
        # made on first use (centred on the heads then), kept in step with _flat after that
        self._bfloat: head_scan.BfloatHeads | None = None
        # False: never make the bfloat16 copy (a tight memory budget: memory_budget.py)
        self.allow_bfloat16 = True
        # queries scanned at once ([queries, heads] distances and their sort): a budget bounds it
        self.scan_queries: int | None = None
        # float16 heads widened at a time: each scanning thread keeps that much scratch (widen)
        self.widen_heads = flat_scan.WIDEN_HEADS

    @property
    def n_heads(self) -> int:
        return self._n_heads

    def _new_index(self, expected: int) -> faiss.Index | CompactHnsw | None:
        """An HNSW index (compact over float16 heads), or None for the numpy flat scan."""
        hnsw = self.kind == "hnsw" or (self.kind == "auto" and expected > HNSW_ABOVE)
        if not hnsw:
            return None
        if self._half:
            return CompactHnsw(self.dim, self.metric)
        index = faiss.IndexHNSWFlat(self.dim, _HNSW_M, self.metric.faiss_metric)
        index.hnsw.efConstruction = 64
        return index

    @property
    def _ntotal(self) -> int:
        return self._n_flat if self._index is None else self._index.ntotal

    def _add_flat(self, vectors: np.ndarray) -> None:
        n = len(vectors)
        if self._n_flat + n > len(self._flat):
            rows = max(len(self._flat) + len(self._flat) // 16, self._n_flat + n, 64)
            grown = np.zeros((rows, self.dim), self._flat.dtype)  # slow growth: memory is budget
            grown[: self._n_flat] = self._flat[: self._n_flat]
            norms = np.zeros(len(grown), np.float32)
            norms[: self._n_flat] = self._flat_norms[: self._n_flat]
            self._flat, self._flat_norms = grown, norms
        block = self._flat[self._n_flat : self._n_flat + n]
        block[:] = vectors
        self._flat_norms[self._n_flat : self._n_flat + n] = flat_scan.squared_norms(block)
        if self._bfloat is not None:  # kept in step, not remade: heads come a few at a time
            self._bfloat.put(self._n_flat, block)
        self._n_flat += n

    def _uses_bfloat16(self, want: int = 1) -> bool:
        return (
            self.allow_bfloat16
            and not self.compact  # its exact second pass reads float32 heads
            and self._n_flat * self.dim >= BFLOAT16_FROM_CELLS
            and 8 * want <= self._n_flat
            and head_scan.bfloat16_is_native()
        )

    def _search_flat_pieces(self, queries: np.ndarray, want: int) -> tuple[np.ndarray, np.ndarray]:
        step = self.scan_queries
        if step is None or len(queries) <= step:
            return self._search_flat(queries, want)
        parts = [
            self._search_flat(queries[i : i + step], want) for i in range(0, len(queries), step)
        ]
        return np.concatenate([d for d, _ in parts]), np.concatenate([p for _, p in parts])

    def _search_flat(self, queries: np.ndarray, want: int) -> tuple[np.ndarray, np.ndarray]:
        heads = self._flat[: self._n_flat]
        if len(queries) >= BFLOAT16_FROM_QUERIES and self._uses_bfloat16(want):
            rounded = self._bfloat
            if rounded is None:  # two threads may both make it: same result, either is kept
                l2 = self.metric is Metric.L2
                rounded = head_scan.BfloatHeads(heads, l2, capacity=len(self._flat))
                self._bfloat = rounded
            return head_scan.nearest(rounded, queries, heads, want)
        norms = self._flat_norms[: self._n_flat]
        return flat_scan.nearest(queries, heads, norms, self.metric, want, self.widen_heads)

    def add(self, vectors: np.ndarray, pids: np.ndarray, take: bool = False) -> None:
        """Add heads (prepared float32 vectors) under posting ids ``pids``. ``take``: the
        navigator may keep ``vectors`` itself rather than a copy (the caller lets it go: a
        checkpoint being loaded), when it has no heads yet."""
        if len(pids) == 0:
            return
        if take and vectors.dtype == np.float16 and self._n_heads == 0 and not self._half:
            self._half = True  # from now on every head is held in float16
            self._flat = np.zeros((0, self.dim), np.float16)
            if self._index is not None:
                self._index = self._new_index(len(pids))
        if self._index is None and self.kind == "auto" and self._ntotal + len(pids) > HNSW_ABOVE:
            self._rebuild(extra=(vectors, np.asarray(pids, np.int64)), take=take)
            return
        start = self._ntotal
        if isinstance(self._index, CompactHnsw):
            self._index.add(vectors, take=take)  # float16 kept, fed to faiss piece by piece
        elif self._index is not None:
            self._index.add(np.ascontiguousarray(vectors, np.float32))
        elif take and self._n_flat == 0 and vectors.flags.writeable and self._takes(vectors):
            self._flat, self._n_flat = vectors, len(vectors)  # no second copy of every head
            self._flat_norms = flat_scan.squared_norms(vectors)
            self._bfloat = None
        else:
            self._add_flat(np.asarray(vectors, self._flat.dtype))
        self._pos_pid = np.concatenate([self._pos_pid, np.asarray(pids, np.int64)])
        pids = np.asarray(pids, np.int64)
        if pids.max() >= len(self._pid_pos):
            grown = np.full(max(int(pids.max()) + 1, len(self._pid_pos) * 9 // 8), -1, np.int64)
            grown[: len(self._pid_pos)] = self._pid_pos
            self._pid_pos = grown
        self._pid_pos[pids] = start + np.arange(len(pids))
        self._n_heads += len(pids)

    def _takes(self, vectors: np.ndarray) -> bool:
        wanted = np.float16 if self._half else np.float32
        return vectors.dtype == wanted and vectors.flags.c_contiguous

    def remove(self, pids: list[int]) -> None:
        """Drop heads. Raises KeyError (changing nothing) for a pid that is not a head."""
        self._positions(pids)  # every pid a head: a stale -1 would drop another head silently
        if len(set(pids)) != len(pids):
            raise KeyError(f"a posting id is removed twice in one call: {pids}")
        for pid in pids:
            pos = int(self._pid_pos[pid])
            self._pid_pos[pid] = -1
            self._n_heads -= 1
            if self._index is None:
                self._swap_out(pos)
                continue
            self._pos_pid[pos] = -1
            self._dead += 1
        if self._dead > max(64, self._ntotal // 10):
            self._rebuild()

    def _swap_out(self, pos: int) -> None:
        """Flat mode: move the last head into ``pos``, so the scan never sees a dead one."""
        last = self._n_flat - 1
        if self._bfloat is not None:
            self._bfloat.move(last, pos)
            self._bfloat.count = last
        if pos != last:
            self._flat[pos] = self._flat[last]
            self._flat_norms[pos] = self._flat_norms[last]
            moved = int(self._pos_pid[last])
            self._pos_pid[pos] = moved
            self._pid_pos[moved] = pos
        self._pos_pid = self._pos_pid[:last]
        self._n_flat = last

    def _positions(self, pids: np.ndarray | list[int]) -> np.ndarray:
        """Positions of heads ``pids``; KeyError for one that is not a head."""
        pids = np.asarray(pids, np.int64)
        known = (pids >= 0) & (pids < len(self._pid_pos))
        positions = np.full(pids.shape, -1, np.int64)
        positions[known] = self._pid_pos[pids[known]]
        if (positions < 0).any():
            raise KeyError(f"not heads: {pids[positions < 0][:10].tolist()}")
        return positions

    def vectors_of(self, pids: np.ndarray) -> np.ndarray:
        positions = self._positions(pids)
        if len(positions) == 0:
            return np.zeros((0, self.dim), np.float32)
        if self._index is None:
            return self._flat[positions].astype(np.float32, copy=False)
        return self._index.reconstruct_batch(positions)

    def pieces(self, rows: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(pids, float32 vectors) of the live heads, ``rows`` at a time: never all widened."""
        pids = np.flatnonzero(self._pid_pos >= 0)
        for first in range(0, len(pids), max(1, rows)):
            part = pids[first : first + rows]
            yield part, self.vectors_of(part)

    def _live(self) -> tuple[np.ndarray, np.ndarray]:
        """(pids, vectors) of every live head, float16 when the heads are held so."""
        pids = np.flatnonzero(self._pid_pos >= 0)
        positions = self._positions(pids)
        if self._index is None:
            return pids, self._flat[positions]
        if isinstance(self._index, CompactHnsw):
            return pids, self._index.rows(positions)
        return pids, self._index.reconstruct_batch(positions)

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(pids int64 [Q, k'] padded with -1, internal distances float32 [Q, k']), nearest
        first; k' = min(k, heads)."""
        n_queries = len(queries)
        k = max(1, min(k, self._n_heads))  # "read every list" must not allocate [Q, 10**6]
        out_pids = np.full((n_queries, k), -1, np.int64)
        out_dist = np.full((n_queries, k), np.inf, np.float32)
        if not self._n_heads or n_queries == 0:
            return out_pids, out_dist
        queries = np.ascontiguousarray(queries, np.float32)
        if self._index is None:
            want = min(self._ntotal, k)
            dist, pos = self._search_flat_pieces(queries, want)
        elif isinstance(self._index, CompactHnsw):
            want = min(self._ntotal, k + self._dead)
            self._index.widen_rows = self.widen_heads  # the budget's bound on widened heads
            dist, pos = self._index.search(queries, want)
        else:
            want = min(self._ntotal, k + self._dead)
            self._index.hnsw.efSearch = max(2 * want, 64)  # type: ignore[attr-defined]
            dist, pos = self._index.search(queries, want)
            if self.metric is not Metric.L2:
                dist = -dist
        pids = np.where(pos >= 0, self._pos_pid[np.maximum(pos, 0)], -1)
        if self._dead:
            order = np.argsort(pids < 0, axis=1, kind="stable")  # live ones first, still sorted
            pids = np.take_along_axis(pids, order, axis=1)
            dist = np.take_along_axis(dist, order, axis=1)
        take = min(k, want)
        out_pids[:, :take] = pids[:, :take]
        out_dist[:, :take] = np.where(pids[:, :take] >= 0, dist[:, :take], np.inf)
        return out_pids, out_dist

    def snapshot(self) -> tuple[np.ndarray, np.ndarray]:
        """(pids, vectors) of every live head."""
        pids = np.flatnonzero(self._pid_pos >= 0)
        return pids, self.vectors_of(pids)

    def _rebuild(
        self, extra: tuple[np.ndarray, np.ndarray] | None = None, take: bool = False
    ) -> None:
        """Rebuild from the live heads (plus ``extra`` (vectors, pids); ``take``: as add's,
        for ``extra`` when there are no live heads); picks flat or HNSW for the new size.
        Heads held in float16 stay so: never a float32 copy of them all."""
        pids, vectors = self._live()
        if extra is not None and len(pids):
            vectors = np.concatenate([vectors, extra[0].astype(vectors.dtype, copy=False)])
            pids = np.concatenate([pids, extra[1]])
        elif extra is not None:  # nothing held yet: no copy of what is added
            vectors, pids = extra
        else:
            take = False
        self._index = self._new_index(len(pids))
        self._bfloat = None
        if self._index is not None or self._n_heads == 0:  # now HNSW: the flat copy goes
            self._flat = np.zeros((0, self.dim), np.float16 if self._half else np.float32)
            self._flat_norms = np.zeros(0, np.float32)
        self._n_flat = 0
        self._pos_pid = np.zeros(0, np.int64)
        self._pid_pos = np.zeros(0, np.int64)
        self._n_heads = 0
        self._dead = 0
        self.add(vectors, pids, take=take)

    def bfloat16_bytes(self) -> int:
        """What the bfloat16 copy of the heads takes (or would take, once made)."""
        if self._bfloat is not None:
            return self._bfloat.nbytes
        return len(self._flat) * (2 * self.dim + 12) if self._index is None else 0

    @property
    def layout(self) -> str:
        """How the heads are held: "flat" / "hnsw" (float32), "flat-float16", "hnsw-sq8"."""
        kind = "flat" if self._index is None else "hnsw"
        if self._half:
            return "hnsw-sq8" if kind == "hnsw" else "flat-float16"
        return kind

    @property
    def compact(self) -> bool:
        """Whether the heads are held in float16 (a tight memory budget: load_checkpoint)."""
        return self._half

    def drop_bfloat16(self) -> None:
        """Scan in float32 from now on and free the bfloat16 copy (a tight budget)."""
        self.allow_bfloat16 = False
        self._bfloat = None

    def resident_bytes(self) -> int:
        bookkeeping = self._pos_pid.nbytes + self._pid_pos.nbytes
        if self._index is None:
            # the bfloat16 copy counts whenever the scan uses it, made yet or not
            rounded = self.bfloat16_bytes() if self._uses_bfloat16() else 0
            return self._flat.nbytes + self._flat_norms.nbytes + rounded + bookkeeping
        if isinstance(self._index, CompactHnsw):
            return self._index.nbytes + bookkeeping
        links = self._index.ntotal * _HNSW_M * 2 * 4
        return self._index.ntotal * self.dim * 4 + links + bookkeeping
