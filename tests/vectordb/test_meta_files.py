"""MetaStore's larger arrays in plain files: they round trip (narrowed too), stay out of LMDB's
map, survive a write cut before its commit, and a damaged, cut or missing file is a
CorruptionError naming the file."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tiers.io.errors import CorruptionError
from vectordb import meta as meta_module
from vectordb import meta_files
from vectordb.meta import Checkpoint, MetaStore


def _big(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "head_vectors": rng.normal(size=(300, 16)).astype(np.float32),  # 19 KiB: a file
        "versions": rng.integers(0, 1 << 32, 5000, dtype=np.uint32),  # a file
        "head_pids": rng.permutation(7).astype(np.int64),  # small: inline in LMDB
    }


@pytest.fixture
def store(tmp_path: Path) -> Iterator[MetaStore]:
    meta = MetaStore(str(tmp_path / "meta"))
    yield meta
    meta.close()


def _same(got: Checkpoint | None, want: dict[str, np.ndarray]) -> None:
    assert got is not None and set(got.arrays) == set(want)
    for name, array in want.items():
        assert got.arrays[name].dtype == array.dtype and got.arrays[name].flags.writeable
        np.testing.assert_array_equal(got.arrays[name], array)


def _files(store: MetaStore) -> list[Path]:
    return sorted(p for p in Path(store.path).glob("arrays.*/*.npy"))


def test_large_arrays_are_files_and_only_the_last_generation_is_kept(store: MetaStore) -> None:
    for seed in range(3):
        store.write(Checkpoint({"dim": 16}, {"wal_seq": seed}, _big(seed)))
    _same(store.read(), _big(2))
    assert [p.parent.name for p in _files(store)] == ["arrays.0000000000000003"] * 2
    with store._env.begin() as txn:
        keys = sorted(bytes(k) for k, _ in txn.cursor())
    assert keys == [
        b"a:head_pids",
        b"config",
        b"f:head_vectors",
        b"f:versions",
        b"format",
        b"state",
    ]
    assert os.path.getsize(store.data_path) < 64 << 10  # no overflow pages of arrays


def test_a_narrowed_file_array_is_converted_in_pieces(
    store: MetaStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(meta_files, "READ_STEP_BYTES", 1000)  # many pieces
    arrays = _big(0)
    store.write(Checkpoint({}, {}, arrays))
    seen: dict[str, int] = {}

    def narrow(name: str, nbytes: int) -> object:
        seen[name] = nbytes
        return np.float16 if name == "head_vectors" else None

    got = store.read(narrow)
    assert got is not None
    assert got.arrays["head_vectors"].dtype == np.float16
    np.testing.assert_array_equal(
        got.arrays["head_vectors"], arrays["head_vectors"].astype(np.float16)
    )
    np.testing.assert_array_equal(got.arrays["versions"], arrays["versions"])
    assert seen["head_vectors"] > arrays["head_vectors"].nbytes  # the .npy bytes, as inline


def test_a_write_cut_before_its_commit_leaves_the_previous_checkpoint(
    store: MetaStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.write(Checkpoint({}, {"wal_seq": 1}, _big(1)))

    def cut(*args: object) -> None:
        raise OSError("power cut")

    with monkeypatch.context() as patch:
        patch.setattr(meta_module, "write_growing", cut)
        with pytest.raises(OSError):
            store.write(Checkpoint({}, {"wal_seq": 2}, _big(2)))
    store.close()
    again = MetaStore(str(tmp_path / "meta"))
    try:
        got = again.read()
        assert got is not None and got.state == {"wal_seq": 1}
        _same(got, _big(1))
        again.write(Checkpoint({}, {"wal_seq": 3}, _big(3)))  # the cut's folder is cleared
        _same(again.read(), _big(3))
        assert {p.parent.name for p in _files(again)} == {"arrays.0000000000000003"}
    finally:
        again.close()


@pytest.mark.parametrize("damage", ["flip", "truncate", "extend", "missing"])
def test_a_damaged_array_file_is_a_corruption_error(
    store: MetaStore, tmp_path: Path, damage: str
) -> None:
    store.write(Checkpoint({}, {}, _big(0)))
    path = next(p for p in _files(store) if p.stat().st_size == 5000 * 4 + 128)  # versions
    data = bytearray(path.read_bytes())
    if damage == "flip":
        data[len(data) - 7] ^= 0x10
    elif damage == "truncate":
        data = data[:-4]
    elif damage == "extend":
        data += b"\0" * 4
    if damage == "missing":
        path.unlink()
    else:
        path.write_bytes(bytes(data))
    with pytest.raises(CorruptionError, match="versions") as caught:
        store.read()
    assert caught.value.path == str(path)
