"""The NVMe object record: the documented byte layout, round trips, and every damage detected."""

from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tiers.io.buffers import aligned_empty
from tiers.io.errors import CorruptionError
from tiers.nvme import checksums
from tiers.nvme import format as format_module
from tiers.nvme.format import (
    FORMAT_VERSION,
    HEADER_BYTES,
    MAGIC,
    check_payload,
    key_hash,
    parse_header,
    record_bytes,
    write_record,
)

PATH = "/dev/null/extents-00000.dat"


def _record(payload: bytes, version: int = 7, key: str = "k") -> tuple[np.ndarray, int]:
    record = aligned_empty(record_bytes(len(payload)))
    crc = write_record(record, np.frombuffer(payload, np.uint8), version, key_hash(key))
    return record, crc


def _check(record: np.ndarray, size: int, crc: int, version: int = 7, key: str = "k") -> bytes:
    payload = check_payload(
        record,
        PATH,
        8192,
        expect_key_hash=key_hash(key),
        expect_size_bytes=size,
        expect_version=version,
        expect_crc32=crc,
    )
    return payload.tobytes()


@pytest.mark.parametrize("size", [0, 1, 4096 - HEADER_BYTES, 4096 - HEADER_BYTES + 1, 100_000])
def test_round_trip_and_padding(size: int) -> None:
    payload = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8).tobytes()
    record, crc = _record(payload)
    assert record.nbytes == record_bytes(size) and record.nbytes % 4096 == 0
    assert record.nbytes - 4096 < HEADER_BYTES + size <= record.nbytes
    assert crc == zlib.crc32(payload)
    assert _check(record, size, crc) == payload
    assert not record[HEADER_BYTES + size :].any()  # padding is zeros


def test_header_bytes_follow_the_documented_layout() -> None:
    record, crc = _record(b"abc", version=0x0102030405060708, key="key")
    raw = record[:HEADER_BYTES].tobytes()
    assert raw[0:4] == MAGIC
    assert struct.unpack_from("<H", raw, 4)[0] == FORMAT_VERSION
    assert struct.unpack_from("<Q", raw, 8)[0] == 3
    assert struct.unpack_from("<Q", raw, 16)[0] == 0x0102030405060708
    assert struct.unpack_from("<Q", raw, 24)[0] == key_hash("key")
    assert struct.unpack_from("<I", raw, 32)[0] == crc
    assert raw[36:60] == bytes(24) and raw[6:8] == bytes(2)
    assert struct.unpack_from("<I", raw, 60)[0] == zlib.crc32(raw[:60])
    assert record[HEADER_BYTES : HEADER_BYTES + 3].tobytes() == b"abc"


def test_every_single_byte_change_is_detected() -> None:
    payload = bytes(range(200))
    record, crc = _record(payload)
    for index in range(HEADER_BYTES + len(payload)):
        damaged = record.copy()
        damaged[index] ^= 0x01
        with pytest.raises(CorruptionError) as info:
            _check(damaged, len(payload), crc)
        assert info.value.path == PATH and info.value.offset_bytes == 8192


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=9000), st.data())
def test_random_damage_is_detected(payload: bytes, data: st.DataObject) -> None:
    record, crc = _record(payload)
    index = data.draw(st.integers(0, HEADER_BYTES + len(payload) - 1))
    record[index] ^= data.draw(st.integers(1, 255))
    with pytest.raises(CorruptionError):
        _check(record, len(payload), crc)


def test_a_record_that_is_not_the_catalogs_is_refused() -> None:
    """A stale or foreign record has valid checksums of its own; the catalog fields catch it."""
    record, crc = _record(b"x" * 100, version=7, key="k")
    for kwargs in ({"version": 8}, {"key": "other"}):
        with pytest.raises(CorruptionError, match="catalog entry"):
            _check(record, 100, crc, **kwargs)
    with pytest.raises(CorruptionError, match="catalog entry"):
        _check(record, 99, crc)
    with pytest.raises(CorruptionError, match="catalog entry"):
        _check(record, 100, crc ^ 1)


def test_zeroed_and_truncated_records() -> None:
    with pytest.raises(CorruptionError, match="magic"):
        parse_header(np.zeros(4096, np.uint8), PATH, 0)
    with pytest.raises(CorruptionError):
        parse_header(np.zeros(10, np.uint8), PATH, 0)
    record, crc = _record(b"y" * 5000)
    with pytest.raises(CorruptionError, match="truncated"):
        _check(record[:4096], 5000, crc)


def test_an_unknown_format_version_is_refused() -> None:
    record, crc = _record(b"z")
    header = bytearray(record[:60].tobytes())
    header[4:6] = struct.pack("<H", FORMAT_VERSION + 1)
    record[:60] = np.frombuffer(bytes(header), np.uint8)
    record[60:64] = np.frombuffer(struct.pack("<I", zlib.crc32(bytes(header))), np.uint8)
    with pytest.raises(CorruptionError, match="format version"):
        _check(record, 1, crc)


@pytest.mark.parametrize("size", [0, 1, 4095, 16383, 16384, 65536 + 7, 3 << 20])
def test_payload_crc32_is_zlibs_whichever_code_sums_it(
    size: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """libdeflate (where installed) and zlib give the same CRC-32, at any offset and size."""
    data = np.random.default_rng(size).integers(0, 256, size + 3, dtype=np.uint8)[3:]
    want = zlib.crc32(data.tobytes())
    assert format_module.payload_crc32(data) == want
    assert format_module.payload_crc32(data.tobytes()) == want
    aligned = aligned_empty(size)
    aligned[:] = data
    assert checksums.crc32_at(aligned, aligned.__array_interface__["data"][0]) == want
    monkeypatch.setattr(checksums, "_FAST_CRC32", None)
    assert format_module.payload_crc32(data) == want
    assert checksums.crc32_at(aligned, 0) == want  # zlib needs no address


@pytest.mark.parametrize("loop", ["compiled", "ctypes"])
def test_crc32_many_is_zlibs_for_every_row(loop: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The batched CRC-32 (numba loop or one ctypes call per row) equals zlib's per payload;
    without libdeflate it declines, and the caller sums views with zlib."""
    rows = [aligned_empty(size) for size in (4096, 1, 65536 + 7, 0, 8192)]
    for seed, row in enumerate(rows):
        row[:] = np.random.default_rng(seed).integers(0, 256, row.nbytes, dtype=np.uint8)
    addresses = np.array([row.__array_interface__["data"][0] for row in rows], np.int64)
    sizes = np.array([row.nbytes for row in rows], np.int64)
    if loop == "ctypes":
        monkeypatch.setattr(checksums, "_compiled", [None])
    got = checksums.crc32_many(addresses, sizes)
    if checksums._FAST_CRC32 is None:
        assert got is None
        return
    assert got is not None
    assert got.tolist() == [zlib.crc32(row.tobytes()) for row in rows]
    monkeypatch.setattr(checksums, "_FAST_CRC32", None)
    assert checksums.crc32_many(addresses, sizes) is None
