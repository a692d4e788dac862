"""posting_format: record layout, encode/decode round trip and the check word's guarantees."""

from __future__ import annotations

import re
import struct
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tiers.io.errors import CorruptionError
from vectordb.posting_format import (
    MIX,
    PAGE_BYTES,
    SEED,
    decode,
    encode,
    pages_for,
    record_bytes,
    record_dtype,
)

DTYPES = ["float32", "uint8"]
_M64 = (1 << 64) - 1


def _records(
    n: int, dim: int, dtype: Any, seed: int = 0, posting_id: int = 7
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(raw uint8 buffer, ids, versions, vectors) of ``n`` encoded records."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 1 << 62, n, dtype=np.int64)
    versions = rng.integers(1, 1 << 32, n, dtype=np.uint32)
    if np.dtype(dtype) == np.uint8:
        vectors = rng.integers(0, 256, (n, dim), dtype=np.uint8)
    else:
        vectors = rng.normal(size=(n, dim)).astype(np.float32)
    rec = np.empty(n, record_dtype(dim, dtype))
    encode(rec, posting_id, ids, versions, vectors)
    return rec.view(np.uint8).copy(), ids, versions, vectors


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", [1, 3, 5, 7, 8, 13, 100])
def test_round_trip_with_padding(dtype: str, dim: int) -> None:
    raw, ids, versions, vectors = _records(11, dim, dtype, seed=dim)
    assert raw.nbytes == 11 * record_bytes(dim, dtype)
    out = decode(raw, 11, record_dtype(dim, dtype), 7)
    np.testing.assert_array_equal(out["id"], ids)
    np.testing.assert_array_equal(out["version"], versions)
    np.testing.assert_array_equal(out["vector"], vectors)
    assert out["vector"].dtype == np.dtype(dtype)
    assert (out["reserved"] == 0).all()


@pytest.mark.parametrize(
    ("dim", "dtype", "expected"),
    [
        (1, "uint8", 32),
        (8, "uint8", 32),
        (9, "uint8", 40),
        (1, "float32", 32),
        (2, "float32", 32),
        (3, "float32", 40),
        (128, "float32", 24 + 512),
        (100, "uint8", 24 + 104),
    ],
)
def test_record_bytes(dim: int, dtype: str, expected: int) -> None:
    assert record_bytes(dim, dtype) == expected
    assert record_bytes(dim, dtype) % 8 == 0
    assert record_dtype(dim, dtype).itemsize == expected


@given(dim=st.integers(1, 600), dtype=st.sampled_from(DTYPES))
@settings(max_examples=50, deadline=None)
def test_record_bytes_is_minimal_multiple_of_8(dim: int, dtype: str) -> None:
    size = record_bytes(dim, dtype)
    vector = dim * np.dtype(dtype).itemsize
    assert size % 8 == 0
    assert 24 + vector <= size < 24 + vector + 8


@given(n=st.integers(0, 10_000), rec=st.integers(8, 5000).map(lambda v: v * 8))
@settings(max_examples=50, deadline=None)
def test_pages_for_is_ceiling(n: int, rec: int) -> None:
    pages = pages_for(n, rec)
    assert pages * PAGE_BYTES >= n * rec
    assert pages == 0 or (pages - 1) * PAGE_BYTES < n * rec


def test_pages_for_examples() -> None:
    assert pages_for(0, 32) == 0
    assert pages_for(1, 32) == 1
    assert pages_for(128, 32) == 1
    assert pages_for(129, 32) == 2
    assert pages_for(3, 4096) == 3


@pytest.mark.parametrize("dtype", DTYPES)
def test_byte_layout_matches_docstring(dtype: str) -> None:
    dim, pid = 5, 12345
    raw, ids, versions, vectors = _records(3, dim, dtype, seed=1, posting_id=pid)
    size = record_bytes(dim, dtype)
    data = raw.tobytes()
    item = np.dtype(dtype).itemsize
    for r in range(3):
        base = r * size
        rid, version, reserved, check = struct.unpack_from("<qIIQ", data, base)
        assert rid == ids[r]
        assert version == versions[r]
        assert reserved == 0
        fmt = f"<{dim}{'f' if dtype == 'float32' else 'B'}"
        vec = struct.unpack_from(fmt, data, base + 24)
        np.testing.assert_array_equal(np.array(vec, dtype), vectors[r])
        padding = data[base + 24 + dim * item : base + size]
        assert padding == b"\0" * len(padding)
        # check = SEED + posting_id * MIX + sum of the other u64 words (mod 2**64)
        words = struct.unpack_from(f"<{size // 8}Q", data, base)
        others = sum(words) - words[2]
        assert check == (SEED + pid * MIX + others) & _M64


def test_encode_zeroes_dirty_padding() -> None:
    """The padding is covered by the check, so encode must clear garbage left in the buffer."""
    dim = 3  # float32: 12 vector bytes, 4 of padding
    rec = np.empty(4, record_dtype(dim, "float32"))
    rec.view(np.uint8)[:] = 0xAB
    encode(rec, 1, np.arange(4), np.ones(4, np.uint32), np.ones((4, dim), np.float32))
    raw = rec.view(np.uint8).reshape(4, -1)
    assert (raw[:, 36:40] == 0).all()
    decode(rec.view(np.uint8), 4, rec.dtype, 1)


@given(
    dtype=st.sampled_from(DTYPES),
    dim=st.integers(1, 20),
    n=st.integers(1, 6),
    data=st.data(),
)
@settings(max_examples=50, deadline=None)
def test_every_one_word_change_is_detected(
    dtype: str, dim: int, n: int, data: st.DataObject
) -> None:
    pid = data.draw(st.integers(0, 1 << 40), label="pid")
    raw, *_ = _records(n, dim, dtype, seed=dim * 31 + n, posting_id=pid)
    words_per_record = record_bytes(dim, dtype) // 8
    record = data.draw(st.integers(0, n - 1), label="record")
    word = data.draw(st.integers(0, words_per_record - 1), label="word")
    mask = data.draw(st.integers(1, _M64), label="mask")
    words = raw.view(np.uint64)
    words[record * words_per_record + word] ^= np.uint64(mask)
    with pytest.raises(CorruptionError, match=rf"posting list {pid}: record {record}\b"):
        decode(raw, n, record_dtype(dim, dtype), pid)


def test_first_bad_record_is_named_and_bad_count_reported() -> None:
    raw, *_ = _records(10, 4, "float32", posting_id=3)
    size = record_bytes(4, "float32")
    raw[4 * size + 30] ^= 1
    raw[8 * size + 1] ^= 0x80
    with pytest.raises(CorruptionError) as err:
        decode(raw, 10, record_dtype(4, "float32"), 3)
    assert "posting list 3: record 4 " in str(err.value)
    assert "2 bad of 10" in str(err.value)
    # the records before the damage still decode on their own
    decode(raw, 4, record_dtype(4, "float32"), 3)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("pid", [0, 1, 7, 1 << 31])
def test_zeroed_record_fails(dtype: str, pid: int) -> None:
    raw, *_ = _records(3, 6, dtype, posting_id=pid)
    size = record_bytes(6, dtype)
    raw[size : 2 * size] = 0
    with pytest.raises(CorruptionError, match=rf"posting list {pid}: record 1\b"):
        decode(raw, 3, record_dtype(6, dtype), pid)


def test_never_written_page_fails() -> None:
    dt = record_dtype(16, "float32")
    with pytest.raises(CorruptionError, match="record 0"):
        decode(np.zeros(PAGE_BYTES, np.uint8), PAGE_BYTES // dt.itemsize, dt, 0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_record_of_another_posting_fails(dtype: str) -> None:
    raw, *_ = _records(5, 9, dtype, posting_id=7)
    dt = record_dtype(9, dtype)
    decode(raw, 5, dt, 7)
    with pytest.raises(CorruptionError, match=r"posting list 8: record 0\b"):
        decode(raw, 5, dt, 8)


def test_short_buffer_fails() -> None:
    raw, *_ = _records(3, 4, "float32")
    with pytest.raises(CorruptionError):
        decode(raw[:-1], 3, record_dtype(4, "float32"), 7)


def test_per_record_posting_ids() -> None:
    """Several lists read at once: one posting id per record."""
    dim, dt = 5, record_dtype(5, "uint8")
    parts = [_records(n, dim, "uint8", seed=pid, posting_id=pid) for pid, n in [(4, 3), (9, 2)]]
    raw = np.concatenate([p[0] for p in parts])
    pids = np.array([4, 4, 4, 9, 9], np.int64)
    out = decode(raw, 5, dt, pids)
    np.testing.assert_array_equal(out["id"], np.concatenate([p[1] for p in parts]))
    np.testing.assert_array_equal(out["vector"], np.concatenate([p[3] for p in parts]))
    # a wrong id for one record names that record and that posting id
    wrong = pids.copy()
    wrong[3] = 4
    with pytest.raises(CorruptionError, match=r"posting list 4: record 3\b"):
        decode(raw, 5, dt, wrong)
    # swapping the lists' order is caught too
    with pytest.raises(CorruptionError, match=re.escape("posting list 9: record 0 ")):
        decode(raw, 5, dt, pids[::-1].copy())


def test_decode_is_a_view_of_the_prefix() -> None:
    """Bytes past the last valid record are undefined and ignored."""
    raw, ids, *_ = _records(4, 4, "float32")
    size = record_bytes(4, "float32")
    padded = np.concatenate([raw, np.full(3 * size, 0xFF, np.uint8)])
    out = decode(padded, 4, record_dtype(4, "float32"), 7)
    np.testing.assert_array_equal(out["id"], ids)
    assert len(out) == 4
    assert len(decode(padded, 0, record_dtype(4, "float32"), 7)) == 0


def test_verify_many_checks_every_record_of_every_list() -> None:
    from vectordb.posting_format import verify_many

    dtype = record_dtype(5, np.float32)
    rng = np.random.default_rng(3)
    buffer = np.zeros(4 * PAGE_BYTES, np.uint8)
    offsets = np.array([0, PAGE_BYTES, 2 * PAGE_BYTES], np.int64)
    counts = np.array([3, 0, 7], np.int64)
    pids = np.array([11, 12, 13], np.int64)
    for offset, n, pid in zip(offsets, counts, pids, strict=True):
        out = buffer[offset : offset + n * dtype.itemsize].view(dtype)
        encode(out, int(pid), np.arange(n), np.ones(n), rng.normal(size=(n, 5)))
    buffer[3 * 48 + 5] = 0xFF  # garbage after list 11's last record: not part of any record
    verify_many(buffer, offsets, counts, dtype, pids)
    buffer[2 * PAGE_BYTES + 4 * dtype.itemsize + 30] ^= 1  # list 13, record 4
    with pytest.raises(CorruptionError, match="posting list 13: record 4"):
        verify_many(buffer, offsets, counts, dtype, pids)
