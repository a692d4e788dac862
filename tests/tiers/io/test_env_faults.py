"""FaultyEnv: short transfers drive the thread engine's resume loop (data stays byte-exact), OS
errors surface typed, and a refused io_uring makes create_engine fall back (or refuse)."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
from pathlib import Path

import numpy as np
import pytest

from tiers import (
    DirectIOUnsupportedError,
    EngineUnavailableError,
    NoSpaceError,
    StorageError,
    ThreadEngine,
    aligned_empty,
    create_engine,
)
from tiers.testing.faulty_env import FaultyEnv

SIZE = 256 * 1024


def _data(size: int, seed: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()


def test_short_transfers_are_resumed_byte_exact(tmp_path: Path) -> None:
    env = FaultyEnv(seed=1, short_transfer_rate=1.0)  # every call comes back short
    payload = _data(SIZE, 1)
    path = tmp_path / "short.bin"

    async def main() -> tuple[bytes, list[int], dict[str, int]]:
        async with ThreadEngine(4, env=env) as engine:
            file = await engine.open(path, create=True)
            assert await engine.write_from(file, 0, payload) == SIZE
            buffer = np.zeros(SIZE, np.uint8)
            results = await engine.read_batch(file, buffer, np.arange(0, SIZE, 64 * 1024), 65536)
            return buffer.tobytes(), results.tolist(), engine.stats()

    got, results, stats = asyncio.run(main())
    assert results == [65536] * 4
    assert got == payload
    assert path.read_bytes() == payload
    assert env.injected["short_read"] > 4 and env.injected["short_write"] > 1
    resumed = env.injected["short_read"] + env.injected["short_write"]
    # <=, not ==: ThreadEngine bumps the counter from several workers without a lock
    assert 0 < stats["short_transfers_resumed"] <= resumed
    fd = os.open(path, os.O_RDONLY)
    try:  # the short-transfer rate never turns an fsync into a fault
        env.fsync(fd)
        env.fdatasync(fd)
    finally:
        os.close(fd)
    assert "eio_fsync" not in env.injected


def test_short_reads_at_eof_still_report_eof(tmp_path: Path) -> None:
    env = FaultyEnv(seed=2, short_transfer_rate=0.5)
    content = _data(10_000, 2)
    path = tmp_path / "eof.bin"
    path.write_bytes(content)

    async def main() -> tuple[int, bytes]:
        async with ThreadEngine(2, env=env) as engine:
            file = await engine.open(path)
            buffer = bytearray(16_384)
            done = await engine.read_into(file, 0, buffer)
            return done, bytes(buffer[:done])

    done, got = asyncio.run(main())
    assert done == 10_000 and got == content


def test_short_transfers_on_o_direct_stay_aligned(tmp_path: Path) -> None:
    env = FaultyEnv(seed=3, short_transfer_rate=1.0)
    payload = _data(SIZE, 3)
    path = tmp_path / "direct.bin"

    async def main() -> bytes:
        async with ThreadEngine(2, env=env) as engine:
            try:
                file = await engine.open(path, create=True, direct=True)
            except DirectIOUnsupportedError:
                pytest.skip("the filesystem of tmp_path refuses O_DIRECT")
            source = aligned_empty(SIZE)
            source[:] = np.frombuffer(payload, np.uint8)
            assert await engine.write_from(file, 0, source) == SIZE
            target = aligned_empty(SIZE)
            assert await engine.read_into(file, 0, target) == SIZE
            return target.tobytes()

    assert asyncio.run(main()) == payload
    assert env.injected["short_read"] > 0 and env.injected["short_write"] > 0


def test_os_errors_surface_typed_with_path_and_offset(tmp_path: Path) -> None:
    env = FaultyEnv()
    path = tmp_path / "err.bin"
    path.write_bytes(_data(8192, 4))

    async def main() -> None:
        async with ThreadEngine(2, env=env) as engine:
            file = await engine.open(path, write=True)
            env.fail_next("eio_read")
            with pytest.raises(StorageError) as info:
                await engine.read_into(file, 4096, bytearray(4096))
            assert info.value.errno == errno.EIO
            assert info.value.filename == str(path) and info.value.offset_bytes == 4096
            env.fail_next("enospc")
            with pytest.raises(NoSpaceError) as nospace:
                await engine.write_from(file, 0, b"z" * 100)
            assert nospace.value.batch_results == [nospace.value]
            await engine.read_into(file, 0, bytearray(10))  # triggers are one-shot

    asyncio.run(main())
    assert env.injected == {"eio_read": 1, "enospc": 1}


def test_fsync_goes_through_the_env(tmp_path: Path) -> None:
    env = FaultyEnv()
    path = tmp_path / "sync.bin"

    async def main() -> None:
        async with ThreadEngine(2, env=env) as engine:
            file = await engine.open(path, create=True)
            env.fail_next("eio_fsync")
            with pytest.raises(StorageError) as info:
                await engine.fsync(file)
            assert info.value.errno == errno.EIO and info.value.filename == str(path)
            await engine.fsync(file, datasync=True)  # the trigger is spent

    asyncio.run(main())
    assert env.injected == {"eio_fsync": 1}


def test_refused_io_uring_falls_back_to_threads_with_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    env = FaultyEnv(io_uring_errno=errno.EPERM)
    with caplog.at_level(logging.WARNING, logger="tierkit.tiers"):
        engine = create_engine("auto", env=env)
    assert isinstance(engine, ThreadEngine) and engine.env is env
    records = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(records) == 1
    message = records[0].getMessage()
    assert "\n" not in message and "io_uring unavailable" in message
    assert "Operation not permitted" in message
    assert env.injected["io_uring_setup"] >= 1
    asyncio.run(engine.aclose())


def test_refused_io_uring_is_an_error_when_asked_for_by_name() -> None:
    env = FaultyEnv(io_uring_errno=errno.EPERM)
    with pytest.raises(EngineUnavailableError) as info:
        create_engine("uring", env=env)
    assert info.value.backend == "io_uring"
    assert "Operation not permitted" in info.value.reason


def test_env_faults_leave_other_calls_alone(tmp_path: Path) -> None:
    env = FaultyEnv(io_uring_errno=errno.EACCES)
    path = tmp_path / "ok.bin"

    async def main() -> None:
        async with ThreadEngine(2, env=env) as engine:
            file = await engine.open(path, create=True)
            await engine.write_from(file, 0, b"fine")
            await engine.fsync(file, datasync=True)

    asyncio.run(main())
    assert path.read_bytes() == b"fine"
    assert not env.injected  # io_uring_setup was never called


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_held_directory_lock_and_a_failed_mkdir_come_through_the_env(tmp_path: Path) -> None:
    """The directory lock and the tier directory's creation go through the Env: a lock held by
    another owner is EBUSY, an EIO is a typed error naming the directory, no descriptor leaks,
    and the next open works."""
    from tiers import IORuntime, NvmeTier

    env = FaultyEnv()

    async def main() -> None:
        async with ThreadEngine(2, env=env) as engine:
            runtime = IORuntime(engine=lambda *_: engine)
            runtime.acquire_engine()  # the test's lease: a failed open must not close it
            before = _open_fds()
            for kind, code in (("lock_held", errno.EBUSY), ("eio_namespace", errno.EIO)):
                env.fail_next(kind)  # type: ignore[arg-type]
                with pytest.raises(StorageError) as info:
                    await NvmeTier.open("n", 1 << 20, tmp_path / "t", runtime=runtime, create=True)
                assert info.value.errno == code and info.value.filename == str(tmp_path / "t")
                assert _open_fds() == before
            tier = await NvmeTier.open("n", 1 << 20, tmp_path / "t", runtime=runtime, create=True)
            await tier.put("k", b"v")
            await tier.aclose()
            await runtime.release_engine(engine)
        runtime.close()
        assert env.injected["lock_held"] == 1 and env.injected["eio_namespace"] == 1

    asyncio.run(main())


def test_a_failed_log_cleanup_leaves_a_checkpointed_index_whole(tmp_path: Path) -> None:
    """A checkpoint lists and unlinks old log segments through the Env; EIO there fails the
    call typed, and the index (checkpoint written, old segment still there) reopens whole."""
    from tiers import IORuntime
    from vectordb import IndexConfig, SpannIndex

    env = FaultyEnv()
    vectors = np.random.default_rng(3).normal(size=(300, 8)).astype(np.float32)

    async def main() -> None:
        runtime = IORuntime(engine="thread", queue_depth=2, env=env)
        index = await SpannIndex.create(tmp_path / "i", IndexConfig(dim=8), runtime=runtime)
        await index.build(None, vectors)
        await index.insert(np.array([1000]), vectors[:1] + 1)
        env.fail_next("eio_namespace")
        with pytest.raises(StorageError) as info:
            await index.checkpoint()
        assert info.value.errno == errno.EIO
        await index.aclose()
        reopened = await SpannIndex.open(tmp_path / "i", runtime=runtime)
        assert reopened.stats()["n_vectors"] == 301
        ids, _ = await reopened.search(vectors[:1] + 1, 1)
        assert ids[0, 0] == 1000
        await reopened.aclose()
        runtime.close()
        assert env.injected["eio_namespace"] == 1

    asyncio.run(main())
