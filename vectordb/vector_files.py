"""Readers and writers for vector files: TEXMEX ``.fvecs``/``.bvecs``/``.ivecs`` and Arrow tables.

TEXMEX (the format of the SIFT/GIST/BIGANN benchmark sets) stores each row as a little-endian
int32 dimension followed by that many values: float32 (``.fvecs``), uint8 (``.bvecs``) or
int32 (``.ivecs``, used for ground truth). The file has no header, so a row is only known to be
well formed by checking that every row's dimension word agrees with the first one.

Arrow IPC and Parquet vectors live in a ``fixed_size_list`` or ``list`` column of numbers.

These functions only read and reshape; whether the values suit an index is decided by
``vectors_input.validate_batch``. Thread-safety: pure functions, no shared state.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import numpy as np

from tiers.io import map_os_errors
from vectordb.errors import InvalidVectorsError

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = [
    "TEXMEX_DTYPES",
    "read_ipc",
    "read_parquet",
    "read_texmex",
    "table_vectors",
    "write_bvecs",
    "write_fvecs",
    "write_ivecs",
]

TEXMEX_DTYPES: dict[str, np.dtype[Any]] = {
    ".fvecs": np.dtype("<f4"),
    ".bvecs": np.dtype("u1"),
    ".ivecs": np.dtype("<i4"),
}


def _row_dtype(dim: int, values: np.dtype[Any]) -> np.dtype[Any]:
    # Packed (no alignment padding): exactly the on-disk row, so the file maps onto it directly.
    return np.dtype([("dim", "<i4"), ("vec", values, (dim,))])


def read_texmex(path: str, values: np.dtype[Any], *, mmap: bool = True) -> np.ndarray:
    """The [n, dim] vectors of a TEXMEX file: a strided view of its rows, memory-mapped if asked."""
    with map_os_errors(path):
        size = os.path.getsize(path)
        if size == 0:
            return np.empty((0, 0), dtype=values)
        dim = int(np.fromfile(path, dtype="<i4", count=1)[0]) if size >= 4 else 0
        if dim <= 0:
            raise InvalidVectorsError(f"{path}: bad dimension {dim} in the row at byte offset 0")
        row_bytes = 4 + dim * values.itemsize
        count = size // row_bytes
        if count == 0:  # checked first: a garbage dimension word must not size a numpy dtype
            _truncated(path, size, row_bytes, dim)
        rows = _row_dtype(dim, values)
        if mmap:
            table = np.memmap(path, dtype=rows, mode="r", shape=(count,))
        else:
            table = np.fromfile(path, dtype=rows, count=count)  # type: ignore[assignment]
    # Whole rows are checked before the tail, so a ragged file is reported where it goes wrong.
    _check_dims(path, table["dim"], dim, row_bytes)
    if size % row_bytes:
        _truncated(path, size, row_bytes, dim)
    return table["vec"]


def _truncated(path: str, size: int, row_bytes: int, dim: int) -> None:
    raise InvalidVectorsError(
        f"{path}: truncated: {size} bytes is not a whole number of {row_bytes}-byte rows "
        f"(dim {dim}); a partial row starts at byte offset {size - size % row_bytes}"
    )


def _check_dims(path: str, dims: np.ndarray, dim: int, row_bytes: int) -> None:
    # A ragged file whose size happens to divide evenly still shows up as a dimension word that
    # differs from the first; one vectorised comparison finds the first such row.
    bad = np.flatnonzero(dims != dim)
    if bad.size:
        row = int(bad[0])
        raise InvalidVectorsError(
            f"{path}: ragged: the row at byte offset {row * row_bytes} (row {row}) has dimension "
            f"{int(dims[row])}, expected {dim} like the first row"
        )


def _write_texmex(path: str | os.PathLike[str], vectors: np.ndarray, values: np.dtype[Any]) -> None:
    array = np.asarray(vectors)
    if array.ndim != 2 or array.shape[1] == 0:
        raise InvalidVectorsError(f"vectors to write must be 2-D [n, dim], got shape {array.shape}")
    with np.errstate(all="ignore"):
        converted = array.astype(values)
        exact = converted.dtype.kind == "f" or np.array_equal(converted, array)
    if not exact:  # never write silently wrapped or truncated values
        raise InvalidVectorsError(f"vectors are not exactly representable as {values}")
    rows = np.empty(len(array), dtype=_row_dtype(array.shape[1], values))
    rows["dim"] = array.shape[1]
    rows["vec"] = converted
    with map_os_errors(os.fspath(path)):
        rows.tofile(path)


def write_fvecs(path: str | os.PathLike[str], vectors: np.ndarray) -> None:
    """Write [n, dim] vectors as float32 ``.fvecs``."""
    _write_texmex(path, vectors, TEXMEX_DTYPES[".fvecs"])


def write_bvecs(path: str | os.PathLike[str], vectors: np.ndarray) -> None:
    """Write [n, dim] integer vectors in 0..255 as ``.bvecs``."""
    _write_texmex(path, vectors, TEXMEX_DTYPES[".bvecs"])


def write_ivecs(path: str | os.PathLike[str], vectors: np.ndarray) -> None:
    """Write [n, dim] int32 vectors (e.g. ground-truth neighbour ids) as ``.ivecs``."""
    _write_texmex(path, vectors, TEXMEX_DTYPES[".ivecs"])


def read_ipc(path: str, *, mmap: bool = True) -> pa.Table:
    """An Arrow IPC file (``.arrow``/``.feather`` v2) or IPC stream, memory-mapped if asked."""
    import pyarrow as pa
    from pyarrow import ipc

    with map_os_errors(path):
        source = pa.memory_map(path) if mmap else pa.OSFile(path)
        with source:
            try:
                return ipc.open_file(source).read_all()
            except pa.ArrowInvalid:
                pass  # not the file format: ".arrow" is also used for streams (e.g. HF datasets)
            source.seek(0)
            try:
                return ipc.open_stream(source).read_all()
            except pa.ArrowInvalid as exc:
                raise InvalidVectorsError(
                    f"{path}: not an Arrow IPC file or stream: {exc}"
                ) from None


def read_parquet(path: str, column: str | None, id_column: str | None, *, mmap: bool) -> pa.Table:
    """The vector (and id) columns of a Parquet file; other columns are never decoded."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    with map_os_errors(path):
        try:
            schema = pq.read_schema(path, memory_map=mmap)
            wanted = [_pick_column(schema, column), *([id_column] if id_column else [])]
            _require_columns(schema, wanted)
            return pq.read_table(path, columns=wanted, memory_map=mmap)
        except pa.ArrowInvalid as exc:
            raise InvalidVectorsError(f"{path}: not a readable Parquet file: {exc}") from None


