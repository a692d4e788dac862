"""Record files: writer/reader round trips against a plain list model, and every refusal."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dataload import (
    CorruptSampleError,
    FixedSizeSource,
    RecordFileSource,
    RecordWriter,
    SampleIndexError,
    SourceFormatError,
    read_samples,
    write_records,
)
from tiers.io.errors import FileMissingError, InvalidArgumentError


@given(
    records=st.lists(st.binary(min_size=0, max_size=300), min_size=1, max_size=40),
    alignment=st.sampled_from([1, 8, 4096]),
)
@settings(max_examples=25, deadline=None)
def test_variable_records_round_trip(
    tmp_path_factory, records: list[bytes], alignment: int
) -> None:
    path = tmp_path_factory.mktemp("rec") / "v.tkr"
    write_records(path, records, alignment_bytes=alignment)
    source = RecordFileSource(path, verify=True)
    assert len(source) == len(records)
    picks = np.random.default_rng(len(records)).integers(0, len(records), 50)
    assert read_samples(source, picks) == [records[i] for i in picks]


@pytest.mark.parametrize("direct", [False, True])
@pytest.mark.parametrize("alignment", [1, 4096])
def test_fixed_records_round_trip_buffered_and_direct(
    tmp_path: Path, direct: bool, alignment: int
) -> None:
    rng = np.random.default_rng(0)
    records = [rng.bytes(100) for _ in range(64)]
    write_records(tmp_path / "f.tkr", records, record_size_bytes=100, alignment_bytes=alignment)
    source = RecordFileSource(tmp_path / "f.tkr", direct=direct, verify=True)
    assert source.sample_size_bytes == 100
    picks = [63, 0, 5, 5, 17]
    assert read_samples(source, picks) == [records[i] for i in picks]


def test_direct_variable_records_read_the_aligned_span(tmp_path: Path) -> None:
    records = [bytes([i]) * (i * 37 + 1) for i in range(50)]
    write_records(tmp_path / "v.tkr", records)  # packed: nothing is 4 KiB aligned
    source = RecordFileSource(tmp_path / "v.tkr", direct=True, verify=True)
    assert read_samples(source, [49, 3, 20]) == [records[49], records[3], records[20]]


def test_raw_fixed_size_file(tmp_path: Path) -> None:
    (tmp_path / "raw.bin").write_bytes(bytes(range(256)) * 4)
    source = FixedSizeSource(tmp_path / "raw.bin", 64, header_bytes=0)
    assert len(source) == 16
    assert read_samples(source, [1]) == [bytes(range(64, 128))]


def test_writer_refuses_a_record_of_the_wrong_size(tmp_path: Path) -> None:
    with RecordWriter(tmp_path / "f.tkr", record_size_bytes=8) as writer:
        writer.write(b"12345678")
        with pytest.raises(InvalidArgumentError, match="has 3 bytes"):
            writer.write(b"123")


def test_missing_file_is_typed(tmp_path: Path) -> None:
    with pytest.raises(FileMissingError):
        RecordFileSource(tmp_path / "nope.tkr")
    with pytest.raises(FileMissingError):
        FixedSizeSource(tmp_path / "nope.bin", 16)


def test_truncated_files_are_refused_naming_the_source(tmp_path: Path) -> None:
    path = write_records(tmp_path / "t.tkr", [b"x" * 50] * 10)
    os.truncate(path, path.stat().st_size - 10)
    with pytest.raises(SourceFormatError, match="truncated") as caught:
        RecordFileSource(path)
    assert caught.value.source == str(path)
    (tmp_path / "raw.bin").write_bytes(b"\0" * 100)
    with pytest.raises(SourceFormatError, match="truncated"):
        FixedSizeSource(tmp_path / "raw.bin", 16)


def test_unfinished_writer_and_flipped_header_are_refused(tmp_path: Path) -> None:
    writer = RecordWriter(tmp_path / "u.tkr")
    writer.write(b"abc")
    writer._file.flush()  # a crash before close: the header is still zeros
    with pytest.raises(SourceFormatError, match="not a tierkit record file"):
        RecordFileSource(tmp_path / "u.tkr")
    writer.close()
    raw = bytearray((tmp_path / "u.tkr").read_bytes())
    raw[20] ^= 1  # inside the header's count
    (tmp_path / "u.tkr").write_bytes(bytes(raw))
    with pytest.raises(SourceFormatError, match="header checksum"):
        RecordFileSource(tmp_path / "u.tkr")


def test_flipped_record_byte_fails_its_checksum_naming_the_sample(tmp_path: Path) -> None:
    path = write_records(tmp_path / "c.tkr", [b"a" * 100, b"b" * 100, b"c" * 100])
    source = RecordFileSource(path, verify=True)
    with open(path, "r+b") as file:  # flip one byte of record 1
        offset = int(source._offsets[1]) + 10  # type: ignore[index]
        file.seek(offset)
        file.write(b"B")
    with pytest.raises(CorruptSampleError, match="sample 1: checksum") as caught:
        read_samples(RecordFileSource(path, verify=True), [0, 1, 2])
    assert caught.value.sample_index == 1 and caught.value.source == str(path)
    assert read_samples(RecordFileSource(path), [1]) == [b"b" * 10 + b"B" + b"b" * 89]


def test_index_past_the_end_names_the_sample(tmp_path: Path) -> None:
    source = RecordFileSource(write_records(tmp_path / "i.tkr", [b"x"] * 5))
    with pytest.raises(SampleIndexError, match="sample 5") as caught:
        read_samples(source, [0, 5])
    assert isinstance(caught.value, IndexError)


def test_file_shrunk_after_open_is_a_truncated_sample(tmp_path: Path) -> None:
    path = tmp_path / "raw.bin"
    path.write_bytes(b"\1" * 64)
    source = FixedSizeSource(path, 16)
    os.truncate(path, 40)  # records 2 and 3 are now short or gone
    with pytest.raises(CorruptSampleError, match="sample 2: truncated"):
        read_samples(source, [0, 2, 3])
