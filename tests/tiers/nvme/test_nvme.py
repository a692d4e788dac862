"""NvmeTier: the Tier contract, reopening, corruption, hole reuse, injected faults, and reads that
race overwrites of the same key."""

from __future__ import annotations

import asyncio
import errno
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest

from tiers.io.batch import READ, IOBatch
from tiers.io.engine import IOEngine
from tiers.io.env import Env
from tiers.io.errors import (
    CorruptionError,
    DirectIOUnsupportedError,
    EngineClosedError,
    FileMissingError,
    InvalidArgumentError,
    NoSpaceError,
    PermissionDeniedError,
    StorageError,
)
from tiers.io.runtime import IORuntime
from tiers.io.threaded import ThreadEngine
from tiers.nvme import records as nvme_records
from tiers.nvme.catalog import Catalog
from tiers.nvme.format import HEADER_BYTES, record_bytes
from tiers.nvme.nvme_tier import NvmeTier
from tiers.storage.tier import Tier
from tiers.testing.faulty_engine import FaultyEngine
from tiers.testing.tier_contract import TierContract, as_bytes

T = TypeVar("T")


class TestNvmeTier(TierContract):
    async def make_tier(self, capacity_bytes: int, tmp_path: Path) -> Tier:
        return await NvmeTier.open("nvme", capacity_bytes, tmp_path / "nvme", create=True)


class TestNvmeTierSmallFilesBuffered(TierContract):
    """Many small extent files (objects land in several, new ones get added) and page-cache I/O."""

    async def make_tier(self, capacity_bytes: int, tmp_path: Path) -> Tier:
        return await NvmeTier.open(
            "nvme",
            capacity_bytes,
            tmp_path / "nvme",
            extent_file_bytes=32 * 1024,
            direct=False,
            create=True,
        )


