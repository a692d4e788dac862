"""Posting-list records: the one place the on-disk byte layout is defined (writer and reader).

A posting list occupies a contiguous, 4 KiB-aligned run of pages in ``postings.dat``; its
records are packed back to back from the first byte of the run. How many records are valid is
kept in the posting directory (memory, checkpointed to LMDB), never in the pages, so an append
rewrites only the page(s) the new records touch. Bytes past the last valid record are undefined
(a concurrent append may be filling them).

Record layout, little-endian, ``record_bytes(dim, dtype)`` long (a multiple of 8)::

    offset  size  field
    0       8     id        int64   the vector's id (>= 0)
    8       4     version   uint32  the vector's version when written (see version_map)
    12      4     reserved  uint32  0
    16      8     check     uint64  SEED + posting_id * MIX + sum of the record's other u64 words
    24      d*s   vector    dim values of the index dtype (float32 or uint8), zero-padded to 8

The check is a vectorised sum (memory-bound, ~GB/s in numpy), not a CRC: any change confined to
one 8-byte word is always caught (the sum changes by a non-zero amount mod 2**64), a zeroed or
never-written record fails because SEED != 0, and a record left behind by another posting list
fails because the posting id is mixed in. Changes spread over several words are caught unless
they cancel exactly mod 2**64.

Thread-safety: pure functions over numpy arrays.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tiers.io import CorruptionError

__all__ = [
    "CHECK_WORD",
    "FORMAT_VERSION",
    "PAGE_BYTES",
    "bad_records",
    "check_salts",
    "decode",
    "encode",
    "lists_with_bad",
    "pages_for",
    "record_bytes",
    "record_dtype",
    "verify_many",
]

FORMAT_VERSION = 1
PAGE_BYTES = 4096
_HEADER_BYTES = 24
SEED = 0x74696572_6B697431 ^ FORMAT_VERSION  # "tierkit1"
MIX = 0x9E3779B9_7F4A7C15  # odd: posting ids map to distinct offsets
CHECK_WORD = 2  # the check's place in a record, in 8-byte words


def record_bytes(dim: int, dtype: Any) -> int:
    vector = dim * np.dtype(dtype).itemsize
    return _HEADER_BYTES + -(-vector // 8) * 8


def record_dtype(dim: int, dtype: Any) -> np.dtype[Any]:
    """Structured dtype of one record (``id``, ``version``, ``check``, ``vector``)."""
    return np.dtype(
        {
            "names": ["id", "version", "reserved", "check", "vector"],
            "formats": ["<i8", "<u4", "<u4", "<u8", (np.dtype(dtype), (dim,))],
            "offsets": [0, 8, 12, 16, 24],
            "itemsize": record_bytes(dim, dtype),
        }
    )


def pages_for(n_records: Any, rec_bytes: int) -> Any:
    """Pages ``n_records`` records take (an int, or elementwise for an int64 array)."""
    return -(-n_records * rec_bytes // PAGE_BYTES)


def _checks(words: np.ndarray, posting_ids: np.ndarray | int) -> np.ndarray:
    """Expected check word per row of ``words`` (uint64 [n, w])."""
    total = words.sum(axis=1, dtype=np.uint64) - words[:, CHECK_WORD]
    # 1-d arrays: numpy wraps array arithmetic silently (scalar arithmetic would warn)
    salt = np.atleast_1d(np.asarray(posting_ids, dtype=np.uint64)) * np.uint64(MIX)
    salt += np.uint64(SEED)
    return total + salt


def encode(
    out: np.ndarray, posting_id: int, ids: np.ndarray, versions: np.ndarray, vectors: np.ndarray
) -> None:
    """Write records into ``out`` (a structured array of ``record_dtype``, len(ids) long)."""
    out["id"] = ids
    out["version"] = versions
    out["reserved"] = 0
    out["check"] = 0
    out["vector"] = vectors
    raw = out.view(np.uint8).reshape(len(out), out.dtype.itemsize)
    if out.dtype.itemsize > _HEADER_BYTES + out.dtype["vector"].itemsize:
        raw[:, _HEADER_BYTES + out.dtype["vector"].itemsize :] = 0  # padding is checked too
    words = raw.view(np.uint64)
    out["check"] = _checks(words, posting_id)


def decode(
    buffer: np.ndarray, n_records: int, dtype: np.dtype[Any], posting_ids: np.ndarray | int
) -> np.ndarray:
    """View the first ``n_records`` records of ``buffer`` (uint8) and verify every check word.

    ``posting_ids``: one id for all records, or one per record (several lists read at once).
    Raises CorruptionError naming the first bad record.
    """
    size = n_records * dtype.itemsize
    if buffer.nbytes < size:
        raise CorruptionError(f"posting data is {buffer.nbytes} bytes, {n_records} need {size}")
    records = buffer[:size].view(dtype)
    words = buffer[:size].view(np.uint64).reshape(n_records, dtype.itemsize // 8)
    bad = np.flatnonzero(_checks(words, posting_ids) != records["check"])
    if bad.size:
        first = int(bad[0])
        record = first  # counted from the start of its own list, not of the batch
        if np.isscalar(posting_ids):
            pid = int(posting_ids)  # type: ignore[arg-type]
        else:
            per_record = np.asarray(posting_ids)
            pid = per_record[first]
            others = np.flatnonzero(per_record[:first] != pid)
            record = first - (int(others[-1]) + 1 if len(others) else 0)
        raise CorruptionError(
            f"posting list {int(pid)}: record {record} fails its check "
            f"({bad.size} bad of {n_records}); the page is corrupt or was never written"
        )
    return records


def verify_many(
    buffer: np.ndarray, byte_offsets: np.ndarray, counts: np.ndarray, dtype: np.dtype[Any],
    posting_ids: np.ndarray,
) -> None:  # fmt: skip
    """Verify every record of several lists lying in one read buffer, in a few vectorised
    passes (a prefix sum of the buffer's words; no per-list Python): the search path.

    List i has ``counts[i]`` records from ``byte_offsets[i]`` (8-byte aligned).
    Raises CorruptionError naming the first bad list and record.
    """
    bad = bad_records(buffer, byte_offsets, counts, dtype, posting_ids)
    if bad.any():
        counts = np.asarray(counts, np.int64)
        first_list = int(lists_with_bad(bad, counts)[0])
        first = int(counts[:first_list].sum())
        record = int(np.flatnonzero(bad[first : first + int(counts[first_list])])[0])
        raise CorruptionError(
            f"posting list {int(np.asarray(posting_ids)[first_list])}: record {record} fails "
            f"its check ({int(bad.sum())} bad in this read); the page is corrupt or was never "
            "written (SpannIndex.verify() finds every such list, repair() rebuilds them)"
        )


def bad_records(
    buffer: np.ndarray, byte_offsets: np.ndarray, counts: np.ndarray, dtype: np.dtype[Any],
    posting_ids: np.ndarray,
) -> np.ndarray:  # fmt: skip
    """Which records (the lists' records back to back, bool [counts.sum()]) fail their check;
    the same layout and precondition as :func:`verify_many`."""
    counts = np.asarray(counts, np.int64)
    total = int(counts.sum())
    if total == 0:
        return np.zeros(0, bool)
    width = dtype.itemsize // 8
    words = buffer.view(np.uint64)
    first_record = np.repeat(np.cumsum(counts) - counts, counts)
    in_list = np.arange(total) - first_record  # record number inside its list
    starts = np.repeat(np.asarray(byte_offsets, np.int64) // 8, counts) + in_list * width
    # one reduceat over [start, end) pairs; the (end, next start) gaps are dropped. Precondition:
    # the buffer extends at least one word past the last record (the reader allocates a spare
    # page), so every index is in range.
    bounds = np.empty(2 * total, np.int64)
    bounds[0::2] = starts
    bounds[1::2] = starts + width
    sums = np.add.reduceat(words, bounds)[0::2]
    check = words[starts + CHECK_WORD]
    pids = np.repeat(np.asarray(posting_ids, np.int64), counts)
    return _checks_from_sums(sums, check, pids) != check


def lists_with_bad(bad: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Indexes of the lists (``counts`` records each, back to back in ``bad``) holding at
    least one bad record."""
    counts = np.asarray(counts, np.int64)
    nonempty = np.flatnonzero(counts > 0)
    if len(nonempty) == 0:
        return nonempty
    per_list = np.add.reduceat(bad.astype(np.int64), (np.cumsum(counts) - counts)[nonempty])
    return nonempty[per_list > 0]


def check_salts(posting_ids: np.ndarray) -> np.ndarray:
    """Per posting id, what its records' check adds to their words' sum (uint64, wrapping):
    a record of list ``p`` is sound when ``sum(words) - check + check_salts(p) == check``
    (the rule verify_many applies; dot_kernel applies it while scoring)."""
    salt = np.atleast_1d(np.asarray(posting_ids, dtype=np.uint64)) * np.uint64(MIX)
    salt += np.uint64(SEED)
    return salt


def _checks_from_sums(sums: np.ndarray, check: np.ndarray, posting_ids: np.ndarray) -> np.ndarray:
    return sums - check + check_salts(posting_ids)
