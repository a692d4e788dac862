"""Table, LMDB and directory sources: round trips against plain Python models, and their errors."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dataload import (
    ArrowSource,
    CorruptSampleError,
    DirectorySource,
    LmdbSource,
    ParquetSource,
    SampleIndexError,
    SampleReadError,
    ShuffledLoader,
    SourceError,
    SourceFormatError,
    read_samples,
    write_lmdb,
)

pytestmark = pytest.mark.usefixtures("no_thread_leak")
ROWS = 500


def model_rows() -> list[dict]:
    return [
        {
            "id": i,
            "x": np.float32(i / 4),
            "text": f"doc {i} " * (i % 6),
            "blob": None if i % 9 == 0 else bytes([i % 256]) * (i % 4),
            "maybe": None if i % 5 == 0 else i * 3,
        }
        for i in range(ROWS)
    ]


def model_table() -> pa.Table:
    schema = pa.schema(
        [
            ("id", pa.int64()),
            ("x", pa.float32()),
            ("text", pa.string()),
            ("blob", pa.large_binary()),
            ("maybe", pa.int32()),
        ]
    )
    return pa.Table.from_pylist(model_rows(), schema=schema)


def plain(sample: dict) -> dict:
    return {k: (v.item() if isinstance(v, np.generic) else v) for k, v in sample.items()}


def check_against_model(source, rows: list[dict]) -> None:
    picks = np.random.default_rng(0).integers(0, len(rows), 120)
    for index, sample in zip(picks.tolist(), read_samples(source, picks), strict=True):
        assert plain(sample) == {k: rows[index][k] for k in sample}, index


def test_arrow_ipc_rows_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "t.arrow"
    with pa.OSFile(str(path), "wb") as file, pa.ipc.new_file(file, model_table().schema) as w:
        w.write_table(model_table(), max_chunksize=64)
    check_against_model(ArrowSource(path), model_rows())
    check_against_model(ArrowSource(path, columns=["text", "id"]), model_rows())


def test_arrow_refuses_compressed_files_and_nested_columns(tmp_path: Path) -> None:
    table = pa.table({"v": np.arange(100)})
    options = pa.ipc.IpcWriteOptions(compression="zstd")
    out = pa.OSFile(str(tmp_path / "z.arrow"), "wb")
    with out, pa.ipc.new_file(out, table.schema, options=options) as w:
        w.write_table(table)
    with pytest.raises(SourceFormatError, match="compressed"):
        ArrowSource(tmp_path / "z.arrow")
    nested = pa.table({"l": [[1, 2], [3]]})
    with pa.OSFile(str(tmp_path / "n.arrow"), "wb") as f, pa.ipc.new_file(f, nested.schema) as w:
        w.write_table(nested)
    with pytest.raises(SourceFormatError, match="not supported"):
        ArrowSource(tmp_path / "n.arrow")
    (tmp_path / "junk.arrow").write_bytes(b"not arrow at all")
    with pytest.raises(SourceFormatError):
        ArrowSource(tmp_path / "junk.arrow")


def test_parquet_rows_round_trip_and_through_the_loader(tmp_path: Path) -> None:
    path = tmp_path / "t.parquet"
    pq.write_table(model_table(), path, row_group_size=50)
    source = ParquetSource(path)
    check_against_model(source, model_rows())
    with ShuffledLoader(source, 64, seed=1) as loader:
        ids = [int(i) for batch in loader for i in batch["id"]]
        assert sorted(ids) == list(range(ROWS))
        assert loader.stats()["bytes_read"] > 0


def test_corrupt_parquet_page_names_the_sample_and_can_be_skipped(tmp_path: Path) -> None:
    path = tmp_path / "c.parquet"
    table = pa.table({"id": np.arange(400), "v": np.arange(400) * 2.0})
    pq.write_table(table, path, row_group_size=100, write_page_checksum=True, compression="none")
    chunk = pq.ParquetFile(path).metadata.row_group(2).column(1)
    start = chunk.dictionary_page_offset if chunk.has_dictionary_page else chunk.data_page_offset
    with open(path, "r+b") as file:  # flip a byte inside row group 2's "v" data page
        file.seek(start + chunk.total_compressed_size - 5)
        byte = file.read(1)
        file.seek(-1, os.SEEK_CUR)
        file.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(CorruptSampleError, match="sample 250") as caught:
        read_samples(ParquetSource(path), [5, 250])
    assert caught.value.source == str(path)
    with ShuffledLoader(ParquetSource(path), 64, on_error="skip") as loader:
        ids = sorted(int(i) for batch in loader for i in batch["id"])
        assert ids == [i for i in range(400) if not 200 <= i < 300]
        assert loader.stats()["skipped"] == 100


def test_lmdb_round_trip_and_missing_key(tmp_path: Path) -> None:
    values = [os.urandom(i % 50) for i in range(200)]
    write_lmdb(tmp_path / "db", values)
    source = LmdbSource(tmp_path / "db")
    picks = [199, 0, 7, 7]
    assert read_samples(source, picks) == [values[i] for i in picks]
    with pytest.raises(CorruptSampleError, match="key missing"):
        read_samples(LmdbSource(tmp_path / "db", count=201), [200])
    with pytest.raises(SourceError):
        LmdbSource(tmp_path / "absent")
    (tmp_path / "empty").mkdir()  # a directory, not an LMDB environment: LMDB's own words
    with pytest.raises(SourceError, match=r"cannot open LMDB environment: .*No such file"):
        LmdbSource(tmp_path / "empty")


def test_directory_labels_round_trip_and_deleted_file(tmp_path: Path) -> None:
    model = {}
    for label in ("cat", "dog"):
        (tmp_path / label).mkdir()
        for i in range(30):
            data = os.urandom(i * 11)
            (tmp_path / label / f"{i:03d}.bin").write_bytes(data)
            model[str(tmp_path / label / f"{i:03d}.bin")] = (data, label)
    source = DirectorySource(tmp_path, labels=True, max_open_files=8)
    assert source.classes == ["cat", "dog"] and len(source) == 60
    got = read_samples(source, range(60))
    for path, (data, label) in zip(source.paths, got, strict=True):
        assert (data, source.classes[label]) == model[path]
    with ShuffledLoader(source, 16, seed=3) as loader:
        sizes = sorted(len(t) for tensors, _ in loader for t in tensors)
    assert sizes == sorted(len(d) for d, _ in model.values())
    os.remove(source.paths[5])
    with pytest.raises(SampleReadError, match="sample 5") as caught:
        read_samples(source, [4, 5])
    assert caught.value.errno == 2


def test_index_past_the_end_for_every_source_kind(tmp_path: Path) -> None:
    pq.write_table(model_table(), tmp_path / "t.parquet")
    with pytest.raises(SampleIndexError, match=f"sample {ROWS}"):
        read_samples(ParquetSource(tmp_path / "t.parquet"), [ROWS])
    write_lmdb(tmp_path / "db", [b"a"])
    with pytest.raises(SampleIndexError):
        read_samples(LmdbSource(tmp_path / "db"), [-1])


def test_parquet_row_groups_are_decoded_once_with_deep_prefetch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Concurrently prefetched batches share a row group being decoded instead of decoding it
    again; a batch cancelled mid-read (resume elsewhere) leaves no stuck in-flight group."""
    path = tmp_path / "t.parquet"
    pq.write_table(model_table(), path, row_group_size=25)  # 20 groups, every batch hits most
    decoded: list[int] = []
    original = ParquetSource._decode

    def counting(self, groups, *args):
        decoded.extend(groups)
        return original(self, groups, *args)

    monkeypatch.setattr(ParquetSource, "_decode", counting)
    with ShuffledLoader(ParquetSource(path), 32, seed=3, prefetch_batches=8) as loader:
        ids = [int(i) for batch in loader for i in batch["id"]]
    assert sorted(ids) == list(range(ROWS))
    assert sorted(decoded) == list(range(20))
    rows = model_rows()
    tiny = ParquetSource(path, cache_bytes=1)  # nearly every batch reads and decodes again
    with ShuffledLoader(tiny, 32, seed=3, prefetch_batches=8) as loader:
        for _ in range(5):
            state = loader.state_dict()
            first = next(iter(loader))
            loader.load_state_dict(state)  # cancels the batches in flight, reads mid-decode
            again = next(iter(loader))
            assert again["id"].tolist() == first["id"].tolist()
            assert again["text"] == [rows[i]["text"] for i in first["id"].tolist()]
            assert again["maybe"] == [rows[i]["maybe"] for i in first["id"].tolist()]
            assert again["x"].tolist() == [rows[i]["x"] for i in first["id"].tolist()]


def test_sample_batch_samples_matches_sample() -> None:
    from dataload.source import SampleBatch

    data = np.arange(40, dtype=np.uint8)
    indices = np.arange(5, dtype=np.int64)
    packed = SampleBatch(indices, data, np.arange(0, 40, 8), np.full(5, 8), packed=True)
    gaps = SampleBatch(indices, data, np.array([0, 9, 17, 20, 33]), np.array([3, 8, 0, 5, 7]))
    labelled = SampleBatch(indices, data, np.arange(0, 40, 8), np.full(5, 8), packed=True)
    labelled.labels = np.array([4, 3, 2, 1, 0])
    table = SampleBatch(indices, columns={"a": np.arange(5) * 2, "b": list("vwxyz")})
    for batch in (packed, gaps, labelled, table):
        for positions in (None, [0, 2, 3], [4, 1]):
            expected = [batch.sample(j) for j in (positions or range(5))]
            got = batch.samples(positions)
            if batch.labels is not None:
                assert [(v.tolist(), label) for v, label in got] == [
                    (v.tolist(), label) for v, label in expected
                ]
            elif batch.columns is not None:
                assert got == expected
            else:
                assert [v.tolist() for v in got] == [v.tolist() for v in expected]
