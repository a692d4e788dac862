"""load_vectors on real files: .npy, TEXMEX .fvecs/.bvecs/.ivecs, Arrow IPC and Parquet."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.feather as feather
import pyarrow.parquet as pq
import pytest

from vectordb.errors import InvalidVectorsError
from vectordb.vectors_input import load_vectors, write_bvecs, write_fvecs, write_ivecs

RNG = np.random.default_rng(7)
FLOATS = RNG.standard_normal((50, 8)).astype(np.float32)
BYTES = RNG.integers(0, 256, (50, 8)).astype(np.uint8)
INTS = RNG.integers(-(2**31), 2**31, (50, 8)).astype(np.int32)
IDS = RNG.permutation(1000)[:50].astype(np.int64)


@pytest.mark.parametrize("mmap", [True, False])
@pytest.mark.parametrize(
    ("suffix", "writer", "vectors"),
    [
        (".fvecs", write_fvecs, FLOATS),
        (".bvecs", write_bvecs, BYTES),
        (".ivecs", write_ivecs, INTS),
    ],
)
def test_texmex_round_trip(tmp_path: Path, suffix: str, writer, vectors, mmap: bool) -> None:
    path = tmp_path / f"v{suffix}"
    writer(path, vectors)
    assert path.stat().st_size == len(vectors) * (4 + vectors.shape[1] * vectors.itemsize)
    ids, out = load_vectors(str(path), mmap=mmap)
    assert ids is None and out.dtype == vectors.dtype and isinstance(out, np.memmap) is mmap
    np.testing.assert_array_equal(out, vectors)


def test_texmex_truncated_file_names_path_and_offset(tmp_path: Path) -> None:
    path = tmp_path / "cut.fvecs"
    write_fvecs(path, FLOATS[:3])  # rows of 4 + 8 * 4 = 36 bytes
    path.write_bytes(path.read_bytes()[:-5])
    with pytest.raises(InvalidVectorsError, match=r"cut.fvecs: truncated.*at byte offset 72"):
        load_vectors(path)
    path.write_bytes(path.read_bytes()[:20])  # not even one row
    with pytest.raises(InvalidVectorsError, match=r"truncated.*byte offset 0"):
        load_vectors(path)


def test_texmex_ragged_file_names_path_and_offset(tmp_path: Path) -> None:
    first, second = tmp_path / "a.fvecs", tmp_path / "b.fvecs"
    write_fvecs(first, np.ones((2, 3)))  # 2 rows of 16 bytes
    write_fvecs(second, np.ones((1, 7)))  # 1 row of 32 bytes: 64 bytes in all, 4 whole rows
    ragged = tmp_path / "ragged.fvecs"
    ragged.write_bytes(first.read_bytes() + second.read_bytes())
    with pytest.raises(InvalidVectorsError, match=r"ragged.fvecs: ragged.*byte offset 32.*dim.*7"):
        load_vectors(ragged, mmap=False)


def test_texmex_bad_header_and_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "neg.bvecs"
    path.write_bytes(np.array([-3, 0], dtype="<i4").tobytes())
    with pytest.raises(InvalidVectorsError, match=r"neg.bvecs: bad dimension -3.*offset 0"):
        load_vectors(path)
    (tmp_path / "empty.fvecs").write_bytes(b"")
    assert load_vectors(tmp_path / "empty.fvecs")[1].shape == (0, 0)


def test_texmex_writers_refuse_inexact_values(tmp_path: Path) -> None:
    with pytest.raises(InvalidVectorsError, match=r"not exactly representable as uint8"):
        write_bvecs(tmp_path / "v.bvecs", np.array([[1, 256]]))
    with pytest.raises(InvalidVectorsError, match=r"2-D \[n, dim\]"):
        write_fvecs(tmp_path / "v.fvecs", np.ones(3))


@pytest.mark.parametrize("mmap", [True, False])
def test_npy_round_trip(tmp_path: Path, mmap: bool) -> None:
    np.save(tmp_path / "v.npy", FLOATS)
    ids, out = load_vectors(tmp_path / "v.npy", mmap=mmap)
    assert ids is None and isinstance(out, np.memmap) is mmap
    np.testing.assert_array_equal(out, FLOATS)


def test_npy_errors(tmp_path: Path) -> None:
    np.save(tmp_path / "objects.npy", np.array([[1, None]], dtype=object))
    with pytest.raises(InvalidVectorsError, match=r"objects.npy: not a readable .npy array"):
        load_vectors(tmp_path / "objects.npy", mmap=False)
    (tmp_path / "junk.npy").write_bytes(b"not numpy at all")
    with pytest.raises(InvalidVectorsError, match=r"junk.npy: not a readable"):
        load_vectors(tmp_path / "junk.npy")
    np.save(tmp_path / "flat.npy", np.ones(4))
    with pytest.raises(InvalidVectorsError, match=r"flat.npy: vectors must be 2-D"):
        load_vectors(tmp_path / "flat.npy")


def _table(fixed: bool, with_ids: bool) -> pa.Table:
    values = pa.array(FLOATS.ravel())
    size = FLOATS.shape[1]
    offsets = pa.array(np.arange(0, FLOATS.size + 1, size, dtype=np.int32))
    emb = (
        pa.FixedSizeListArray.from_arrays(values, size)
        if fixed
        else pa.ListArray.from_arrays(offsets, values)
    )
    columns = {"title": pa.array([f"doc {i}" for i in range(len(FLOATS))]), "emb": emb}
    return pa.table({**columns, **({"doc_id": pa.array(IDS)} if with_ids else {})})


def _write(table: pa.Table, path: Path) -> None:
    if path.suffix == ".parquet":
        pq.write_table(table, path, row_group_size=16)  # several row groups -> several chunks
    elif path.name.endswith(".stream.arrow"):
        with pa.ipc.new_stream(path, table.schema) as writer:
            writer.write_table(table, max_chunksize=16)
    else:
        feather.write_feather(table, path, chunksize=16, compression="uncompressed")


@pytest.mark.parametrize("name", ["v.arrow", "v.feather", "v.stream.arrow", "v.parquet", None])
@pytest.mark.parametrize("fixed", [True, False])
@pytest.mark.parametrize("with_ids", [True, False])
def test_table_round_trip(tmp_path: Path, name: str | None, fixed: bool, with_ids: bool) -> None:
    table = _table(fixed, with_ids)
    source: object = table
    if name is not None:
        _write(table, tmp_path / name)
        source = tmp_path / name
    id_column = "doc_id" if with_ids else None
    ids, out = load_vectors(source, id_column=id_column)  # the vector column is found alone
    np.testing.assert_array_equal(out, FLOATS)
    assert out.shape == FLOATS.shape and out.dtype == np.float32
    assert (ids is None) if not with_ids else ids.tolist() == IDS.tolist()
    np.testing.assert_array_equal(load_vectors(source, column="emb", mmap=False)[1], FLOATS)


def test_sliced_table_keeps_its_rows() -> None:
    _, out = load_vectors(_table(fixed=False, with_ids=False).slice(5, 10))
    np.testing.assert_array_equal(out, FLOATS[5:15])


def test_table_column_errors(tmp_path: Path) -> None:
    table = _table(fixed=True, with_ids=True)
    two = table.append_column("emb2", table.column("emb"))
    with pytest.raises(InvalidVectorsError, match=r"several columns.*column=.*\['emb', 'emb2'\]"):
        load_vectors(two)
    with pytest.raises(InvalidVectorsError, match=r"no list-of-numbers column.*'title': 'string'"):
        load_vectors(table.drop_columns(["emb"]))
    with pytest.raises(InvalidVectorsError, match=r"no column \['vec'\]; columns: \['title'"):
        load_vectors(table, column="vec")
    with pytest.raises(InvalidVectorsError, match=r"column 'title' is string, not a list"):
        load_vectors(table, column="title")
    with pytest.raises(InvalidVectorsError, match=r"id column 'title' must be non-null integers"):
        load_vectors(table, id_column="title")
    pq.write_table(table, tmp_path / "t.parquet")
    with pytest.raises(InvalidVectorsError, match=r"no column \['nope'\]"):
        load_vectors(tmp_path / "t.parquet", id_column="nope")


def test_variable_length_and_null_vectors_are_refused(tmp_path: Path) -> None:
    ragged = pa.table({"emb": pa.array([[1.0, 2.0], [3.0, 4.0], [5.0]], pa.list_(pa.float32()))})
    pq.write_table(ragged, tmp_path / "ragged.parquet")
    with pytest.raises(InvalidVectorsError, match=r"variable-length lists: row 2 has 1 values"):
        load_vectors(tmp_path / "ragged.parquet")
    nulls = pa.table({"emb": pa.array([[1.0, 2.0], None], pa.list_(pa.float32(), 2))})
    with pytest.raises(InvalidVectorsError, match=r"null vector at row 1"):
        load_vectors(nulls)
    inner = pa.table({"emb": pa.array([[1.0, None]], pa.list_(pa.float32(), 2))})
    with pytest.raises(InvalidVectorsError, match=r"null values inside its vectors"):
        load_vectors(inner)


def test_unreadable_table_files(tmp_path: Path) -> None:
    for name in ("junk.arrow", "junk.parquet"):
        (tmp_path / name).write_bytes(b"definitely not arrow" * 10)
        with pytest.raises(InvalidVectorsError, match=rf"{name}: not a"):
            load_vectors(tmp_path / name)
