"""The index's checkpoint store under bit rot: single bytes flipped in ``meta/data.mdb`` where
LMDB keeps its records' keys and values. Every read gives back exactly the checkpoint written or
raises CorruptionError naming the file: never None (a "new index"), never a missing array, never
a wrong number, never another exception type."""

from __future__ import annotations

import io
import json
import struct
import zlib
from collections.abc import Iterable
from pathlib import Path

import lmdb
import numpy as np
import pytest

from tests.tiers.storage.lmdb_flips import delete_behind_its_back, flipped_copies, node_regions
from tiers.io.errors import CorruptionError
from vectordb.meta import Checkpoint, MetaStore

CONFIG = {"dim": 5, "metric": "cosine", "head_fraction": 0.12}
STATE = {"wal_seq": 3, "next_lsn": 17, "next_pid": 7, "navigator_kind": "auto"}


def _arrays() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {  # small: inline in LMDB's leaf pages, next to their keys
        "head_pids": rng.permutation(7).astype(np.int64),
        "versions": rng.integers(0, 1 << 32, 20, dtype=np.uint32),
        "head_vectors": rng.normal(size=(3, 5)).astype(np.float32),
    }


def _same(got: Checkpoint | None, want: Checkpoint) -> bool:
    if got is None or (got.config, got.state) != (want.config, want.state):
        return False
    if set(got.arrays) != set(want.arrays):
        return False
    return all(
        got.arrays[name].dtype == array.dtype and np.array_equal(got.arrays[name], array)
        for name, array in want.arrays.items()
    )


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Checkpoint]:
    directory = tmp_path_factory.mktemp("pristine") / "meta"
    store = MetaStore(str(directory))
    store.write(Checkpoint({"dim": 1}, {"wal_seq": 0}, {"versions": np.zeros(3, np.uint32)}))
    checkpoint = Checkpoint(CONFIG, STATE, _arrays())
    store.write(checkpoint)  # a second write: stale copies of the first in freed pages
    written = store.read()
    store.close()
    assert written is not None
    return directory, written


def _read_each(copies: Iterable[tuple[int, Path]], want: Checkpoint) -> int:
    """Read every damaged copy; the number that raised CorruptionError (the rest must be whole)."""
    corrupt = 0
    for offset, directory in copies:
        data_path = str(directory / "data.mdb")
        try:
            store = MetaStore(str(directory))
            try:
                got = store.read()
            finally:
                store.close()
        except CorruptionError as exc:
            assert exc.path == data_path and data_path in str(exc), offset
            corrupt += 1
            continue
        assert _same(got, want), f"a flip at byte {offset} changed the checkpoint read"
    return corrupt


@pytest.mark.parametrize(
    "key", [b"config", b"state", b"format", b"a:head_pids", b"a:versions", b"a:head_vectors"]
)
def test_flips_in_checkpoint_records(
    pristine: tuple[Path, Checkpoint], tmp_path: Path, key: bytes
) -> None:
    source, written = pristine
    data = (source / "data.mdb").read_bytes()
    regions = node_regions(data, key)
    live = max(len(region) for region in regions) if regions else 0
    offsets = sorted({offset for region in regions for offset in region})
    copies = flipped_copies(source, offsets, tmp_path / "m", seed=len(key))
    assert _read_each(copies, written) >= live > len(key)  # every byte of the live record


def test_a_record_lmdb_no_longer_reaches_is_caught(
    pristine: tuple[Path, Checkpoint], tmp_path: Path
) -> None:
    source, _ = pristine
    copy = delete_behind_its_back(source, tmp_path / "m", b"a:versions", None)
    store = MetaStore(str(copy))
    try:
        with pytest.raises(CorruptionError, match="records"):
            store.read()
    finally:
        store.close()


def test_a_format_1_store_is_read_and_rewritten(tmp_path: Path) -> None:
    path = tmp_path / "meta"
    env = lmdb.open(str(path), subdir=True)
    with env.begin(write=True) as txn:
        txn.put(b"config", json.dumps(CONFIG).encode())
        txn.put(b"state", json.dumps({**STATE, "format": 1}).encode())
        for name, array in _arrays().items():
            buffer = io.BytesIO()
            np.save(buffer, array, allow_pickle=False)
            npy = buffer.getvalue()
            txn.put(b"a:" + name.encode(), struct.pack("<I", zlib.crc32(npy)) + npy)
    env.close()
    want = Checkpoint(CONFIG, {**STATE, "format": 1}, _arrays())
    store = MetaStore(str(path))
    try:
        assert _same(store.read(), want)
        store.write(Checkpoint(CONFIG, STATE, _arrays()))  # the next checkpoint is format 3
        assert _same(store.read(), Checkpoint(CONFIG, STATE, _arrays()))
        with store._env.begin() as txn:
            assert bytes(txn.get(b"format"))[:4] == struct.pack("<I", 3)
    finally:
        store.close()
