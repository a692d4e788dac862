"""Write-ahead log: records round trip through a real engine and file; a torn last record ends
the log exactly at the last whole record, damage anywhere else is a CorruptionError; segments
are listed, cut and dropped."""

from __future__ import annotations

import asyncio
import os
import struct
import zlib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tiers.io.errors import CorruptionError
from tiers.io.factory import create_engine
from vectordb.wal import (
    DELETE,
    INSERT,
    WriteAheadLog,
    encode_record,
    list_segments,
    read_segment,
    segment_name,
)

DIM = 3


def _with_wal(directory: Path, body: Callable[[WriteAheadLog], Awaitable[Any]]) -> Any:
    async def main() -> Any:
        engine = create_engine()
        try:
            wal = WriteAheadLog(engine, str(directory))
            try:
                return await body(wal)
            finally:
                await wal.close()
        finally:
            await engine.aclose()

    return asyncio.run(main())


Op = tuple[int, np.ndarray, np.ndarray | None]


def _ops(dtype: str = "float32", seed: int = 0) -> list[Op]:
    rng = np.random.default_rng(seed)
    ops: list[Op] = []
    for n in [1, 4, 0, 7, 2]:
        ids = rng.integers(-(1 << 40), 1 << 40, n, dtype=np.int64)
        if np.dtype(dtype) == np.uint8:
            vectors = rng.integers(0, 256, (n, DIM), dtype=np.uint8)
        else:
            vectors = rng.normal(size=(n, DIM)).astype(np.float32)
        ops.append((INSERT, ids, vectors))
        ops.append((DELETE, ids[: max(1, n // 2)], None))
    return ops


async def _append_all(wal: WriteAheadLog, ops: list[Op]) -> list[int]:
    return [await wal.append(kind, ids, vectors) for kind, ids, vectors in ops]


def _assert_records(got: list[Any], ops: list[Op], first_lsn: int = 1) -> None:
    assert len(got) == len(ops)
    for k, (rec, (kind, ids, vectors)) in enumerate(zip(got, ops, strict=True)):
        assert rec.kind == kind
        assert rec.lsn == first_lsn + k
        np.testing.assert_array_equal(rec.ids, ids)
        if vectors is None:
            assert rec.vectors is None
        else:
            assert rec.vectors is not None
            assert rec.vectors.dtype == vectors.dtype
            assert rec.vectors.shape == (len(ids), DIM)
            np.testing.assert_array_equal(rec.vectors, vectors)


@pytest.mark.parametrize("dtype", ["float32", "uint8"])
def test_round_trip_and_lsn_order(tmp_path: Path, dtype: str) -> None:
    ops = _ops(dtype)

    async def body(wal: WriteAheadLog) -> tuple[list[int], int]:
        await wal.start_segment(0)
        return await _append_all(wal, ops), wal.bytes_written

    lsns, written = _with_wal(tmp_path, body)
    assert lsns == list(range(1, len(ops) + 1))
    assert written == os.path.getsize(tmp_path / segment_name(0))
    records, valid = read_segment(str(tmp_path / segment_name(0)), DIM, dtype)
    _assert_records(records, ops)
    assert valid == os.path.getsize(tmp_path / segment_name(0))


def test_header_layout(tmp_path: Path) -> None:
    ids = np.array([5, -6, 7], np.int64)
    vectors = np.arange(9, dtype=np.float32).reshape(3, 3)
    raw = encode_record(INSERT, 42, ids, vectors)
    magic, kind, r0, lsn, count, payload, crc, r1 = struct.unpack_from("<IB3sQIIII", raw)
    assert (magic, kind, r0, lsn, count, r1) == (0x31574B54, INSERT, b"\0\0\0", 42, 3, 0)
    assert payload == 3 * 8 + 9 * 4 + 4  # zero-padded to a multiple of 8
    assert len(raw) == 32 + payload
    assert raw[32:56] == ids.tobytes()
    assert raw[56:92] == vectors.tobytes()
    assert raw[92:] == b"\0" * 4
    assert crc == zlib.crc32(raw[32:], zlib.crc32(raw[:24]))


def _whole_log(tmp_path: Path, ops: list[Op]) -> tuple[bytes, list[int]]:
    """The bytes of a segment holding ``ops`` and the end offset of each record."""
    _with_wal(tmp_path, lambda wal: _start_and_append(wal, ops))
    data = (tmp_path / segment_name(0)).read_bytes()
    ends = list(np.cumsum([len(encode_record(k, 0, i, v)) for k, i, v in ops]))
    assert ends[-1] == len(data)
    return data, [int(e) for e in ends]


async def _start_and_append(wal: WriteAheadLog, ops: list[Op], seq: int = 0) -> None:
    await wal.start_segment(seq)
    await _append_all(wal, ops)


def test_torn_tail_at_every_offset(tmp_path: Path) -> None:
    ops = _ops()[:5]
    (tmp_path / "log").mkdir()
    data, ends = _whole_log(tmp_path / "log", ops)
    torn = tmp_path / "torn.log"
    for cut in range(ends[-2], ends[-1]):
        torn.write_bytes(data[:cut])
        records, valid = read_segment(str(torn), DIM, np.float32)
        _assert_records(records, ops[:-1])
        assert valid == ends[-2], cut
    # and a cut inside any earlier record keeps exactly the records before it
    for cut in range(0, ends[-2], 7):
        torn.write_bytes(data[:cut])
        records, valid = read_segment(str(torn), DIM, np.float32)
        whole = sum(e <= cut for e in ends)
        _assert_records(records, ops[:whole])
        assert valid == (ends[whole - 1] if whole else 0)


_OPS = _ops(seed=3)


@pytest.fixture(scope="module")
def flip_log(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, bytes, list[int]]:
    directory = tmp_path_factory.mktemp("flip")
    return (directory, *_whole_log(directory, _OPS))


def test_a_flipped_byte_is_damage_unless_in_the_last_record(
    flip_log: tuple[Path, bytes, list[int]],
) -> None:
    """Every byte in turn: before the last record, CorruptionError naming the file and the
    damaged record (never a silent cut that drops the acknowledged records after it); in the
    last record, a torn append that ends the log just before it."""
    directory, raw, ends = flip_log
    path = directory / "damaged.log"
    masks = np.random.default_rng(5).integers(1, 256, len(raw))
    for where in range(len(raw)):
        damaged = bytearray(raw)
        damaged[where] ^= int(masks[where])
        path.write_bytes(bytes(damaged))
        hit = sum(e <= where for e in ends)  # the record holding the flipped byte
        start = ends[hit - 1] if hit else 0
        if hit == len(ends) - 1:
            records, valid = read_segment(str(path), DIM, np.float32)
            _assert_records(records, _OPS[:hit])
            assert valid == start, where
            continue
        with pytest.raises(CorruptionError, match=str(path)) as info:
            read_segment(str(path), DIM, np.float32)
        assert (info.value.path, info.value.offset_bytes) == (str(path), start), where


def test_only_the_newest_segment_may_end_torn(tmp_path: Path) -> None:
    data, ends = _whole_log(tmp_path, _OPS[:3])
    torn = data[: ends[-1] - 5]
    (tmp_path / segment_name(0)).write_bytes(torn)
    assert read_segment(str(tmp_path / segment_name(0)), DIM, np.float32)[1] == ends[-2]
    (tmp_path / segment_name(1)).write_bytes(b"")  # a later segment: 0 was cut when it began
    for newest in (None, False):
        with pytest.raises(CorruptionError, match="later segment"):
            read_segment(str(tmp_path / segment_name(0)), DIM, np.float32, newest=newest)
    records, valid = read_segment(str(tmp_path / segment_name(0)), DIM, np.float32, newest=True)
    assert (len(records), valid) == (2, ends[-2])


def _append_bytes(path: Path, data: bytes) -> None:
    """What an append that failed half-way leaves behind."""
    with open(path, "ab") as f:
        f.write(data)


def test_a_new_segment_cuts_a_failed_append_off_the_old_one(tmp_path: Path) -> None:
    ops = _ops()[:3]

    async def body(wal: WriteAheadLog) -> int:
        await _start_and_append(wal, ops)
        whole = wal.bytes_written
        _append_bytes(tmp_path / segment_name(0), encode_record(INSERT, 99, *ops[0][1:])[:50])
        await wal.start_segment(1)
        return whole

    whole = _with_wal(tmp_path, body)
    assert os.path.getsize(tmp_path / segment_name(0)) == whole
    records, valid = read_segment(str(tmp_path / segment_name(0)), DIM, np.float32)
    _assert_records(records, ops)
    assert valid == whole


def test_start_segment_cuts_a_torn_tail_and_appends_after_it(tmp_path: Path) -> None:
    ops = _ops()[:4]
    data, ends = _whole_log(tmp_path, ops)
    path = tmp_path / segment_name(0)
    path.write_bytes(data + data[ends[0] : ends[0] + 20])  # a torn half-record after the end
    records, valid = read_segment(str(path), DIM, np.float32)
    assert valid == ends[-1]
    more = _ops(seed=9)[:2]

    async def reopen(wal: WriteAheadLog) -> None:
        await wal.start_segment(0, valid)
        assert wal.bytes_written == valid

    _with_wal(tmp_path, reopen)
    assert os.path.getsize(path) == valid  # the torn bytes are gone, not just overwritten later

    async def body(wal: WriteAheadLog) -> None:
        await wal.start_segment(0, valid)
        wal.next_lsn = records[-1].lsn + 1
        await _append_all(wal, more)

    _with_wal(tmp_path, body)
    records, valid = read_segment(str(path), DIM, np.float32)
    _assert_records(records, ops + more)
    assert valid == os.path.getsize(path)


def test_segments_listed_and_dropped(tmp_path: Path) -> None:
    (tmp_path / "postings.dat").write_bytes(b"x")
    (tmp_path / "wal-1.log").write_bytes(b"")  # not the 8-digit pattern: ignored
    (tmp_path / "wal-00000002.log.tmp").write_bytes(b"")

    async def body(wal: WriteAheadLog) -> list[list[int]]:
        seen = []
        for seq in [0, 1, 2, 5]:
            await wal.start_segment(seq)
            await wal.append(DELETE, np.array([seq], np.int64), None)
            assert wal.seq == seq and wal.bytes_written > 0
        seen.append(list_segments(str(tmp_path)))
        wal.drop_segments_before(2)
        seen.append(list_segments(str(tmp_path)))
        wal.drop_segments_before(2)  # idempotent
        seen.append(list_segments(str(tmp_path)))
        await wal.append(DELETE, np.array([99], np.int64), None)  # still appends to seq 5
        return seen

    seen = _with_wal(tmp_path, body)
    assert seen == [[0, 1, 2, 5], [2, 5], [2, 5]]
    assert (tmp_path / "wal-1.log").exists() and (tmp_path / "wal-00000002.log.tmp").exists()
    lsns = []
    for seq in [2, 5]:
        records, _ = read_segment(str(tmp_path / segment_name(seq)), DIM, np.float32)
        lsns += [r.lsn for r in records]
        assert records[0].ids.tolist() == [seq]
    assert lsns == [3, 4, 5]  # lsn runs on across segments


def test_segment_name() -> None:
    assert segment_name(7) == "wal-00000007.log"
    assert segment_name(12345678) == "wal-12345678.log"


def test_empty_and_garbage_segments(tmp_path: Path) -> None:
    path = tmp_path / segment_name(0)
    path.write_bytes(b"")
    assert read_segment(str(path), DIM, np.float32) == ([], 0)
    path.write_bytes(b"\0" * 100)  # preallocated zeros: no magic
    assert read_segment(str(path), DIM, np.float32) == ([], 0)
