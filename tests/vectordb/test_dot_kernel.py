"""dot_kernel against plain numpy: distances and norms of every (probe, record) pair, for
float32, float16 (widened) and uint8 records laid out as a read lays them out (each list
page-aligned in one buffer); and its fused check against posting_format.verify_many: a byte
flipped inside any record is caught, naming the same list and record, and bytes outside the
records are never looked at."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tiers.io.errors import CorruptionError
from vectordb.dot_kernel import VectorSpan, score_lists
from vectordb.posting_format import (
    PAGE_BYTES,
    bad_records,
    encode,
    lists_with_bad,
    pages_for,
    record_dtype,
    verify_many,
)
from vectordb.posting_reads import PostingRead


def _buffer(
    rng: np.random.Generator, sizes: list[int], dim: int, dtype: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[np.ndarray]]:
    """(buffer, byte offsets, posting ids, vectors per list): lists encoded page-aligned."""
    record = record_dtype(dim, dtype)
    counts = np.array(sizes, np.int64)
    pages = pages_for(counts, record.itemsize)
    offsets = (np.cumsum(pages) - pages) * PAGE_BYTES
    buffer = rng.integers(0, 256, int(pages.sum() + 1) * PAGE_BYTES).astype(np.uint8)  # junk
    pids = rng.choice(10_000, len(sizes), replace=False).astype(np.int64)
    vectors = []
    for i, n in enumerate(sizes):
        if dtype == "uint8":
            v = rng.integers(0, 256, (n, dim)).astype(np.uint8)
        else:
            v = rng.normal(size=(n, dim)).astype(dtype)
        out = buffer[offsets[i] : offsets[i] + n * record.itemsize].view(record)
        encode(out, int(pids[i]), np.arange(n), np.ones(n, np.uint32), v)
        vectors.append(v.astype(np.float32))
    return buffer, offsets, pids, vectors


def _read_of(buffer, offsets, sizes, pids, dim, dtype):  # type: ignore[no-untyped-def]
    """A PostingRead over an already filled buffer (no I/O: only its layout is used)."""
    read = PostingRead.__new__(PostingRead)
    read.buffer, read.byte_offsets = buffer, offsets
    read.counts, read.pids = np.array(sizes, np.int64), pids
    read.dtype = record_dtype(dim, dtype)
    return read


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    sizes=st.lists(st.integers(0, 40), min_size=1, max_size=8),
    dim=st.integers(1, 40),
    dtype=st.sampled_from(["float32", "float16", "uint8"]),
    with_norms=st.booleans(),
)
def test_scores_match_numpy(
    seed: int, sizes: list[int], dim: int, dtype: str, with_norms: bool
) -> None:
    rng = np.random.default_rng(seed)
    buffer, offsets, pids, vectors = _buffer(rng, sizes, dim, dtype)
    probes = rng.integers(0, 4, len(sizes))  # probes per list, some lists unprobed
    bounds = np.concatenate([[0], np.cumsum(probes)]).astype(np.int64)
    queries = rng.normal(size=(int(bounds[-1]), dim)).astype(np.float32)
    longest = max(sizes)
    dist = np.full((len(queries), longest), np.nan, np.float32)
    norms = np.full((len(sizes), longest), np.nan, np.float32) if with_norms else None
    read = _read_of(buffer, offsets, sizes, pids, dim, dtype)
    for offset, span in read.spans(0, len(sizes)):
        score_lists(span, bounds, offset, queries, dist, norms)
    for u, v in enumerate(vectors):
        want = queries[bounds[u] : bounds[u + 1]] @ v.T
        got = dist[bounds[u] : bounds[u + 1], : len(v)]
        np.testing.assert_allclose(
            got, want, rtol=1e-4, atol=1e-3 * max(1.0, np.abs(want).max(initial=0))
        )
        if norms is not None:
            np.testing.assert_allclose(norms[u, : len(v)], (v * v).sum(axis=1), rtol=1e-4)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), sizes=st.lists(st.integers(1, 30), min_size=1, max_size=6))
def test_probes_share_query_rows(seed: int, sizes: list[int]) -> None:
    """Probes naming their query by row (``rows``) score exactly as with a per-probe copy,
    bit for bit: the search passes its batch's queries once, not one copy per probe."""
    rng = np.random.default_rng(seed)
    dim = 12
    buffer, offsets, pids, _ = _buffer(rng, sizes, dim, "float32")
    probes = rng.integers(0, 4, len(sizes))
    bounds = np.concatenate([[0], np.cumsum(probes)]).astype(np.int64)
    queries = rng.normal(size=(3, dim)).astype(np.float32)
    rows = rng.integers(0, 3, int(bounds[-1])).astype(np.int64)  # probes of the same query
    by_row = np.full((len(rows), max(sizes)), np.nan, np.float32)
    copied = by_row.copy()
    read = _read_of(buffer, offsets, sizes, pids, dim, "float32")
    for offset, span in read.spans(0, len(sizes)):
        score_lists(span, bounds, offset, queries, by_row, None, rows)
        score_lists(span, bounds, offset, queries[rows], copied, None)
    np.testing.assert_array_equal(by_row, copied)


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    sizes=st.lists(st.integers(1, 30), min_size=1, max_size=6),
    dtype=st.sampled_from(["float32", "float16", "uint8"]),
    inside=st.booleans(),
)
def test_a_flipped_byte_is_caught_as_verify_many_catches_it(
    seed: int, sizes: list[int], dtype: str, inside: bool
) -> None:
    rng = np.random.default_rng(seed)
    dim = 12
    buffer, offsets, pids, _ = _buffer(rng, sizes, dim, dtype)
    size = record_dtype(dim, dtype).itemsize
    u = int(rng.integers(len(sizes)))
    if inside:  # a byte of record r of list u
        r = int(rng.integers(sizes[u]))
        at = int(offsets[u]) + r * size + int(rng.integers(size))
    else:  # past the list's last record: padding the search never reads
        end = int(offsets[u]) + sizes[u] * size
        room = int(offsets[u]) + int(pages_for(sizes[u], size)) * PAGE_BYTES - end
        if room == 0:
            return
        at = end + int(rng.integers(room))
    buffer[at] ^= np.uint8(1 << int(rng.integers(8)))
    bounds = np.zeros(len(sizes) + 1, np.int64)  # no probes: the check alone
    read = _read_of(buffer, offsets, sizes, pids, dim, dtype)
    queries = np.zeros((0, dim), np.float32)
    dist = np.zeros((0, max(sizes)), np.float32)

    def kernel() -> None:
        for offset, span in read.spans(0, len(sizes)):
            score_lists(span, bounds, offset, queries, dist, None)

    def reference() -> None:
        verify_many(buffer, offsets, np.array(sizes, np.int64), read.dtype, pids)

    def skipped_by_kernel() -> list[int]:
        return [
            offset + int(i)
            for offset, span in read.spans(0, len(sizes))
            for i in score_lists(span, bounds, offset, queries, dist, None, skip_corrupt=True)
        ]

    # skipping (a search's default): the same lists, by the kernel and by the vectorised scrub
    counts = np.array(sizes, np.int64)
    by_scrub = lists_with_bad(bad_records(buffer, offsets, counts, read.dtype, pids), counts)
    assert skipped_by_kernel() == by_scrub.tolist() == ([u] if inside else [])
    if not inside:
        kernel()
        reference()
        return
    with pytest.raises(CorruptionError) as by_kernel:
        kernel()
    with pytest.raises(CorruptionError) as by_reference:
        reference()
    name = f"posting list {int(pids[u])}: record {r} fails"
    assert name in str(by_kernel.value) and name in str(by_reference.value)


