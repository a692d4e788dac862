"""The point store keeps vectors out of LMDB (vector_file.py): records stay small, so what
reads and writes map stays small; a vector's committed slot is never overwritten, so a failed
commit loses nothing; overwrites reuse a point's two slots; a reader racing two overwrites gets
the current vector; a damaged slot is a CorruptionError; records in the older inline form are
read and rewritten."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import orjson
import pytest

from tests.proc_maps import mapped_kib
from tests.vectordb.helpers import flip_byte
from tiers.io import CorruptionError
from tiers.storage import seal
from vectordb.collections import Collection, CollectionConfig
from vectordb.collections.point_records import internal_key, stored_slot
from vectordb.collections.point_store import PointStore
from vectordb.collections.points import point_key

T = TypeVar("T")
DIM = 384


def _run(make: Callable[[Path], Awaitable[T]], where: Path) -> T:
    return asyncio.run(make(where))


async def _collection(where: Path, dim: int = DIM) -> Collection:
    config = CollectionConfig(dim=dim, distance="Euclid")
    return await Collection.create("c", str(where / "c"), config)


def _vectors(n: int, seed: int, dim: int = DIM) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, dim)).astype(np.float32)


async def _vector_of(c: Collection, point_id: int) -> np.ndarray:
    (point,) = await c.retrieve([point_id], with_vector=True)
    assert point.vector is not None
    return np.asarray(point.vector, np.float32)


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="needs Linux /proc")
def test_adding_points_maps_little_of_the_store(tmp_path: Path) -> None:
    """1,000 points of 384 dimensions, each batch queried with payloads: the store's LMDB file
    and what the process maps of it stay well under a page a point (inline vectors: ~4 KiB a
    point in the file, and the reads mapped most of it)."""

    async def main(where: Path) -> tuple[int, int]:
        c = await _collection(where)
        try:
            for batch in range(5):
                ids = list(range(batch * 200, batch * 200 + 200))
                vectors = _vectors(200, batch)
                await c.upsert(ids, vectors, [{"n": i} for i in ids])
                hits = await c.query(vectors[:8], limit=10, with_payload=True)
                assert all(row[0].payload is not None for row in hits)
            data = where / "c" / "points" / "data.mdb"
            return data.stat().st_size, mapped_kib(data)
        finally:
            await c.aclose()

    file_bytes, resident_kib = _run(main, tmp_path)
    assert file_bytes < 1000 * 1024, f"{file_bytes} bytes of LMDB for 1,000 points"
    assert resident_kib < 1000, f"{resident_kib} KiB mapped for 1,000 points"


def test_a_failed_commit_leaves_the_committed_vector(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The new vector is written and synced, then the transaction fails: the point keeps its
    vector, now and after reopening (an in-place overwrite would have lost it)."""
    first, second, third = _vectors(3, 1)

    async def main(where: Path) -> None:
        c = await _collection(where)
        await c.upsert([5], first[None])
        apply = PointStore._apply

        def failing(self: PointStore, txn: Any, batch: Any) -> None:
            apply(self, txn, batch)
            raise OSError(5, "planted: the commit fails after the vectors were written")

        monkeypatch.setattr(PointStore, "_apply", failing)
        with pytest.raises(Exception, match="planted"):
            await c.upsert([5], second[None])
        monkeypatch.setattr(PointStore, "_apply", apply)
        np.testing.assert_array_equal(await _vector_of(c, 5), first)
        await c.aclose()
        c = await Collection.open("c", str(where / "c"))
        np.testing.assert_array_equal(await _vector_of(c, 5), first)
        await c.upsert([5], third[None])
        np.testing.assert_array_equal(await _vector_of(c, 5), third)
        await c.aclose()

    _run(main, tmp_path)


def test_overwrites_reuse_the_points_two_slots(tmp_path: Path) -> None:
    async def main(where: Path) -> int:
        c = await _collection(where, dim=8)
        await c.upsert(list(range(10)), _vectors(10, 0, 8))
        for round_ in range(20):
            vector = _vectors(1, 100 + round_, 8)
            await c.upsert([4], vector, [{"round": round_}])
            np.testing.assert_array_equal(await _vector_of(c, 4), vector[0])
        await c.grant([4], "a")  # tenants change, the vector does not: the same slot
        np.testing.assert_array_equal(await _vector_of(c, 4), vector[0])
        await c.aclose()
        return (where / "c" / "points" / "vectors.dat").stat().st_size

    assert _run(main, tmp_path) <= 2 * 10 * 8 * 4


def test_a_reader_racing_two_overwrites_gets_the_current_vector(tmp_path: Path) -> None:
    async def main(where: Path) -> None:
        c = await _collection(where, dim=8)
        await c.upsert([1], _vectors(1, 0, 8))
        (internal,) = c.store.lookup([point_key(1)])
        assert internal is not None
        (record,) = c.store.records([internal])  # read, its vector not yet loaded
        assert record is not None
        latest = _vectors(2, 1, 8)
        await c.upsert([1], latest[:1])
        await c.upsert([1], latest[1:])  # back in the slot the record above names
        np.testing.assert_array_equal(record.vector, latest[1])
        await c.aclose()

    _run(main, tmp_path)


def test_a_damaged_vector_is_a_corruption_error(tmp_path: Path) -> None:
    async def main(where: Path) -> None:
        c = await _collection(where, dim=8)
        await c.upsert([0, 1], _vectors(2, 0, 8))
        vectors = where / "c" / "points" / "vectors.dat"
        flip_byte(vectors, 2 * 1 * 8 * 4 + 3, mask=0x40)  # id 1, side 0
        (ok,) = await c.retrieve([0], with_vector=True)
        assert ok.vector is not None
        assert len(await c.retrieve([1], with_vector=False)) == 1  # payloads still read
        with pytest.raises(CorruptionError, match=r"vectors\.dat"):
            await c.retrieve([1], with_vector=True)
        await c.aclose()

    _run(main, tmp_path)


def test_a_record_with_its_vector_inline_is_read_and_rewritten(tmp_path: Path) -> None:
    """A store written before the vector file: the vector after the header."""
    old = _vectors(1, 7, 8)[0]

    async def main(where: Path) -> None:
        c = await _collection(where, dim=8)
        await c.upsert([3], _vectors(1, 0, 8), [{"k": "v"}])
        (internal,) = c.store.lookup([point_key(3)])
        assert internal is not None
        header = orjson.dumps({"id": 3, "owner": None, "tenants": [], "payload": {"k": "old"}})
        body = struct.pack("<I", len(header)) + header + old.astype("<f4").tobytes()
        key = internal_key(internal)
        with c.store._env.begin(write=True, db=c.store._points) as txn:
            txn.put(key, seal(key, body))
        (point,) = await c.retrieve([3], with_vector=True)
        assert point.payload == {"k": "old"}
        np.testing.assert_array_equal(np.asarray(point.vector, np.float32), old)
        await c.grant([3], "a")  # rewritten in the current form, the vector kept
        with c.store._env.begin(db=c.store._points) as txn:
            assert stored_slot(internal, txn.get(key), "x") is not None
        np.testing.assert_array_equal(await _vector_of(c, 3), old)
        await c.aclose()

    _run(main, tmp_path)