def _data(size: int, seed: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()


def _run(body: Callable[[], Awaitable[T]]) -> T:
    return asyncio.run(body())  # type: ignore[arg-type]


def lease(engine: IOEngine) -> IORuntime:
    """A runtime that serves ``engine``, with one lease held for the test, so a tier's aclose
    does not close it (the test does). Call from the loop the tiers run on."""
    runtime = IORuntime(engine=lambda *_: engine)
    runtime.acquire_engine()
    return runtime


def assert_space_consistent(tier: NvmeTier) -> None:
    """Free extent bytes are exactly the file bytes no live record holds."""
    stats = tier.stats()
    entries = tier._open_catalog().entries
    live = sum(tier._entry_bytes(entries[key]) for key in sorted(tier.keys()))
    assert stats["extent_free_bytes"] == stats["extent_file_bytes"] - live
    assert stats["reserved_bytes"] == 0 and stats["extents_pinned"] == 0
    assert stats["extent_frees_deferred"] == 0


def _flip(path: str, offset: int) -> None:
    fd = os.open(path, os.O_RDWR)
    try:
        byte = os.pread(fd, 1, offset)
        os.pwrite(fd, bytes([byte[0] ^ 0x40]), offset)
        os.fsync(fd)
    finally:
        os.close(fd)


def test_reopen_finds_every_object_and_reuses_no_live_extent(tmp_path: Path) -> None:
    objects = {f"k{i}": _data((i * 7919) % 70_000, i) for i in range(60)}

    async def main() -> None:
        tier = await NvmeTier.open(
            "nvme", 4 << 20, tmp_path, extent_file_bytes=1 << 20, create=True
        )
        for key, value in objects.items():
            await tier.put(key, value)
        for i in range(0, 60, 3):
            await tier.delete(f"k{i}")
            del objects[f"k{i}"]
        objects["k1"] = _data(123_456, 99)
        await tier.put("k1", objects["k1"])
        used = tier.used_bytes
        await tier.aclose()

        tier = await NvmeTier.open(
            "nvme", 4 << 20, tmp_path, extent_file_bytes=1 << 20, create=True
        )
        assert set(tier.keys()) == set(objects) and tier.used_bytes == used
        assert_space_consistent(tier)
        for i in range(40):  # new records must land in holes, never on a live record
            objects[f"new{i}"] = _data(20_000 + i, 1000 + i)
            await tier.put(f"new{i}", objects[f"new{i}"])
        for key, value in objects.items():
            assert tier.size_of(key) == len(value)
            assert as_bytes(await tier.get(key)) == value
        assert tier.stats()["corruptions"] == 0
        await tier.aclose()

    _run(main)


@pytest.mark.parametrize("where", ["payload", "header", "padding-size"])
def test_a_flipped_byte_raises_corruption(tmp_path: Path, where: str) -> None:
    value = _data(10_000, 5)

    async def main() -> None:
        tier = await NvmeTier.open("nvme", 1 << 20, tmp_path, create=True)
        await tier.put("victim", value)
        await tier.put("bystander", value[:5000])
        located = tier.locate("victim")
        assert located is not None
        path, offset = located
        spot = {"payload": HEADER_BYTES + 5000, "header": 17, "padding-size": 9}[where]
        _flip(path, offset + spot)
        for _ in range(2):  # raised every time, never served
            with pytest.raises(CorruptionError) as info:
                await tier.get("victim")
            assert info.value.path == path and info.value.offset_bytes == offset
        with pytest.raises(CorruptionError):
            await tier.get("victim", byte_range=(0, 10), into=np.zeros(10, np.uint8))
        assert as_bytes(await tier.get("bystander")) == value[:5000]
        assert tier.stats()["corruptions"] == 3
        await tier.put("victim", value)  # an overwrite repairs it
        assert as_bytes(await tier.get("victim")) == value
        assert_space_consistent(tier)
        await tier.aclose()

    _run(main)


def test_holes_are_reused_so_files_do_not_grow(tmp_path: Path) -> None:
    async def churn(tier: NvmeTier, seed: int) -> None:
        rng = np.random.default_rng(seed)
        live = [key for key in sorted(tier.keys()) if key != "same"]
        for step in range(300):
            if len(live) > 8 or (live and rng.random() < 0.4):
                await tier.delete(live.pop(int(rng.integers(len(live)))))
            else:
                live.append(f"k{seed}-{step}")
                await tier.put(live[-1], _data(int(rng.integers(0, 90_000)), step))
        for _ in range(50):  # overwriting one key in place-sized steps
            await tier.put("same", _data(200_000, 1))

    async def main() -> None:
        tier = await NvmeTier.open(
            "nvme", 1 << 20, tmp_path, extent_file_bytes=256 * 1024, create=True
        )
        await churn(tier, 3)
        grown = tier.stats()
        assert grown["extent_files"] <= 4 and grown["extent_file_bytes"] <= 1 << 20
        await churn(tier, 4)  # the same load again finds room in the holes it leaves
        after = tier.stats()
        assert after["extent_files"] == grown["extent_files"]
        assert after["extent_file_bytes"] == grown["extent_file_bytes"]
        assert_space_consistent(tier)
        await tier.aclose()

    _run(main)
    sizes = {path.name: path.stat().st_size for path in tmp_path.glob("extents-*")}
    assert set(sizes.values()) == {256 * 1024}


def test_disk_space_is_taken_as_records_need_it(tmp_path: Path) -> None:
    """A tier far larger than the disk's free space opens at once, costs no space until records
    come, then grows in steps of at most 64 MiB: never all at once."""

    def disk_bytes() -> int:
        return sum(path.stat().st_blocks * 512 for path in tmp_path.glob("extents-*"))

    value = _data(3 << 20, 1)

    async def main() -> None:
        tier = await NvmeTier.open("nvme", 1 << 40, tmp_path, create=True)  # 1 TiB
        assert disk_bytes() == 0 and tier.stats()["extent_file_bytes"] == 0
        for i in range(25):  # 75 MiB: more than one growth step
            await tier.put(f"k{i}", value)
        used = disk_bytes()
        assert 75 << 20 < tier.stats()["extent_file_bytes"] <= used <= 129 << 20
        await tier.aclose()
        tier = await NvmeTier.open(
            "nvme", 1 << 40, tmp_path, create=True
        )  # reopened: the room is reused
        await tier.put("more", value)
        assert disk_bytes() == used and as_bytes(await tier.get("k24")) == value
        assert_space_consistent(tier)
        await tier.aclose()

    _run(main)


@pytest.mark.parametrize("fault", ["enospc", "eio_write", "eio_fsync"])
def test_a_failed_write_leaves_a_consistent_store(tmp_path: Path, fault: Any) -> None:
    async def main() -> None:
        engine = FaultyEngine(ThreadEngine(4))
        tier = await NvmeTier.open("nvme", 1 << 20, tmp_path, runtime=lease(engine), create=True)
        await tier.put("a", _data(30_000, 1))
        before = tier.stats()
        for key, size in (("b", 10_000), ("a", 50_000)):  # a new key, then an overwrite
            engine.fail_next(fault)
            with pytest.raises(NoSpaceError if fault == "enospc" else StorageError):
                await tier.put(key, _data(size, 2))
        after = tier.stats()
        for name in ("used_bytes", "objects", "extent_free_bytes", "extent_file_bytes"):
            assert after[name] == before[name], name
        assert sorted(tier.keys()) == ["a"] and tier.size_of("a") == 30_000
        assert as_bytes(await tier.get("a")) == _data(30_000, 1)
        await tier.put("b", _data(10_000, 3))  # and the store still works
        assert_space_consistent(tier)
        await tier.aclose()
        await engine.aclose()
        tier = await NvmeTier.open("nvme", 1 << 20, tmp_path, create=True)
        assert sorted(tier.keys()) == ["a", "b"]
        assert as_bytes(await tier.get("a")) == _data(30_000, 1)
        await tier.aclose()

    _run(main)


def test_a_failed_catalog_commit_changes_nothing(tmp_path: Path, monkeypatch: Any) -> None:
    real_commit = Catalog._commit_sync
    failures = [NoSpaceError(errno.ENOSPC, "LMDB: full", str(tmp_path))]

    def commit_or_fail(self: Catalog, *args: Any) -> None:
        if failures:
            raise failures.pop()
        real_commit(self, *args)

    async def main() -> None:
        tier = await NvmeTier.open("nvme", 1 << 20, tmp_path, create=True)
        await tier.put("a", _data(30_000, 1))
        monkeypatch.setattr(Catalog, "_commit_sync", commit_or_fail)
        with pytest.raises(NoSpaceError):
            await tier.put("a", _data(50_000, 2))  # the record was written and synced, in vain
        assert as_bytes(await tier.get("a")) == _data(30_000, 1)
        assert_space_consistent(tier)
        await tier.put("a", _data(50_000, 2))
        await tier.aclose()
        tier = await NvmeTier.open("nvme", 1 << 20, tmp_path, create=True)
        assert as_bytes(await tier.get("a")) == _data(50_000, 2)
        await tier.aclose()

    _run(main)


class _FullDiskEnv(Env):
    """posix_fallocate fails with ENOSPC once ``allocations_left`` reaches zero."""

    def __init__(self, allocations_left: int) -> None:
        self.allocations_left = allocations_left

    def allocate(self, fd: int, offset_bytes: int, size_bytes: int) -> None:
        if self.allocations_left <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.allocations_left -= 1
        super().allocate(fd, offset_bytes, size_bytes)


def test_no_space_for_a_new_extent_file(tmp_path: Path) -> None:
    async def main() -> None:
        engine = ThreadEngine(4, env=_FullDiskEnv(0))
        tier = await NvmeTier.open(
            "nvme", 64 * 1024, tmp_path / "a", runtime=lease(engine), create=True
        )
        with pytest.raises(NoSpaceError):  # opening takes no space; the first record does
            await tier.put("a", _data(1000, 1))
        assert tier.size_of("a") is None and tier.stats()["extent_file_bytes"] == 0
        await tier.aclose()

        engine.env = _FullDiskEnv(1)  # room for the first file's growth, not for another
        tier = await NvmeTier.open(
            "nvme", 64 * 1024, tmp_path / "b", runtime=lease(engine), create=True
        )
        await tier.put("a", _data(40_000, 1))
        with pytest.raises(NoSpaceError):  # old and new record together need a second file
            await tier.put("a", _data(60_000, 2))
        assert as_bytes(await tier.get("a")) == _data(40_000, 1)
        assert_space_consistent(tier)
        await tier.delete("a")
        await tier.put("a", _data(60_000, 2))  # fits once the old record is gone
        assert as_bytes(await tier.get("a")) == _data(60_000, 2)
        await tier.aclose()
        await engine.aclose()

    _run(main)


class _GatedReads(FaultyEngine):
    """Holds every read until ``gate`` is set (to pin a get in the middle of its read)."""

    def __init__(self, inner: ThreadEngine) -> None:
        super().__init__(inner, track_writes=False)
        self.gate = asyncio.Event()
        self.gate.set()
        self.read_waiting = asyncio.Event()

    async def run(self, batch: IOBatch) -> None:
        if batch.op == READ and not self.gate.is_set():
            self.read_waiting.set()
            await self.gate.wait()
        await super().run(batch)


def test_an_overwrite_does_not_reuse_an_extent_being_read(tmp_path: Path) -> None:
    old, new = _data(20_000, 1), _data(20_000, 2)

    async def main() -> None:
        engine = _GatedReads(ThreadEngine(4))
        tier = await NvmeTier.open("nvme", 1 << 20, tmp_path, runtime=lease(engine), create=True)
        await tier.put("k", old)
        old_place = tier.locate("k")
        engine.gate.clear()
        reader = asyncio.ensure_future(tier.get("k"))
        await engine.read_waiting.wait()
        await tier.put("k", new)  # commits while the read of the old record is in flight
        assert tier.stats()["extent_frees_deferred"] == 1
        await tier.put("other", _data(20_000, 3))  # same size: would take the old extent
        assert tier.locate("other") != old_place
        engine.gate.set()
        assert as_bytes(await reader) == old
        assert as_bytes(await tier.get("k")) == new
        assert_space_consistent(tier)
        await tier.aclose()
        await engine.aclose()

    _run(main)


def test_concurrent_gets_and_overwrites_of_one_key(tmp_path: Path) -> None:
    values = [_data(1000 + 3000 * i, i) for i in range(12)]

    async def main() -> None:
        tier = await NvmeTier.open("nvme", 1 << 20, tmp_path, create=True)
        await tier.put("k", values[0])
        jobs: list[Awaitable[Any]] = []
        for i, value in enumerate(values[1:], 1):
            jobs.append(tier.put("k", value))
            jobs.extend(tier.get("k") for _ in range(i % 4 + 1))
            if i % 5 == 0:
                jobs.append(tier.delete("k"))
        results = await asyncio.gather(*jobs)
        allowed = {v for v in values}
        for got in results:
            if got is not None and not isinstance(got, bool):
                assert as_bytes(got) in allowed
        assert_space_consistent(tier)
        await tier.aclose()

    _run(main)


def test_a_cancelled_put_commits_whole_or_not_at_all(tmp_path: Path) -> None:
    async def main() -> None:
        tier = await NvmeTier.open("nvme", 4 << 20, tmp_path, create=True)
        for delay in range(12):
            task = asyncio.ensure_future(tier.put(f"k{delay}", _data(100_000, delay)))
            for _ in range(delay):
                await asyncio.sleep(0)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        await tier.aclose()  # waits for the shielded puts
        tier = await NvmeTier.open("nvme", 4 << 20, tmp_path, create=True)
        for key in sorted(tier.keys()):
            assert as_bytes(await tier.get(key)) == _data(100_000, int(key[1:]))
        assert_space_consistent(tier)
        await tier.aclose()

    _run(main)


def test_large_objects_and_chunked_transfers(tmp_path: Path, monkeypatch: Any) -> None:
    big = _data(3 << 20, 7)

    async def main() -> None:
        tier = await NvmeTier.open(
            "nvme", 8 << 20, tmp_path, extent_file_bytes=2 << 20, create=True
        )
        await tier.put("big", big)  # larger than one extent file: gets a file of its own
        assert as_bytes(await tier.get("big")) == big
        part = await tier.get("big", byte_range=(12345, 1 << 20))  # a copy of a small part
        assert as_bytes(part) == big[12345 : 12345 + (1 << 20)]
        most = await tier.get("big", byte_range=(7, len(big) - 100))  # a view of the record
        assert as_bytes(most) == big[7:-93]
        monkeypatch.setattr(nvme_records, "_CHUNK_BYTES", 64 * 1024)  # exercise the batch path
        await tier.put("chunked", big[:1_000_000])
        assert as_bytes(await tier.get("chunked")) == big[:1_000_000]
        assert_space_consistent(tier)
        await tier.aclose()

    _run(main)


def test_damaged_catalog_entries_raise_and_can_be_deleted(tmp_path: Path) -> None:
    async def main() -> None:
        options = {"extent_file_bytes": 16 * 1024}
        tier = await NvmeTier.open("nvme", 64 * 1024, tmp_path, **options, create=True)
        for i in range(8):
            await tier.put(f"k{i}", _data(7000, i))  # two pages each: two per file
        last_file = tier.locate("k7")
        await tier.aclose()
        assert last_file is not None
        os.truncate(last_file[0], 0)  # the file under k6 and k7 loses its contents

        tier = await NvmeTier.open("nvme", 64 * 1024, tmp_path, **options, create=True)
        assert tier.stats()["damaged_entries"] == 2
        for key in ("k6", "k7"):
            with pytest.raises(CorruptionError):
                await tier.get(key)
        for i in range(6):
            assert as_bytes(await tier.get(f"k{i}")) == _data(7000, i)
        assert await tier.delete("k6")
        await tier.put("k7", _data(100, 7))
        assert as_bytes(await tier.get("k7")) == _data(100, 7)
        assert tier.stats()["damaged_entries"] == 0
        await tier.aclose()

    _run(main)


class _NoDirectEnv(Env):
    """A filesystem that refuses O_DIRECT the way Linux does (EINVAL at open)."""

    def open(self, path: str, flags: int, mode: int = 0o644) -> int:
        if flags & self.direct_flag():
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL), path)
        return super().open(path, flags, mode)


