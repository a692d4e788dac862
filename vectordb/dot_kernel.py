"""Check and score the records of many posting lists in one compiled pass over the read buffer.

A search batch scores tens of thousands of short lists (at 2M vectors: ~39,000 lists of ~37
records per 1,000 queries, each probed by one or two queries). One numpy matrix product per
list spends most of its time in Python and call set-up (~6 us a list, about 1 s a batch), and
checking every record's check word in a separate numpy pass reads the buffer once more (0.4 s
for the 4 GB such a batch reads). This loop, compiled by numba, walks every list of a group in
one call: per record it sums the record's 8-byte words (the check of posting_format, same rule
as ``verify_many``) and takes the dot products with the probing queries while the record is in
cache. It reads float32 or uint8 vectors straight from the buffer (float16 ones are widened
first, a piece at a time: widen.py) and never holds the GIL.

Layout (``VectorSpan``): list ``i``'s record ``r`` has its vector at
``values[first[i] + r * stride : ... + dim]`` and its words at
``words[first_word[i] + r * record_words : ...]``: the read buffer seen as flat arrays, so no
list is copied. Each product is summed in float32 in a fixed order, so a query gets
bit-identical distances whatever batch it is in.

Compiled on first use, once per record element type (~0.8 s here), and cached by numba beside
this module (``__pycache__``; ~0.4 s to load in a new process).
Thread-safety: pure; the compiled function releases the GIL, callers own their outputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numba import njit

from tiers.io import CorruptionError
from vectordb.posting_format import CHECK_WORD, check_salts

__all__ = ["VectorSpan", "score_lists", "warm_up"]

_NO_WORDS = np.zeros(1, np.uint64)


@dataclass(frozen=True)
class VectorSpan:
    """The records of consecutive lists inside flat arrays (see the module docstring).
    ``words`` None: the records are not checked (already checked, or built in memory)."""

    values: np.ndarray  # 1-d float32 or uint8
    first: np.ndarray  # int64 [lists]: index in ``values`` of each list's first vector
    counts: np.ndarray  # int64 [lists]: records per list
    stride: int  # elements from one record's vector to the next one's
    dim: int
    words: np.ndarray | None = None  # 1-d uint64 view of the records
    first_word: np.ndarray | None = None  # int64 [lists]
    record_words: int = 0
    posting_ids: np.ndarray | None = None  # int64 [lists]: for the check and the error

    @classmethod
    def of_records(cls, lists: list[np.ndarray]) -> VectorSpan:
        """An unchecked span over copies of structured record arrays (posting_format)."""
        counts = np.array([len(r) for r in lists], np.int64)
        if not lists:
            return cls(np.zeros(0, np.float32), counts, counts, 1, 0)
        dtype = lists[0].dtype
        vector_type, vector_at = dtype.fields["vector"][:2]  # type: ignore[index]
        element, dim = vector_type.base, vector_type.shape[0]
        if element == np.float16:  # widened, as the search does
            flat = np.concatenate([r["vector"].astype(np.float32).reshape(-1) for r in lists])
            return cls(flat, (np.cumsum(counts) - counts) * dim, counts, dim, dim)
        raw = np.zeros(int(counts.sum()) * dtype.itemsize, np.uint8)
        raw.view(dtype)[:] = np.concatenate(lists)
        size = element.itemsize
        first = ((np.cumsum(counts) - counts) * dtype.itemsize + vector_at) // size
        return cls(raw.view(element), first, counts, dtype.itemsize // size, dim)


def score_lists(
    span: VectorSpan,
    bounds: np.ndarray,
    list_base: int,
    queries: np.ndarray,
    dist: np.ndarray,
    norms: np.ndarray | None,
    rows: np.ndarray | None = None,
    skip_corrupt: bool = False,
) -> np.ndarray:
    """For list ``i`` of ``span`` (the batch's list ``list_base + i``), its probes
    ``bounds[u]:bounds[u + 1]`` and record ``r``: ``dist[p, r] = queries[rows[p]] . vector``,
    and ``norms[u, r] = |vector|^2`` when ``norms`` is given. ``queries`` [n, dim] float32;
    ``rows`` int64 [probes] (None: probe ``p`` is query ``p``): a batch's probes share its
    queries without a per-probe copy. A record that fails its check (when checked) raises
    CorruptionError naming it; with ``skip_corrupt`` its list is left where the check stopped
    (records after it unscored) and scoring goes on with the next list. Returns the span's
    list numbers (``i``) found corrupt, in order."""
    corrupt: list[int] = []
    if len(span.counts) == 0 or span.dim == 0:
        return np.asarray(corrupt, np.int64)
    if rows is None:
        rows = np.arange(len(dist), dtype=np.int64)
    checked = span.words is not None
    first = np.ascontiguousarray(span.first, np.int64)
    counts = np.ascontiguousarray(span.counts, np.int64)
    first_word = np.ascontiguousarray(span.first_word if checked else span.first, np.int64)
    salts = _NO_WORDS
    if checked:
        assert span.posting_ids is not None  # a checked span names its lists
        salts = check_salts(span.posting_ids)
    at = 0  # the span's first list not yet scored
    while at < len(counts):
        bad_list, bad_record = _score(
            span.values,
            first[at:],
            counts[at:],
            span.stride,
            span.dim,
            span.words if checked else _NO_WORDS,
            first_word[at:],
            span.record_words,
            salts[at:] if checked else _NO_WORDS,
            checked,
            np.ascontiguousarray(bounds, np.int64),
            list_base + at,
            queries,
            np.ascontiguousarray(rows, np.int64),
            dist,
            norms if norms is not None else np.zeros((1, 1), np.float32),
            norms is not None,
        )
        if bad_list < 0:
            break
        bad_list += at
        if not skip_corrupt:
            assert span.posting_ids is not None
            raise CorruptionError(
                f"posting list {int(span.posting_ids[bad_list])}: record {bad_record} fails "
                "its check; the page is corrupt or was never written (SpannIndex.verify() "
                "finds every such list, repair() rebuilds them)"
            )
        corrupt.append(bad_list)
        at = bad_list + 1
    return np.asarray(corrupt, np.int64)


def warm_up(record_element: np.dtype[Any]) -> None:
    """Compile (or load from numba's cache) the kernel for records of ``record_element``, so
    that an index's first search does not wait for it (SpannIndex runs this on its scoring
    thread when it is opened)."""
    element = np.float32 if np.dtype(record_element) == np.float16 else record_element
    # one signature per element type: checking and norms are run-time flags
    span = VectorSpan(np.zeros(64, element), np.zeros(1, np.int64), np.ones(1, np.int64), 4, 4)
    dist, norms = np.zeros((1, 1), np.float32), np.zeros((1, 1), np.float32)
    score_lists(span, np.array([0, 1], np.int64), 0, np.zeros((1, 4), np.float32), dist, norms)


@njit(nogil=True, fastmath=True, cache=True)
def _score(  # type: ignore[no-untyped-def,unused-ignore]
    values,
    first,
    counts,
    stride,
    dim,
    words,
    first_word,
    record_words,
    salts,
    checked,
    bounds,
    list_base,
    queries,
    rows,
    dist,
    norms,
    with_norms,
):
    for i in range(len(counts)):
        u = list_base + i
        lo = bounds[u]
        hi = bounds[u + 1]
        for r in range(counts[i]):
            if checked:
                w0 = first_word[i] + r * record_words
                total = np.uint64(0)
                for w in range(record_words):
                    total += words[w0 + w]
                check = words[w0 + CHECK_WORD]
                if total - check + salts[i] != check:
                    return i, r
            at = first[i] + r * stride
            vector = values[at : at + dim]
            if with_norms:
                square = np.float32(0.0)
                for d in range(dim):
                    x = np.float32(vector[d])
                    square += x * x
                norms[u, r] = square
            for p in range(lo, hi):
                query = queries[rows[p]]
                acc = np.float32(0.0)
                for d in range(dim):
                    acc += query[d] * np.float32(vector[d])
                dist[p, r] = acc
    return -1, -1
