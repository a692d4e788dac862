"""TenantBatch: the arrays a tenant search batch hands tenant_kernels, and its answer.

A batch's records are described, not copied: each query's *parts* (CSR ``part_ptr`` over
``part_of``) name entries of (source, byte offset, records) in the read buffers: source 0 the
shortlist runs, 1 their compact twins, 2 the home copies of pending grants. ``take(parts)``
gathers the ids of those parts' records, checks them against the access table in one pass and
offers the readable ones to their queries' top lists: all parts at once after every read
landed, or a read group's parts as that group lands (the check of a record always comes after
its read landed). Each query's row holds its ``k`` nearest distinct readable ids so far.

Thread-safety: one batch per search; ``take`` runs on the loop thread (the access table is the
loop's); ``score`` of two disjoint sets of queries' parts may run on two threads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from vectordb.metric import Metric
from vectordb.tenancy import tenant_kernels

if TYPE_CHECKING:
    from vectordb.posting_reads import PostingRead
    from vectordb.tenancy.tenancy import Tenancy

__all__ = ["PENDING", "RUNS", "TWINS", "TenantBatch"]

RUNS, TWINS, PENDING = 0, 1, 2  # where a part's records are (tenant_kernels' sources)
_NO_WORDS = np.zeros(1, np.uint64)


class TenantBatch:
    def __init__(self, tenancy: Tenancy, prepared: np.ndarray, tenants: np.ndarray, k: int):
        self.tenancy, self.tenants = tenancy, tenants
        self.queries = np.ascontiguousarray(prepared, np.float32)
        self.dtype = tenancy.store.lists.dtype
        self.ids = np.full((len(prepared), k), -1, np.int64)
        self.dist = np.full((len(prepared), k), np.inf, np.float32)  # padded as search pads
        self.filled = np.zeros(len(prepared), np.int64)
        element = self.dtype["vector"].base
        empty = np.zeros(0, np.float32 if element == np.float16 else element)
        self.words = [_NO_WORDS, _NO_WORDS, _NO_WORDS]
        self.values = [empty, np.zeros(0, np.uint8), empty]
        codes_bytes = tenancy.store.codes.rec_bytes
        self.rec_bytes = np.array([self.dtype.itemsize, codes_bytes, self.dtype.itemsize])
        self.scaled, self.bias = self.queries[:0], np.zeros(0, np.float32)

    def lay_out(
        self, compact: np.ndarray, runs: PostingRead | None, twins: PostingRead | None,
        ptr: np.ndarray, part_of: np.ndarray,
    ) -> None:  # fmt: skip
        """Entries of the lists read (``compact``: from ``twins``, else from ``runs``; both
        reads begun, not necessarily landed) and each query's parts (indexes of entries)."""
        self.u_src = np.where(compact, TWINS, RUNS).astype(np.int64)
        self.u_off = np.zeros(len(compact), np.int64)
        self.u_cnt = np.zeros(len(compact), np.int64)
        for source, read, where in ((RUNS, runs, ~compact), (TWINS, twins, compact)):
            if read is not None:
                self.u_off[where], self.u_cnt[where] = read.byte_offsets, read.counts
                self._source(source, read.buffer)
        self.part_ptr, self.part_of = ptr.astype(np.int64), part_of.astype(np.int64)
        self._part_queries()

    def _part_queries(self) -> None:
        self.part_query = np.repeat(np.arange(len(self.queries)), np.diff(self.part_ptr))

    def _source(self, source: int, raw: np.ndarray) -> None:
        self.words[source] = raw.view(np.uint64)
        if source == TWINS:
            self.values[source] = raw
            return
        element = self.dtype["vector"].base
        values = raw.view(element)  # float16: widened in place of (numba has no float16)
        self.values[source] = values.astype(np.float32) if element == np.float16 else values

    def widen(self, source: int, raw: np.ndarray) -> None:
        """Take ``source``'s buffer again once landed (float16: its widened copy)."""
        if self.dtype["vector"].base == np.float16:
            self._source(source, raw)

    def add_pending(self, records: np.ndarray, pending: dict[int, np.ndarray]) -> None:
        """One more part per tenant with pending grants: its home copies, after its
        shortlists, for each of its queries."""
        if not pending:
            return
        theirs = [records[np.isin(records["id"], i, assume_unique=True)] for i in pending.values()]
        counts = np.array([len(r) for r in theirs], np.int64)
        raw = np.ascontiguousarray(np.concatenate(theirs)).view(np.uint8)
        self._source(PENDING, np.concatenate([raw, np.zeros(8, np.uint8)]))
        first = len(self.u_src)
        self.u_src = np.concatenate([self.u_src, np.full(len(theirs), PENDING)])
        starts = (np.cumsum(counts) - counts) * self.dtype.itemsize
        self.u_off = np.concatenate([self.u_off, starts])
        self.u_cnt = np.concatenate([self.u_cnt, counts])
        extra = np.full(len(self.tenants), -1, np.int64)
        for i, tenant in enumerate(pending):
            extra[self.tenants == tenant] = first + i
        has = extra >= 0
        self.part_of = np.insert(self.part_of, self.part_ptr[1:][has], extra[has])
        self.part_ptr = self.part_ptr + np.concatenate([[0], np.cumsum(has)])
        self._part_queries()

    def prepare_scoring(self, codec: Any) -> None:
        """The scaled queries and biases of the twins (sq8), when any twin is read."""
        if codec is not None:
            self.scaled = np.ascontiguousarray(self.queries * codec.step, np.float32)
            self.bias = (self.queries @ codec.low).astype(np.float32)

    def take(self, parts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Gather and check the records of ``parts`` (now: after their reads landed); their
        (ids, access mask), for ``score``."""
        total = int(self.u_cnt[self.part_of[parts]].sum())
        ids = np.empty(total, np.int64)
        versions = np.empty(total, np.uint32)
        owners = np.empty(total, np.int64)
        w = self.words
        tenant_kernels.gather(
            parts, self.part_of, self.part_query, self.u_src, self.u_off, self.u_cnt,
            w[RUNS], w[TWINS], w[PENDING], self.rec_bytes, self.tenants, ids, versions, owners,
        )  # fmt: skip
        return ids, self.tenancy.table.readable_by(ids, versions, owners)

    def score(self, parts: np.ndarray, ids: np.ndarray, readable: np.ndarray) -> None:
        """Offer the readable records of ``parts`` (as ``take`` returned them) to their
        queries' rows (any thread: rows of queries no other call touches)."""
        tenant_kernels.score(
            parts, self.part_of, self.part_query, self.u_src, self.u_off, self.u_cnt,
            readable, ids, self.values[RUNS], self.values[PENDING],
            self.dtype["vector"].base.itemsize, self.values[TWINS], self.rec_bytes,
            self.queries, self.scaled, self.bias, self.tenancy.metric is Metric.L2,
            self.ids, self.dist, self.filled,
        )  # fmt: skip