def test_a_filesystem_without_direct_io(tmp_path: Path) -> None:
    async def main() -> None:
        engine = ThreadEngine(4, env=_NoDirectEnv())
        with pytest.raises(DirectIOUnsupportedError):
            await NvmeTier.open("nvme", 1 << 20, tmp_path, runtime=lease(engine), create=True)
        tier = await NvmeTier.open(
            "nvme", 1 << 20, tmp_path, runtime=lease(engine), direct=False, create=True
        )
        await tier.put("k", b"buffered")
        assert as_bytes(await tier.get("k")) == b"buffered"
        await tier.aclose()
        await engine.aclose()

    _run(main)


def test_unusable_directories(tmp_path: Path) -> None:
    (tmp_path / "file").write_bytes(b"x")

    async def main() -> None:
        with pytest.raises(InvalidArgumentError, match="not a directory"):
            await NvmeTier.open("nvme", 1 << 20, tmp_path / "file", create=True)
        tier = await NvmeTier.open("nvme", 1 << 20, tmp_path / "d", create=True)
        with pytest.raises(StorageError) as info:  # one tier per directory
            await NvmeTier.open("nvme", 1 << 20, tmp_path / "d", create=True)
        assert info.value.errno == errno.EBUSY
        await tier.aclose()
        if os.geteuid() != 0:  # root ignores directory permissions
            (tmp_path / "ro").mkdir(mode=0o500)
            with pytest.raises(PermissionDeniedError):
                await NvmeTier.open("nvme", 1 << 20, tmp_path / "ro", create=True)

    _run(main)