def test_of_records_spans_are_unchecked_copies() -> None:
    records = np.zeros(3, record_dtype(4, "uint8"))
    records["vector"] = np.arange(12).reshape(3, 4)
    span = VectorSpan.of_records([records, records[:1]])
    assert span.words is None and span.counts.tolist() == [3, 1]
    dist = np.zeros((1, 3), np.float32)
    score_lists(span, np.array([0, 1, 1]), 0, np.ones((1, 4), np.float32), dist, None)
    assert dist[0].tolist() == [6.0, 22.0, 38.0]


@pytest.mark.parametrize("dtype", ["float32", "float16", "uint8"])
def test_warm_up_compiles_the_signature_searches_use(dtype: str) -> None:
    """After warm_up no search path compiles anything more for that record type."""
    from vectordb.dot_kernel import _score, warm_up

    warm_up(np.dtype(dtype))
    before = len(_score.signatures)
    rng = np.random.default_rng(0)
    buffer, offsets, pids, _ = _buffer(rng, [3, 5], 8, dtype)
    read = _read_of(buffer, offsets, [3, 5], pids, 8, dtype)
    bounds = np.array([0, 1, 2], np.int64)
    queries = np.ones((2, 8), np.float32) * -2.0  # as ProbeScores scales them: C-contiguous
    for norms in (np.zeros((2, 5), np.float32), None):
        for offset, span in read.spans(0, 2):
            score_lists(span, bounds, offset, queries, np.zeros((2, 5), np.float32), norms)
    assert len(_score.signatures) == before
