"""The catalog under bit rot: single bytes flipped in its ``data.mdb`` where LMDB keeps the
stored keys and values, the catalog's own records and the names of its databases. Every reopen
gives back exactly what was committed or raises CorruptionError naming the file: never a key
gone missing, never a wrong value, never another exception type."""

from __future__ import annotations

import asyncio
import re
import struct
import zlib
from collections.abc import Iterable
from pathlib import Path

import lmdb
import pytest

from tests.tiers.storage.lmdb_flips import delete_behind_its_back, flipped_copies, node_regions
from tiers.io.errors import CorruptionError
from tiers.nvme.catalog import Catalog, CatalogEntry
from tiers.storage import lmdb_errors

KEYS = ["alpha", "ключ-7", "k" * 40, *(f"obj-{i:03d}" for i in range(12)), "zz/last"]
VICTIMS = ["alpha", "ключ-7", "k" * 40, "obj-006", "zz/last"]
Committed = tuple[dict[str, CatalogEntry], int]


def _entry(i: int, version: int) -> CatalogEntry:
    return CatalogEntry(i % 3, i * 4096, 100 + i, 0xDEADBEEF ^ i, version)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Committed]:
    directory = tmp_path_factory.mktemp("pristine") / "catalog"

    async def build() -> Committed:
        catalog = Catalog(str(directory))
        await catalog.open()
        await asyncio.gather(
            *(catalog.apply(key, _entry(i, catalog.take_version())) for i, key in enumerate(KEYS))
        )
        await catalog.apply("gone", _entry(99, catalog.take_version()))
        await catalog.apply("gone", None)
        committed = dict(catalog.entries), catalog.next_version
        await catalog.close()
        return committed

    return directory, asyncio.run(build())


def _reopen_each(copies: Iterable[tuple[int, Path]], committed: Committed) -> dict[str, int]:
    """Reopen every damaged copy; count the outcomes, failing on any that is not allowed."""
    outcomes = {"intact": 0, "corruption": 0}

    async def main() -> None:
        for offset, directory in copies:
            catalog = Catalog(str(directory))
            try:
                await catalog.open()
            except CorruptionError as exc:
                assert exc.path == str(directory / "data.mdb"), offset
                assert str(directory / "data.mdb") in str(exc), offset
                outcomes["corruption"] += 1
                continue
            finally:
                await catalog.close()
            got = dict(catalog.entries), catalog.next_version
            assert got == committed, f"a flip at byte {offset} changed what the catalog reads"
            outcomes["intact"] += 1

    asyncio.run(main())
    return outcomes


def _offsets(directory: Path, keys: list[bytes]) -> list[int]:
    data = (directory / "data.mdb").read_bytes()
    regions = [region for key in keys for region in node_regions(data, key)]
    assert regions, "the records were not found in data.mdb"
    return sorted({offset for region in regions for offset in region})


def test_flips_in_stored_keys_and_values(pristine: tuple[Path, Committed], tmp_path: Path) -> None:
    source, committed = pristine
    offsets = _offsets(source, [key.encode() for key in VICTIMS])
    outcomes = _reopen_each(flipped_copies(source, offsets, tmp_path / "c"), committed)
    assert outcomes["corruption"] >= sum(len(key.encode()) + 32 for key in VICTIMS)


@pytest.mark.parametrize("record", [b"format_version", b"next_version", b"entry_count"])
def test_flips_in_the_catalogs_own_records(
    pristine: tuple[Path, Committed], tmp_path: Path, record: bytes
) -> None:
    source, committed = pristine
    offsets = _offsets(source, [record])
    outcomes = _reopen_each(flipped_copies(source, offsets, tmp_path / "c", seed=1), committed)
    assert outcomes["corruption"] >= len(record)


