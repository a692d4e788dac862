"""MetaStore: checkpoints round trip through LMDB; a damaged array value is a CorruptionError."""

from __future__ import annotations

import io
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lmdb
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tiers.io.errors import CorruptionError
from vectordb.meta import Checkpoint, MetaStore, _npy_copy


@pytest.fixture
def store(tmp_path: Path) -> Iterator[MetaStore]:
    meta = MetaStore(str(tmp_path / "meta"))
    yield meta
    meta.close()


def _arrays(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "head_vectors": rng.normal(size=(7, 5)).astype(np.float32),
        "head_pids": rng.permutation(7).astype(np.int64),
        "versions": rng.integers(0, 1 << 32, 100, dtype=np.uint32),
        "posting_count": np.zeros(0, np.int32),
        "bytes": rng.integers(0, 256, (3, 4), dtype=np.uint8),
        "strided": np.arange(20, dtype=np.int64)[::3],  # not contiguous on the way in
    }


def _assert_same(got: dict[str, Any], want: dict[str, np.ndarray]) -> None:
    assert set(got) == set(want)
    for name, array in want.items():
        assert got[name].dtype == array.dtype, name
        assert got[name].shape == array.shape, name
        np.testing.assert_array_equal(got[name], array)


def test_fresh_store_reads_none(store: MetaStore) -> None:
    assert store.read() is None


def test_round_trip(store: MetaStore, tmp_path: Path) -> None:
    config = {"dim": 5, "metric": "cosine", "head_fraction": 0.12}
    state = {"wal_seq": 3, "next_lsn": 17, "next_pid": 7, "navigator_kind": "auto"}
    arrays = _arrays()
    store.write(Checkpoint(config, state, arrays))
    got = store.read()
    assert got is not None
    assert got.config == config
    assert got.state == state
    _assert_same(got.arrays, arrays)
    # committed: a store reopened on the same directory sees it
    store.close()
    again = MetaStore(str(tmp_path / "meta"))
    try:
        reread = again.read()
        assert reread is not None
        _assert_same(reread.arrays, arrays)
    finally:
        again.close()


def test_second_write_replaces_values(store: MetaStore) -> None:
    store.write(Checkpoint({"dim": 1}, {"wal_seq": 0}, _arrays(0)))
    newer = _arrays(1)
    store.write(Checkpoint({"dim": 1}, {"wal_seq": 1}, newer))
    got = store.read()
    assert got is not None
    assert got.state["wal_seq"] == 1
    _assert_same(got.arrays, newer)


def test_large_checkpoint_grows_the_map(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from vectordb import meta as meta_module

    monkeypatch.setattr(meta_module, "_MAP_BYTES", 1 << 20)  # a small map: forces MapFullError
    meta = MetaStore(str(tmp_path / "small"))
    try:
        big = {"v": np.arange(1 << 19, dtype=np.int64)}  # 4 MiB
        meta.write(Checkpoint({}, {}, big))
        got = meta.read()
        assert got is not None
        _assert_same(got.arrays, big)
    finally:
        meta.close()


def _raw(store: MetaStore, key: bytes) -> bytes:
    with store._env.begin() as txn:
        value = txn.get(key)
    assert value is not None
    return bytes(value)


def _damaged(tmp_path: Path, store: MetaStore, key: bytes, value: bytes) -> MetaStore:
    """Close ``store``, overwrite ``key`` with raw bytes through the lmdb module, reopen."""
    store.close()
    env = lmdb.open(str(tmp_path / "meta"), subdir=True)
    with env.begin(write=True) as txn:
        txn.put(key, value)
    env.close()
    return MetaStore(str(tmp_path / "meta"))


def _flip(value: bytes, at: int) -> bytes:
    out = bytearray(value)
    out[at] ^= 0x01
    return bytes(out)


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda v: _flip(v, len(v) - 5), id="last-data-byte"),
        pytest.param(lambda v: _flip(v, 20), id="npy-header"),
        pytest.param(lambda v: _flip(v, len(v) - 1), id="crc"),
        pytest.param(lambda v: v[:-8], id="truncated"),
        pytest.param(lambda v: v + b"\0" * 8, id="extended"),
        pytest.param(lambda v: v[:2], id="shorter-than-crc"),
        pytest.param(lambda v: b"", id="empty"),
    ],
)
def test_corrupted_array_value(store: MetaStore, tmp_path: Path, damage: Any) -> None:
    store.write(Checkpoint({"dim": 5}, {}, _arrays()))
    key = b"a:versions"
    value = _raw(store, key)
    (crc,) = struct.unpack_from("<I", value, len(value) - 4)
    assert crc == zlib.crc32(key + value[:-4])  # the documented layout: .npy bytes, then a seal
    reopened = _damaged(tmp_path, store, key, damage(value))
    try:
        with pytest.raises(CorruptionError, match="versions"):
            reopened.read()
    finally:
        reopened.close()


def test_unknown_format_is_refused(store: MetaStore, tmp_path: Path) -> None:
    store.write(Checkpoint({"dim": 5}, {}, {}))
    stamp = struct.pack("<II", 99, 4)  # a well-sealed stamp of a future format
    reopened = _damaged(
        tmp_path, store, b"format", stamp + struct.pack("<I", zlib.crc32(b"format" + stamp))
    )
    try:
        with pytest.raises(CorruptionError, match="format 99"):
            reopened.read()
    finally:
        reopened.close()


@settings(max_examples=60, deadline=None)
@given(
    dtype=st.sampled_from(["<f4", ">f4", "<i8", "<u4", "<f2", "|u1", "<c8"]),
    shape=st.lists(st.integers(0, 5), min_size=0, max_size=3),
    fortran=st.booleans(),
)
def test_an_array_is_read_back_from_any_npy_buffer_as_np_load_would(
    dtype: str, shape: list[int], fortran: bool
) -> None:
    array = np.arange(int(np.prod(shape)), dtype=np.int64).astype(dtype).reshape(shape)
    array = np.asfortranarray(array) if fortran else array
    stream = io.BytesIO()
    np.save(stream, array, allow_pickle=False)
    got = _npy_copy(memoryview(stream.getvalue()))
    want = np.load(io.BytesIO(stream.getvalue()), allow_pickle=False)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    assert got.flags.writeable and got.flags.owndata  # a copy, not a view of LMDB's pages


def test_an_object_array_is_refused() -> None:
    stream = io.BytesIO()
    np.save(stream, np.array([1, "a"], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError):
        _npy_copy(stream.getvalue())


def test_update_state_merges_into_the_named_checkpoint_only(store: MetaStore) -> None:
    config = {"dim": 5}
    state = {"wal_seq": 1, "next_lsn": 9, "next_pid": 7}
    arrays = _arrays()
    store.write(Checkpoint(config, state, arrays))
    assert not store.update_state({"measured": 3}, if_next_lsn=8)  # another checkpoint's
    assert store.update_state({"measured": 4}, if_next_lsn=9)
    got = store.read()  # every record still checks, the count still holds
    assert got is not None
    assert got.state == {**state, "measured": 4}
    assert got.config == config
    _assert_same(got.arrays, arrays)
    store.write(Checkpoint(config, {**state, "next_lsn": 12}, arrays))  # replaces the state
    got = store.read()
    assert got is not None and "measured" not in got.state


def test_update_state_leaves_an_empty_store_alone(store: MetaStore) -> None:
    assert not store.update_state({"measured": 1}, if_next_lsn=0)
    assert store.read() is None
