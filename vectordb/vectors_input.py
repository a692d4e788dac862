"""Vectors on their way into an index: loading, checking, batching.

``load_vectors`` reads numpy arrays, ``.npy``, TEXMEX ``.fvecs``/``.bvecs``/``.ivecs``, Arrow IPC
and Parquet (memory-mapped where the format allows). ``validate_batch`` checks one batch against
the index configuration and converts it; the index calls it before writing anything, so bad input
(wrong shape, dimension or dtype, NaN/inf, unrepresentable values, bad or duplicate ids) is refused
with the index unchanged. ``iter_batches`` slices a large input with an optional progress bar.

Thread-safety: pure functions, no shared state.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import ArrayLike
from tqdm import tqdm

from tiers.io import InvalidArgumentError, map_os_errors
from vectordb.config import IndexConfig
from vectordb.errors import DuplicateIdError, InvalidVectorsError
from vectordb.vector_files import (
    TEXMEX_DTYPES,
    read_ipc,
    read_parquet,
    read_texmex,
    table_vectors,
    write_bvecs,
    write_fvecs,
    write_ivecs,
)

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = [
    "MAX_ID",
    "iter_batches",
    "load_vectors",
    "validate_batch",
    "write_bvecs",
    "write_fvecs",
    "write_ivecs",
]

MAX_ID = 2**62  # ids above this are refused: headroom in int64 for internal sentinels
_SHOWN_DUPLICATES = 10
# Values are scanned this many elements at a time, so checking a memory-mapped input of any size
# needs only a few MiB of temporaries.
_SCAN_ELEMENTS = 1 << 20
_TABLE_SUFFIXES = (".arrow", ".feather", ".parquet")


def validate_batch(
    ids: ArrayLike | None, vectors: ArrayLike, config: IndexConfig, *, first_id: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """(ids int64 [n], vectors [n, dim] C-contiguous in ``config.numpy_dtype``), or a typed error.

    ``ids=None`` numbers the rows ``first_id, first_id + 1, ...``. A single vector of length
    ``dim`` is taken as a batch of one; an empty batch gives empty arrays. Input that is already
    C-contiguous in the target dtype is returned without a copy (it may be a read-only memmap).
    Raises InvalidVectorsError or DuplicateIdError; nothing is modified either way.
    """
    matrix = _as_matrix(vectors, config.dim)
    checked_ids = _check_ids(ids, len(matrix), first_id)
    return checked_ids, _convert(matrix, config.numpy_dtype)


def _as_array(values: ArrayLike, what: str) -> np.ndarray:
    try:
        return np.asarray(values)
    except (ValueError, TypeError) as exc:  # ragged nested lists and the like
        raise InvalidVectorsError(f"{what} cannot be read as an array: {exc}") from None


def _as_matrix(vectors: ArrayLike, dim: int) -> np.ndarray:
    array = _as_array(vectors, "vectors")
    if array.dtype.kind not in "iuf":
        raise InvalidVectorsError(f"vectors must be int, uint or float, got dtype {array.dtype}")
    if array.ndim == 1 and len(array) in (0, dim):
        return array.reshape(-1, dim)  # one vector, or an empty list
    if array.ndim == 1:
        raise InvalidVectorsError(
            f"a single vector must have length {dim} (the index dimension), got {len(array)}"
        )
    if array.ndim != 2:
        raise InvalidVectorsError(f"vectors must be 2-D [n, {dim}], got shape {array.shape}")
    if len(array) == 0:
        return array.reshape(0, dim)
    if array.shape[1] != dim:
        raise InvalidVectorsError(f"vectors have dimension {array.shape[1]}, expected {dim}")
    return array


def _check_ids(ids: ArrayLike | None, count: int, first_id: int) -> np.ndarray:
    if ids is None:
        if isinstance(first_id, bool) or not isinstance(first_id, int | np.integer):
            raise InvalidVectorsError(f"first_id must be an integer, got {first_id!r}")
        if first_id < 0 or first_id + count - 1 > MAX_ID:
            raise InvalidVectorsError(
                f"first_id {first_id} with {count} vectors gives ids outside 0..2**62"
            )
        return np.arange(first_id, first_id + count, dtype=np.int64)
    array = _as_array(ids, "ids")
    if array.ndim != 1:
        raise InvalidVectorsError(f"ids must be 1-D, got shape {array.shape}")
    if len(array) != count:
        raise InvalidVectorsError(f"got {len(array)} ids for {count} vectors")
    if count == 0:  # `[]` arrives as float64; nothing in it can be wrong
        return np.empty(0, dtype=np.int64)
    if array.dtype.kind not in "iu":
        raise InvalidVectorsError(f"ids must be integers, got dtype {array.dtype}")
    _check_id_range(array)
    out = np.ascontiguousarray(array, dtype=np.int64)
    _check_unique(out)
    return out


def _check_id_range(ids: np.ndarray) -> None:
    if ids.min() < 0:
        at = int(np.argmax(ids < 0))
        raise InvalidVectorsError(f"id {ids[at]} at position {at} is negative")
    if int(ids.max()) > MAX_ID:  # only int64/uint64 can get here, so the comparison is exact
        at = int(np.argmax(ids > ids.dtype.type(MAX_ID)))
        raise InvalidVectorsError(f"id {ids[at]} at position {at} exceeds the maximum id 2**62")


def _check_unique(ids: np.ndarray) -> None:
    ordered = np.sort(ids)
    repeated = np.unique(ordered[1:][ordered[1:] == ordered[:-1]])
    if repeated.size:
        shown = [int(i) for i in repeated[:_SHOWN_DUPLICATES]]
        more = " ..." if repeated.size > _SHOWN_DUPLICATES else ""
        raise DuplicateIdError(
            f"{repeated.size} id(s) appear more than once in the batch: {shown}{more}", shown
        )


def _convert(matrix: np.ndarray, target: np.dtype) -> np.ndarray:
    if matrix.dtype.kind == "f":
        row = _first_bad_row(matrix, _nonfinite_rows)
        if row is not None:
            raise InvalidVectorsError(f"vectors contain NaN or inf, first at row {row}")
    if target == np.uint8:
        row = None if matrix.dtype == np.uint8 else _first_bad_row(matrix, _not_uint8_rows)
        if row is not None:
            raise InvalidVectorsError(
                f"row {row} has values not representable as uint8 (integers 0..255): "
                f"{matrix[row][_not_uint8(matrix[row])][:5].tolist()}"
            )
        return np.ascontiguousarray(matrix, dtype=np.uint8)
    with np.errstate(over="ignore"):  # overflow is reported below, with its row
        out = np.ascontiguousarray(matrix, dtype=target)
    narrower = matrix.dtype.kind in "iu" or matrix.dtype.itemsize > target.itemsize
    if out.dtype.kind == "f" and narrower:  # e.g. 1e6 or int 70000 -> float16 inf
        row = _first_bad_row(out, _nonfinite_rows)
        if row is not None:
            raise InvalidVectorsError(f"row {row} has values outside the {target} range")
    return out


def _first_bad_row(matrix: np.ndarray, bad_rows: Callable[[np.ndarray], np.ndarray]) -> int | None:
    step = max(1, _SCAN_ELEMENTS // max(1, matrix.shape[1]))
    for start in range(0, len(matrix), step):
        bad = np.flatnonzero(bad_rows(matrix[start : start + step]))
        if bad.size:
            return start + int(bad[0])
    return None


def _nonfinite_rows(chunk: np.ndarray) -> np.ndarray:
    return ~np.isfinite(chunk).all(axis=1)


def _not_uint8(values: np.ndarray) -> np.ndarray:
    outside = (values < 0) | (values > 255)
    if values.dtype.kind == "f":
        outside |= values != np.floor(values)
    return outside


def _not_uint8_rows(chunk: np.ndarray) -> np.ndarray:
    return np.asarray(_not_uint8(chunk).any(axis=1))


def load_vectors(
    source: str | os.PathLike[str] | np.ndarray | pa.Table,
    *,
    column: str | None = None,
    id_column: str | None = None,
    mmap: bool = True,
) -> tuple[np.ndarray | None, np.ndarray]:
    """(ids or None, vectors [n, dim]) from an array, a table or a file, chosen by its extension.

    Files: ``.npy``, ``.fvecs``/``.bvecs``/``.ivecs`` (TEXMEX), ``.arrow``/``.feather`` (Arrow
    IPC) and ``.parquet``; ``column``/``id_column`` pick columns of a table (by default the only
    list-of-numbers column, and no ids). Values are not checked here: see ``validate_batch``.
    Raises InvalidVectorsError for unreadable input, FileMissingError for a missing file.
    """
    if isinstance(source, np.ndarray):
        _no_columns(column, id_column, "a numpy array")
        return None, _two_d(source, "the array")
    if not isinstance(source, str | os.PathLike):
        return table_vectors(_as_table(source), column, id_column)
    path = os.fspath(source)
    suffix = Path(path).suffix.lower()
    if suffix not in (".npy", *TEXMEX_DTYPES, *_TABLE_SUFFIXES):
        supported = ", ".join((".npy", *TEXMEX_DTYPES, *_TABLE_SUFFIXES))
        raise InvalidVectorsError(f"{path}: unknown extension {suffix!r}; supported: {supported}")
    with map_os_errors(path):
        os.stat(path)  # a missing file is FileMissingError whatever the format
    if suffix == ".parquet":
        return table_vectors(read_parquet(path, column, id_column, mmap=mmap), column, id_column)
    if suffix in _TABLE_SUFFIXES:
        return table_vectors(read_ipc(path, mmap=mmap), column, id_column)
    _no_columns(column, id_column, f"a {suffix} file")
    if suffix == ".npy":
        return None, _two_d(_read_npy(path, mmap), path)
    return None, read_texmex(path, TEXMEX_DTYPES[suffix], mmap=mmap)


def _as_table(source: object) -> pa.Table:
    import pyarrow as pa  # imported only when needed: it is slow to import

    if not isinstance(source, pa.Table):
        raise InvalidVectorsError(
            f"cannot load vectors from a {type(source).__name__}; pass a path, a numpy array "
            "or a pyarrow.Table"
        )
    return source


def _no_columns(column: str | None, id_column: str | None, what: str) -> None:
    if column is not None or id_column is not None:
        raise InvalidVectorsError(f"column/id_column apply to Arrow and Parquet, not {what}")


def _two_d(array: np.ndarray, what: str) -> np.ndarray:
    if array.ndim != 2:
        raise InvalidVectorsError(f"{what}: vectors must be 2-D [n, dim], got shape {array.shape}")
    return array


def _read_npy(path: str, mmap: bool) -> np.ndarray:
    with map_os_errors(path):
        try:
            return np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
        except ValueError as exc:  # a bad header, or pickled objects (never unpickled)
            raise InvalidVectorsError(f"{path}: not a readable .npy array: {exc}") from None


def iter_batches(
    ids: np.ndarray | None,
    vectors: np.ndarray,
    batch_rows: int,
    *,
    progress: bool = False,
    desc: str = "vectors",
) -> Iterator[tuple[np.ndarray | None, np.ndarray]]:
    """Consecutive (ids, vectors) slices of ``batch_rows`` rows (views, no copies).

    With ``progress=True`` a tqdm bar on stderr counts the rows handed out.
    """
    if isinstance(batch_rows, bool) or not isinstance(batch_rows, int | np.integer):
        raise InvalidArgumentError(f"batch_rows must be a positive integer, got {batch_rows!r}")
    if batch_rows <= 0:
        raise InvalidArgumentError(f"batch_rows must be a positive integer, got {batch_rows!r}")
    if ids is not None and len(ids) != len(vectors):
        raise InvalidVectorsError(f"got {len(ids)} ids for {len(vectors)} vectors")
    total = len(vectors)
    with tqdm(
        total=total, desc=desc, unit="vec", unit_scale=True, file=sys.stderr, disable=not progress
    ) as bar:
        for start in range(0, total, batch_rows):
            stop = min(start + batch_rows, total)
            yield (None if ids is None else ids[start:stop]), vectors[start:stop]
            bar.update(stop - start)