def table_vectors(
    table: pa.Table, column: str | None = None, id_column: str | None = None
) -> tuple[np.ndarray | None, np.ndarray]:
    """(ids or None, [n, dim] vectors) from a table's list column and optional integer column."""
    name = _pick_column(table.schema, column)
    _require_columns(table.schema, [name, *([id_column] if id_column else [])])
    vectors = _list_column(name, table.column(name).combine_chunks())
    ids = _id_column(id_column, table.column(id_column)) if id_column else None
    return ids, vectors


def _is_vector_type(kind: pa.DataType) -> bool:
    import pyarrow as pa

    lists = pa.types.is_fixed_size_list(kind) or pa.types.is_list(kind)
    lists = lists or pa.types.is_large_list(kind)
    return lists and (pa.types.is_floating(kind.value_type) or pa.types.is_integer(kind.value_type))


def _pick_column(schema: pa.Schema, column: str | None) -> str:
    if column is not None:
        return column
    candidates = [field.name for field in schema if _is_vector_type(field.type)]
    if len(candidates) == 1:
        return candidates[0]
    if not candidates:
        columns = {field.name: str(field.type) for field in schema}
        raise InvalidVectorsError(f"no list-of-numbers column holds vectors; columns: {columns}")
    raise InvalidVectorsError(f"several columns could hold vectors, pass column=: {candidates}")


def _require_columns(schema: pa.Schema, names: list[str]) -> None:
    missing = [name for name in names if name not in schema.names]
    if missing:
        raise InvalidVectorsError(f"no column {missing}; columns: {schema.names}")


def _list_column(name: str, array: pa.Array) -> np.ndarray:
    import pyarrow as pa
    import pyarrow.compute as pc

    if not _is_vector_type(array.type):
        raise InvalidVectorsError(f"column {name!r} is {array.type}, not a list of numbers")
    if array.null_count:
        row = int(np.flatnonzero(array.is_null().to_numpy(zero_copy_only=False))[0])
        raise InvalidVectorsError(f"column {name!r} has a null vector at row {row}")
    if pa.types.is_fixed_size_list(array.type):
        dim = array.type.list_size
    else:
        lengths = pc.list_value_length(array).to_numpy(zero_copy_only=False)
        ragged = np.flatnonzero(lengths != lengths[0]) if len(lengths) else lengths
        if ragged.size:
            row = int(ragged[0])
            raise InvalidVectorsError(
                f"column {name!r} holds variable-length lists: row {row} has {lengths[row]} "
                f"values, row 0 has {lengths[0]}"
            )
        dim = int(lengths[0]) if len(lengths) else 0
    values = array.flatten()  # respects slicing offsets, unlike .values
    if values.null_count:
        raise InvalidVectorsError(f"column {name!r} has null values inside its vectors")
    return values.to_numpy(zero_copy_only=False).reshape(len(array), dim)


def _id_column(name: str, column: pa.ChunkedArray) -> np.ndarray:
    import pyarrow as pa

    if not pa.types.is_integer(column.type) or column.null_count:
        nulls = f" with {column.null_count} nulls" if column.null_count else ""
        raise InvalidVectorsError(
            f"id column {name!r} must be non-null integers, is {column.type}{nulls}"
        )
    return column.to_numpy()
