"""RecordLog: opaque records round trip; a torn last record is cut, damage before it is a
CorruptionError; recovery checks segments and LSNs; an append that fails is not acknowledged
and a power cut keeps exactly the acknowledged records."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from tiers.io import StorageError, ThreadEngine
from tiers.io.errors import CorruptionError, EngineClosedError
from tiers.storage import LogRecord, RecordLog
from tiers.testing.faulty_engine import FaultyEngine

PAYLOADS = [b"", b"a", b"x" * 8, bytes(range(13)), b"\xff" * 100]


def _with_log(
    directory: Path, body: Callable[[RecordLog], Awaitable[Any]], engine: Any = None
) -> Any:
    async def main() -> Any:
        inner = engine or ThreadEngine(2)
        log = RecordLog(inner, str(directory))
        try:
            return await body(log)
        finally:
            with contextlib.suppress(EngineClosedError):  # after a power cut
                await log.close()
            await inner.aclose()

    return asyncio.run(main())


async def _write(log: RecordLog, payloads: list[bytes], seq: int = 0) -> list[int]:
    await log.start_segment(seq)
    return [await log.append(k + 1, len(p), p) for k, p in enumerate(payloads)]


def _same(records: list[LogRecord], payloads: list[bytes], first_lsn: int = 1) -> None:
    assert [r.lsn for r in records] == list(range(first_lsn, first_lsn + len(payloads)))
    for k, (record, payload) in enumerate(zip(records, payloads, strict=True)):
        assert (record.kind, record.aux) == (k + 1, len(payload))
        padded = payload + b"\0" * (-len(payload) % 8)
        assert bytes(record.payload) == padded


def test_round_trip_pads_to_8_and_numbers_records(tmp_path: Path) -> None:
    lsns = _with_log(tmp_path, lambda log: _write(log, PAYLOADS))
    assert lsns == [1, 2, 3, 4, 5]
    path = str(tmp_path / RecordLog.segment_name(0))
    records, valid = RecordLog.read_segment(path)
    _same(records, PAYLOADS)
    assert valid == os.path.getsize(path) == sum(32 + -(-len(p) // 8) * 8 for p in PAYLOADS)


def test_a_torn_tail_is_cut_and_damage_before_it_is_an_error(tmp_path: Path) -> None:
    _with_log(tmp_path, lambda log: _write(log, PAYLOADS))
    data = (tmp_path / RecordLog.segment_name(0)).read_bytes()
    last = len(data) - len(RecordLog.encode(5, 5, 100, PAYLOADS[-1]))
    torn = tmp_path / "torn.log"
    for cut in range(last, len(data)):  # any cut inside the last record: a torn append
        torn.write_bytes(data[:cut])
        records, valid = RecordLog.read_segment(str(torn))
        _same(records, PAYLOADS[:-1])
        assert valid == last
    damaged = bytearray(data)
    damaged[33] ^= 0x40  # the kind of the second record (the first is a bare 32-byte header)
    torn.write_bytes(bytes(damaged))
    with pytest.raises(CorruptionError, match="whole record follows") as info:
        RecordLog.read_segment(str(torn))
    assert (info.value.path, info.value.offset_bytes) == (str(torn), 32)


def test_a_check_that_refuses_a_header_makes_it_a_failed_record(tmp_path: Path) -> None:
    _with_log(tmp_path, lambda log: _write(log, PAYLOADS[:2]))
    path = str(tmp_path / RecordLog.segment_name(0))
    records, valid = RecordLog.read_segment(path, lambda kind, aux, size: kind == 1)
    assert len(records) == 1 and valid == 32  # the last record refused: a torn tail


def test_recover_checks_segments_and_lsns_then_appends_after(tmp_path: Path) -> None:
    async def two_segments(log: RecordLog) -> None:
        await _write(log, PAYLOADS[:2])
        await log.start_segment(1)
        await log.append(3, 0, b"")

    _with_log(tmp_path, two_segments)

    async def recover(log: RecordLog, start_seq: int = 0, next_lsn: int = 1) -> list[int]:
        log.next_lsn = next_lsn
        lsns = [record.lsn async for record in log.recover(start_seq)]
        assert (log.seq, log.next_lsn) == (max(start_seq, 1), lsns[-1] + 1 if lsns else next_lsn)
        return lsns

    assert _with_log(tmp_path, recover) == [1, 2, 3]
    assert _with_log(tmp_path, lambda log: recover(log, 1, 3)) == [3]
    with pytest.raises(CorruptionError, match="LSN 3 where 4 was due"):
        _with_log(tmp_path, lambda log: recover(log, 1, 4))
    (tmp_path / RecordLog.segment_name(3)).write_bytes(b"")  # segment 2 lost in between
    with pytest.raises(CorruptionError, match="missing") as info:
        _with_log(tmp_path, recover)
    assert info.value.path == str(tmp_path / RecordLog.segment_name(2))


def test_a_failed_append_is_not_acknowledged_and_a_power_cut_keeps_the_acked(
    tmp_path: Path,
) -> None:
    engine = FaultyEngine(ThreadEngine(2))

    async def body(log: RecordLog) -> list[int]:
        lsns = await _write(log, PAYLOADS[:2])
        engine.fail_next("eio_fsync")
        with pytest.raises(StorageError):
            await log.append(9, 0, b"never acknowledged, though written")
        engine.fail_next("eio_write")
        with pytest.raises(StorageError):
            await log.append(9, 0, b"never written")
        lsns.append(await log.append(3, len(PAYLOADS[2]), PAYLOADS[2]))  # over the failed one
        engine.fail_next("eio_fsync")
        with pytest.raises(StorageError):
            await log.append(4, 1, b"b")  # written, not durable: the power cut undoes it
        assert log.next_lsn == 4
        await engine.power_cut()
        return lsns

    assert _with_log(tmp_path, body, engine) == [1, 2, 3]
    path = tmp_path / RecordLog.segment_name(0)
    records, valid = RecordLog.read_segment(str(path))
    _same(records, PAYLOADS[:3])
    assert valid == sum(len(RecordLog.encode(1, 1, 0, p)) for p in PAYLOADS[:3])
    assert path.stat().st_size > valid  # the rest of the longer failed record: a torn tail
