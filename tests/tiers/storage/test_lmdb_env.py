"""open_lmdb, write_growing, lmdb_errors and LmdbWriter: a damaged file is refused before LMDB
maps it, errors come out typed, a full map grows, and concurrent submits share commits that
succeed or fail whole."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path
from typing import Any

import lmdb
import pytest

from tests.proc_maps import mapped_kib
from tiers.io.errors import CorruptionError, PermissionDeniedError, StorageError
from tiers.storage import LmdbWriter, lmdb_errors, open_lmdb, write_growing


def _fill(env: Any, n: int, size: int) -> None:
    def write(txn: Any) -> None:
        for i in range(n):
            txn.put(i.to_bytes(4, "big"), bytes([i % 256]) * size)

    with lmdb_errors("x"):
        write_growing(env, write)


def test_a_full_map_grows_and_the_data_survives(tmp_path: Path) -> None:
    env = open_lmdb(str(tmp_path / "db"), map_bytes=64 * 1024)
    _fill(env, 200, 1000)  # ~200 KB: the 64 KiB map must double a few times
    assert env.info()["map_size"] > 64 * 1024
    env.close()
    env = open_lmdb(str(tmp_path / "db"), readonly=True)
    with env.begin() as txn:
        assert txn.stat()["entries"] == 200 and txn.get((7).to_bytes(4, "big")) == b"\7" * 1000
    with pytest.raises(PermissionDeniedError, match="LMDB"), lmdb_errors("db/data.mdb"):
        _put(env)
    env.close()


def _put(env: Any) -> None:
    with env.begin(write=True) as txn:
        txn.put(b"k", b"v")


def test_a_damaged_data_file_is_refused_before_it_is_mapped(tmp_path: Path) -> None:
    env = open_lmdb(str(tmp_path / "db"))
    _fill(env, 50, 100)
    env.close()
    data = tmp_path / "db" / "data.mdb"
    raw = bytearray(data.read_bytes())
    raw[4096 * 2 : 4096 * 2 + 16] = b"\xff" * 16  # the header of the first data page
    data.write_bytes(bytes(raw))
    with pytest.raises(CorruptionError, match="structural check") as info:
        open_lmdb(str(tmp_path / "db"))
    assert info.value.path == str(data)


def test_open_errors_are_typed_and_name_the_data_file(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(StorageError) as info:
        open_lmdb(str(tmp_path / "empty"), readonly=True)
    assert isinstance(info.value.__cause__, lmdb.Error)
    assert info.value.filename == str(tmp_path / "empty" / "data.mdb")


def test_writer_group_commits_in_order_on_one_thread(tmp_path: Path) -> None:
    batches: list[list[int]] = []
    threads: set[int] = set()

    async def main() -> None:
        started = asyncio.Event()

        async def commit(batch: list[int]) -> None:
            batches.append(batch)
            started.set()
            await writer.call(lambda: threads.add(threading.get_ident()))

        writer: LmdbWriter[int] = LmdbWriter(commit, "test-lmdb")
        first = asyncio.ensure_future(writer.submit([0]))
        await started.wait()  # the first commit is under way: the rest wait for the next one
        await asyncio.gather(first, *(writer.submit([i]) for i in range(1, 10)))
        await writer.submit([10, 11])
        await writer.submit([])  # nothing to commit: returns at once
        await writer.close()

    asyncio.run(main())
    assert batches == [[0], list(range(1, 10)), [10, 11]]
    assert len(threads) == 1 and threading.get_ident() not in threads


def test_a_failed_commit_fails_every_change_in_it_and_only_those() -> None:
    async def main() -> list[Any]:
        async def commit(batch: list[str]) -> None:
            await asyncio.sleep(0)
            if "bad" in batch:
                raise StorageError(5, "LMDB: failed", "db")

        writer: LmdbWriter[str] = LmdbWriter(commit, "test-lmdb")
        first = asyncio.ensure_future(writer.submit(["a"]))
        await asyncio.sleep(0)  # "a" commits alone; the next two share a commit
        results = await asyncio.gather(
            first, writer.submit(["b"]), writer.submit(["bad"]), return_exceptions=True
        )
        results.append(await writer.submit(["c"]))  # the next commit starts afresh
        await writer.close()
        return results

    results = asyncio.run(main())
    assert results[0] is None and results[3] is None
    assert all(isinstance(r, StorageError) for r in results[1:3])


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="needs Linux /proc")
def test_a_cold_read_maps_its_page_not_a_readahead_window(tmp_path: Path) -> None:
    """open_lmdb opens without readahead: one point read from a cold 8 MiB store leaves a few
    pages resident in the process, not the ~0.5 MiB the kernel reads around a fault."""
    where = tmp_path / "db"
    env = open_lmdb(str(where), map_bytes=64 << 20)
    _fill(env, 2048, 4000)  # ~8 MiB, a value to a page
    env.close()
    data = where / "data.mdb"
    fd = os.open(data, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # cold, as after a restart
    finally:
        os.close(fd)
    env = open_lmdb(str(where), check=False, readonly=True)
    try:
        with env.begin() as txn:
            for i in (300, 1100, 1900):
                assert txn.get(i.to_bytes(4, "big")) == bytes([i % 256]) * 4000
        resident_kib = mapped_kib(data)
    finally:
        env.close()
    # three values, their leaves and the branch pages above them; readahead: > 1 MiB
    assert resident_kib <= 128, f"{resident_kib} KiB of the file resident after three reads"