def test_a_closed_tier_refuses_calls(tmp_path: Path) -> None:
    async def main() -> None:
        tier = await NvmeTier.open("nvme", 1 << 20, tmp_path, create=True)
        await tier.put("k", b"v")
        await tier.aclose()
        await tier.aclose()  # idempotent
        for call in (tier.get("k"), tier.put("k", b"w"), tier.delete("k")):
            with pytest.raises(EngineClosedError):
                await call
        with pytest.raises(EngineClosedError):
            tier.size_of("k")

    _run(main)


def test_stats_count_what_happened(tmp_path: Path) -> None:
    async def main() -> None:
        tier = await NvmeTier.open("nvme", 1 << 20, tmp_path, create=True)
        await tier.put("k", _data(5000, 1))
        await tier.get("k")
        await tier.get("missing")
        stats = tier.stats()
        assert stats["kind"] == "nvme" and tier.supports_persistence
        assert (stats["gets"], stats["hits"], stats["misses"], stats["puts"]) == (2, 1, 1, 1)
        assert stats["bytes_written"] == stats["bytes_read"] == record_bytes(5000)
        assert tier.estimated_read_s(1_500_000_000) == pytest.approx(1.0001)
        await tier.aclose()

    _run(main)


@pytest.mark.parametrize(
    ("capacity", "file_bytes"),
    [
        (1 << 20, 1 << 20),
        (8 << 30, 256 << 20),
        (1 << 40, 4 << 30),
        ((1 << 40) + 1, (4 << 30) + 4096),
    ],
)
def test_default_extent_files_keep_a_full_tier_to_about_256(capacity: int, file_bytes: int) -> None:
    tier = NvmeTier("nvme", capacity, "/nonexistent")  # not started: nothing touched
    assert tier.extent_file_bytes == file_bytes
    assert -(-capacity // tier.extent_file_bytes) <= 256
    with pytest.raises(InvalidArgumentError):
        NvmeTier("nvme", capacity, "/nonexistent", extent_file_bytes="big")  # type: ignore[arg-type]


def test_opening_a_path_that_holds_no_tier_is_an_error(tmp_path: Path) -> None:
    """A mistyped path used to become a new, empty tier: the user's data looked lost."""

    async def refused(path: Path) -> None:
        with pytest.raises(FileMissingError, match="no NVMe tier") as info:
            await NvmeTier.open("nvme", 1 << 20, path)
        assert info.value.filename == str(path)

    for path in (tmp_path / "typo", tmp_path):
        asyncio.run(refused(path))
    assert not (tmp_path / "typo").exists() and list(tmp_path.iterdir()) == []

    async def made_then_reopened() -> None:
        tier = await NvmeTier.open("nvme", 1 << 20, tmp_path / "made", create=True)
        await tier.put("k", b"x" * 10)
        await tier.aclose()
        tier = await NvmeTier.open("nvme", 1 << 20, tmp_path / "made")  # exists: no flag
        assert as_bytes(await tier.get("k")) == b"x" * 10
        await tier.aclose()

    asyncio.run(made_then_reopened())
