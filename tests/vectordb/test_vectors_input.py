"""validate_batch, iter_batches and load_vectors' dispatch (file formats: test_vector_files)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from tiers.io.errors import FileMissingError, InvalidArgumentError
from vectordb.config import IndexConfig
from vectordb.errors import DuplicateIdError, InvalidVectorsError
from vectordb.vectors_input import MAX_ID, iter_batches, load_vectors, validate_batch

F32 = IndexConfig(dim=4)
U8 = IndexConfig(dim=4, dtype="uint8")


def test_converts_to_contiguous_target_dtype_and_numbers_rows_from_first_id() -> None:
    vectors = np.asfortranarray(np.arange(12, dtype=np.float64).reshape(3, 4))
    ids, out = validate_batch(None, vectors, F32, first_id=7)
    assert ids.dtype == np.int64 and ids.tolist() == [7, 8, 9]
    assert out.dtype == np.float32 and out.flags.c_contiguous
    np.testing.assert_array_equal(out, vectors)


def test_uint8_index_takes_integers_and_integral_floats() -> None:
    for vectors in ([[0, 1, 2, 255]], np.array([[0.0, 1.0, 2.0, 255.0]])):
        _, out = validate_batch([3], vectors, U8)
        assert out.dtype == np.uint8 and out.tolist() == [[0, 1, 2, 255]]


def test_single_vector_and_empty_batches() -> None:
    ids, out = validate_batch([9], np.ones(4), F32)
    assert out.shape == (1, 4) and ids.tolist() == [9]
    for empty in ([], np.empty((0, 4)), np.empty((0, 7))):
        ids, out = validate_batch(None, empty, F32)
        assert ids.shape == (0,) and ids.dtype == np.int64
        assert out.shape == (0, 4) and out.dtype == np.float32
    assert validate_batch([], [], U8)[1].dtype == np.uint8


def test_largest_allowed_id() -> None:
    ids, _ = validate_batch(np.array([MAX_ID, 0], dtype=np.uint64), np.ones((2, 4)), F32)
    assert ids.tolist() == [MAX_ID, 0]


def _row(*values: float) -> list[list[float]]:
    return [[0.0, 0.0, 0.0, 0.0], [*values]]


@pytest.mark.parametrize(
    ("vectors", "config", "match"),
    [
        (np.ones((2, 3)), F32, r"dimension 3, expected 4"),
        (np.ones(5), F32, r"length 4 \(the index dimension\), got 5"),
        (np.ones((2, 2, 4)), F32, r"must be 2-D \[n, 4\], got shape \(2, 2, 4\)"),
        (np.float32(1.0), F32, r"must be 2-D"),
        ([[1, 2], [3]], F32, r"cannot be read as an array"),
        (np.ones((2, 4), dtype=np.complex64), F32, r"got dtype complex64"),
        (np.ones((2, 4), dtype=bool), F32, r"got dtype bool"),
        (np.array([[None] * 4]), F32, r"got dtype object"),
        (np.array([["a"] * 4]), F32, r"got dtype <U1"),
        (_row(1.0, np.nan, 0.0, 0.0), F32, r"NaN or inf, first at row 1"),
        (_row(-np.inf, 0.0, 0.0, 0.0), U8, r"NaN or inf, first at row 1"),
        (_row(1e300, 0.0, 0.0, 0.0), F32, r"row 1 has values outside the float32 range"),
        (_row(0.5, 1.0, 2.0, 3.0), U8, r"row 1 .* uint8 \(integers 0..255\): \[0.5\]"),
        (_row(256.0, 1.0, 2.0, 3.0), U8, r"row 1 .* uint8.*\[256.0\]"),
        (np.array(_row(0, -1, 0, 300), dtype=np.int16), U8, r"row 1 .* uint8.*\[-1, 300\]"),
    ],
)
def test_bad_vectors(vectors: object, config: IndexConfig, match: str) -> None:
    with pytest.raises(InvalidVectorsError, match=match):
        validate_batch(None, vectors, config)


@pytest.mark.parametrize(
    ("ids", "match"),
    [
        ([0.0, 1.0], r"ids must be integers, got dtype float64"),
        ([[0, 1]], r"ids must be 1-D, got shape \(1, 2\)"),
        ([0, 1, 2], r"got 3 ids for 2 vectors"),
        ([4, -2], r"id -2 at position 1 is negative"),
        ([0, MAX_ID + 1], r"id 4611686018427387905 at position 1 exceeds the maximum id"),
        (np.array([2**64 - 1, 0], dtype=np.uint64), r"position 0 exceeds the maximum id 2\*\*62"),
        (["a", "b"], r"ids must be integers, got dtype <U1"),
        ([[0, 1], [2]], r"ids cannot be read as an array"),
    ],
)
def test_bad_ids(ids: object, match: str) -> None:
    with pytest.raises(InvalidVectorsError, match=match):
        validate_batch(ids, np.ones((2, 4)), F32)


def test_bad_first_id() -> None:
    with pytest.raises(InvalidVectorsError, match=r"first_id -1 with 2 vectors"):
        validate_batch(None, np.ones((2, 4)), F32, first_id=-1)
    with pytest.raises(InvalidVectorsError, match=r"outside 0..2\*\*62"):
        validate_batch(None, np.ones((2, 4)), F32, first_id=MAX_ID)
    with pytest.raises(InvalidVectorsError, match=r"first_id must be an integer"):
        validate_batch(None, np.ones((2, 4)), F32, first_id=1.0)  # type: ignore[arg-type]


def test_duplicate_ids_are_listed_up_to_ten() -> None:
    ids = np.concatenate([np.arange(30), np.arange(12), [29]])
    with pytest.raises(DuplicateIdError, match=r"13 id\(s\) appear more than once.*\.\.\.") as info:
        validate_batch(ids, np.zeros((len(ids), 4)), F32)
    assert info.value.ids == list(range(10))
    with pytest.raises(DuplicateIdError, match=r"\[5\]$") as info:
        validate_batch([5, 6, 5], np.zeros((3, 4)), F32)
    assert info.value.ids == [5]


# --- property: validate_batch agrees with an independent oracle or raises a typed error -------

_DTYPES = [
    "bool", "complex64", "float16", "float32", "float64",
    "int8", "int16", "int64", "uint8", "uint16", "uint64",
]  # fmt: skip


@st.composite
def _batches(draw: st.DrawFn) -> tuple[object, np.ndarray, IndexConfig]:
    config = IndexConfig(
        dim=draw(st.integers(1, 3)), dtype=draw(st.sampled_from(["float32", "uint8"]))
    )
    dtype = np.dtype(draw(st.sampled_from(_DTYPES)))
    # Usually the right dimension, so the value checks are reached too.
    shape = draw(
        st.one_of(
            st.tuples(st.integers(0, 5), st.just(config.dim)),
            hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4),
        )
    )
    small = hnp.arrays(np.int64, shape, elements=st.integers(-2, 300))
    with np.errstate(all="ignore"):
        vectors = draw(st.one_of(hnp.arrays(dtype, shape), small.map(lambda a: a.astype(dtype))))
    rows = vectors.shape[0] if vectors.ndim else 1
    ids = draw(
        st.one_of(
            st.none(),
            st.permutations(range(rows)).map(lambda p: np.array(p, dtype=np.int64)),
            hnp.arrays(draw(st.sampled_from(["int64", "uint64", "int8", "float64"])), rows),
            hnp.arrays(np.int64, st.integers(0, 6), elements=st.integers(-1, 8)),
        )
    )
    return ids, vectors, config


def _oracle(ids: object, vectors: np.ndarray, config: IndexConfig) -> np.ndarray | None:
    """The converted vectors a valid batch must give, or None where a typed error is due."""
    dim, v = config.dim, vectors
    if v.dtype.kind not in "iuf" or v.ndim not in (1, 2):
        return None
    if v.ndim == 1 and len(v) not in (0, dim):
        return None
    if v.ndim == 2 and len(v) and v.shape[1] != dim:
        return None
    matrix = v.reshape(-1, dim) if v.size else np.empty((0, dim), v.dtype)
    if ids is not None:
        ids = np.asarray(ids)
        if ids.ndim != 1 or len(ids) != len(matrix):
            return None
        if len(ids) and (ids.dtype.kind not in "iu" or len(np.unique(ids)) < len(ids)):
            return None
        if len(ids) and (int(ids.min()) < 0 or int(ids.max()) > MAX_ID):
            return None
    with np.errstate(all="ignore"):
        exact = matrix.astype(np.float64)  # exact enough: no value near 0..255 is rounded
        if config.dtype == "uint8":
            valid = np.all((exact >= 0) & (exact <= 255) & (exact == np.round(exact)))
        else:
            valid = np.isfinite(exact).all() and np.isfinite(matrix.astype(np.float32)).all()
        return matrix.astype(config.numpy_dtype) if valid else None


@settings(max_examples=300, deadline=None)
@given(_batches())
def test_validate_batch_matches_oracle_or_raises_typed_error(
    batch: tuple[object, np.ndarray, IndexConfig],
) -> None:
    ids, vectors, config = batch
    expected = _oracle(ids, vectors, config)
    if expected is None:
        with pytest.raises((InvalidVectorsError, DuplicateIdError)):
            validate_batch(ids, vectors, config)
        return
    out_ids, out = validate_batch(ids, vectors, config)
    assert out.dtype == config.numpy_dtype and out.flags.c_contiguous
    np.testing.assert_array_equal(out, expected)
    want_ids = np.arange(len(out)) if ids is None else np.asarray(ids)
    assert out_ids.dtype == np.int64 and out_ids.tolist() == want_ids.tolist()


# --- iter_batches --------------------------------------------------------------------------------


def test_iter_batches_covers_every_row_once() -> None:
    vectors = np.arange(20, dtype=np.float32).reshape(10, 2)
    ids = np.arange(100, 110)
    batches = list(iter_batches(ids, vectors, 4))
    assert [len(v) for _, v in batches] == [4, 4, 2]
    np.testing.assert_array_equal(np.concatenate([i for i, _ in batches]), ids)
    np.testing.assert_array_equal(np.concatenate([v for _, v in batches]), vectors)
    assert all(i is None for i, _ in iter_batches(None, vectors, 3))
    assert list(iter_batches(None, vectors[:0], 3)) == []


def test_iter_batches_progress_bar_goes_to_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    list(iter_batches(None, np.zeros((10, 2)), 4, progress=True, desc="importing"))
    captured = capsys.readouterr()
    assert captured.out == "" and "importing" in captured.err and "10" in captured.err
    list(iter_batches(None, np.zeros((10, 2)), 4))
    assert capsys.readouterr().err == ""


def test_iter_batches_bad_arguments() -> None:
    with pytest.raises(InvalidArgumentError, match=r"batch_rows must be a positive integer"):
        next(iter_batches(None, np.zeros((3, 2)), 0))
    with pytest.raises(InvalidVectorsError, match=r"got 2 ids for 3 vectors"):
        next(iter_batches(np.arange(2), np.zeros((3, 2)), 2))


# --- load_vectors: dispatch and errors common to every format -----------------------------------


def test_load_numpy_array_passes_through() -> None:
    vectors = np.ones((3, 4), dtype=np.float32)
    ids, out = load_vectors(vectors)
    assert ids is None and out is vectors
    with pytest.raises(InvalidVectorsError, match=r"2-D \[n, dim\], got shape \(4,\)"):
        load_vectors(np.ones(4))


def test_load_errors(tmp_path) -> None:
    with pytest.raises(InvalidVectorsError, match=r"unknown extension '.csv'; supported: .npy"):
        load_vectors(tmp_path / "v.csv")
    with pytest.raises(FileMissingError, match=r"missing.fvecs"):
        load_vectors(tmp_path / "missing.fvecs")
    np.save(tmp_path / "v.npy", np.ones((2, 4)))
    with pytest.raises(InvalidVectorsError, match=r"column/id_column apply to Arrow and Parquet"):
        load_vectors(tmp_path / "v.npy", column="emb")
    with pytest.raises(InvalidVectorsError, match=r"cannot load vectors from a list"):
        load_vectors([[1.0, 2.0]])  # type: ignore[arg-type]