def test_flips_in_the_names_of_its_databases(
    pristine: tuple[Path, Committed], tmp_path: Path
) -> None:
    """A renamed ``objects`` database must not read as a new, empty one."""
    source, committed = pristine
    data = (source / "data.mdb").read_bytes()
    names = [
        region.start + i
        for name in (b"objects", b"meta")
        for region in node_regions(data, name)
        for i in range(len(name))
    ]
    outcomes = _reopen_each(flipped_copies(source, names, tmp_path / "c", seed=2), committed)
    assert outcomes["corruption"] >= len(b"objects")


def test_flips_in_page_headers_and_node_pointers(
    pristine: tuple[Path, Committed], tmp_path: Path
) -> None:
    """LMDB trusts these: unchecked, a bad node offset made it read past the file (SIGBUS)."""
    pytest.importorskip("lmdb.verify", reason="only py-lmdb's verifier keeps LMDB off them")
    source, committed = pristine
    env = lmdb.open(str(source), subdir=True, max_dbs=2, readonly=True, lock=False)
    page_bytes = env.stat()["psize"]
    env.close()
    data = (source / "data.mdb").read_bytes()
    pages = sorted({region.start // page_bytes for region in node_regions(data, b"alpha")})
    headers = [page * page_bytes + i for page in pages for i in range(64)]  # header, offsets
    outcomes = _reopen_each(flipped_copies(source, headers, tmp_path / "c", seed=3), committed)
    assert outcomes["corruption"] >= 32


def test_a_record_lmdb_no_longer_reaches_is_caught(
    pristine: tuple[Path, Committed], tmp_path: Path
) -> None:
    """A lost record (here: deleted behind the catalog's back) breaks the stored count."""
    source, _ = pristine
    copy = delete_behind_its_back(source, tmp_path / "c", b"obj-003", b"objects")

    async def main() -> None:
        catalog = Catalog(str(copy))
        with pytest.raises(CorruptionError, match="entries"):
            await catalog.open()
        await catalog.close()

    asyncio.run(main())


def test_a_format_1_catalog_is_upgraded_in_place(tmp_path: Path) -> None:
    path = tmp_path / "c"
    old = {f"k{i}": _entry(i, i + 1) for i in range(5)}
    env = lmdb.open(str(path), subdir=True, max_dbs=2)
    with env.begin(write=True) as txn:
        objects, meta = env.open_db(b"objects", txn=txn), env.open_db(b"meta", txn=txn)
        txn.put(b"format_version", struct.pack("<I", 1), db=meta)
        txn.put(b"next_version", struct.pack("<Q", 40), db=meta)
        for key, entry in old.items():
            txn.put(key.encode(), struct.pack("<IQQIQ", *entry[:5]), db=objects)
    env.close()

    async def reopen() -> Catalog:
        catalog = Catalog(str(path))
        await catalog.open()
        await catalog.close()
        return catalog

    for _ in range(2):  # upgraded by the first open, read as format 2 by the second
        catalog = asyncio.run(reopen())
        assert catalog.entries == old and catalog.next_version == 40
    env = lmdb.open(str(path), subdir=True, max_dbs=2, readonly=True)
    with env.begin() as txn:
        raw = txn.get(b"format_version", db=env.open_db(b"meta", txn=txn, create=False))
        stamp = struct.pack("<I", 2)
        assert raw == stamp + struct.pack("<I", zlib.crc32(b"format_version" + stamp))
    env.close()


@pytest.mark.parametrize(
    "error",
    [
        lmdb.CorruptedError,
        lmdb.PageNotFoundError,
        lmdb.InvalidError,
        lmdb.BadTxnError,
        lmdb.IncompatibleError,
        lmdb.VersionMismatchError,
    ],
)
def test_lmdbs_damage_reports_are_corruption(error: type[lmdb.Error]) -> None:
    path = "/x/data.mdb"
    with pytest.raises(CorruptionError, match=re.escape(path)) as info, lmdb_errors(path):
        raise error("mdb_get: damaged")
    assert info.value.path == path
