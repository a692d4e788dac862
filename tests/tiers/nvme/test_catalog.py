"""The LMDB catalog: durable round trips, group commit, versions across restarts, bad contents."""

from __future__ import annotations

import asyncio
import struct
import zlib
from pathlib import Path

import lmdb
import pytest

from tiers.io.errors import CorruptionError, EngineClosedError, StorageError
from tiers.nvme import catalog as catalog_module
from tiers.nvme.catalog import Catalog, CatalogEntry


def _entry(i: int, version: int) -> CatalogEntry:
    return CatalogEntry(i % 3, i * 4096, 100 + i, 0xDEADBEEF ^ i, version)


async def _opened(path: Path) -> Catalog:
    catalog = Catalog(str(path))
    await catalog.open()
    return catalog


def test_entries_survive_a_reopen(tmp_path: Path) -> None:
    async def main() -> None:
        catalog = await _opened(tmp_path / "c")
        assert catalog.entries == {} and catalog.used_bytes == 0
        for i in range(5):
            await catalog.apply(f"k{i}", _entry(i, catalog.take_version()))
        await catalog.apply("k1", None)
        await catalog.apply("absent", None)  # deleting a missing key is not an error
        expected = dict(catalog.entries)
        await catalog.close()
        again = await _opened(tmp_path / "c")
        assert again.entries == expected and set(expected) == {"k0", "k2", "k3", "k4"}
        assert again.used_bytes == sum(e.size_bytes for e in expected.values())
        await again.close()

    asyncio.run(main())


def test_entry_bytes_follow_the_documented_layout(tmp_path: Path) -> None:
    async def main() -> None:
        catalog = await _opened(tmp_path / "c")
        await catalog.apply("ключ", CatalogEntry(7, 1 << 33, 12345, 0xFEEDF00D, 99))
        await catalog.close()

    asyncio.run(main())
    env = lmdb.open(str(tmp_path / "c"), subdir=True, max_dbs=2, readonly=True)
    try:
        objects, meta = env.open_db(b"objects", create=False), env.open_db(b"meta", create=False)
        with env.begin() as txn:
            key = "ключ".encode()
            raw = txn.get(key, db=objects)
            assert struct.unpack("<IQQIQI", raw) == (
                *(7, 1 << 33, 12345, 0xFEEDF00D, 99),
                zlib.crc32(key + raw[:32]),  # the seal covers the key too
            )
            sealed = {name: bytes(value) for name, value in txn.cursor(db=meta)}
            for name, value in sealed.items():
                assert struct.unpack("<I", value[-4:]) == (zlib.crc32(name + value[:-4]),)
            assert sealed[b"format_version"][:-4] == struct.pack("<I", 2)
            assert sealed[b"entry_count"][:-4] == struct.pack("<Q", 1)
            assert struct.unpack("<Q", sealed[b"next_version"][:-4])[0] >= 1
    finally:
        env.close()


def test_concurrent_applies_are_group_committed(tmp_path: Path) -> None:
    async def main() -> None:
        catalog = await _opened(tmp_path / "c")
        await asyncio.gather(
            *(catalog.apply(f"k{i}", _entry(i, catalog.take_version())) for i in range(64))
        )
        assert len(catalog.entries) == 64 and catalog.commits < 64
        await catalog.close()
        again = await _opened(tmp_path / "c")
        assert len(again.entries) == 64
        await again.close()

    asyncio.run(main())


def test_versions_only_grow_across_restarts(tmp_path: Path) -> None:
    async def main() -> None:
        catalog = await _opened(tmp_path / "c")
        versions = [catalog.take_version() for _ in range(10)]
        assert versions == sorted(set(versions))
        await catalog.apply("k", _entry(0, versions[-1]))
        await catalog.apply("k", None)  # the high-water mark outlives the entry
        await catalog.close()
        again = await _opened(tmp_path / "c")
        assert again.take_version() > versions[-1]
        await again.close()

    asyncio.run(main())


def test_the_map_grows_when_full(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(catalog_module, "_INITIAL_MAP_BYTES", 64 * 1024)

    async def main() -> None:
        catalog = await _opened(tmp_path / "c")
        for batch in range(4):
            await asyncio.gather(
                *(catalog.apply(f"{batch}/{'x' * 400}/{i}", _entry(i, i + 1)) for i in range(200))
            )
        assert len(catalog.entries) == 800
        await catalog.close()

    asyncio.run(main())


def test_closed_catalog_refuses_writes(tmp_path: Path) -> None:
    async def main() -> None:
        catalog = await _opened(tmp_path / "c")
        await catalog.close()
        with pytest.raises(EngineClosedError):
            await catalog.apply("k", _entry(0, 1))

    asyncio.run(main())


def _tamper(path: Path, db: bytes, key: bytes, value: bytes) -> None:
    env = lmdb.open(str(path), subdir=True, max_dbs=2)
    try:
        handle = env.open_db(db)
        with env.begin(write=True) as txn:
            txn.put(key, value, db=handle)
    finally:
        env.close()


@pytest.mark.parametrize(
    ("db", "key", "value"),
    [
        (b"objects", b"short", b"0123456789"),  # an entry of the wrong size
        (b"meta", b"format_version", struct.pack("<I", 2)),  # a future format
    ],
)
def test_bad_contents_raise_corruption(tmp_path: Path, db: bytes, key: bytes, value: bytes) -> None:
    async def main() -> None:
        await (await _opened(tmp_path / "c")).close()
        _tamper(tmp_path / "c", db, key, value)
        catalog = Catalog(str(tmp_path / "c"))
        with pytest.raises(CorruptionError):
            await catalog.open()
        await catalog.close()

    asyncio.run(main())


def test_an_unusable_path_is_a_storage_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_bytes(b"not a directory")

    async def main() -> None:
        catalog = Catalog(str(tmp_path / "file" / "c"))
        with pytest.raises(StorageError):
            await catalog.open()
        await catalog.close()

    asyncio.run(main())
