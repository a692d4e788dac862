"""Reopening an index whose write-ahead log was damaged after a crash: a flipped byte before the
last record stops the open with CorruptionError naming the segment (the acknowledged inserts
after it are not dropped as a torn tail); one in the last record reads as a torn append."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from tests.vectordb.helpers import clustered
from tiers.io import IORuntime, ThreadEngine
from tiers.io.errors import CorruptionError
from tiers.testing.faulty_engine import FaultyEngine
from vectordb import IndexConfig, SpannIndex
from vectordb.wal import list_segments, read_segment, segment_name

DIM = 8
CONFIG = IndexConfig(dim=DIM, posting_limit=16, merge_threshold=3, checkpoint_wal_bytes=1 << 30)
BUILT, BATCH, BATCHES = 100, 5, 4


async def _crash_after_inserts(directory: Path, new_segment_after: int | None = None) -> list[Path]:
    """Build, insert BATCHES batches (one log record each; with ``new_segment_after``, the
    batches after that one go to a new log segment), lose power. Returns the segments, oldest
    first."""
    engine = FaultyEngine(ThreadEngine(2))
    runtime = IORuntime(engine=lambda *_: engine)
    index = await SpannIndex.create(directory, CONFIG, runtime=runtime)
    await index.build(np.arange(BUILT), clustered(BUILT, DIM, seed=0))
    for k in range(BATCHES):
        ids = np.arange(BUILT + k * BATCH, BUILT + (k + 1) * BATCH)
        await index.insert(ids, clustered(BATCH, DIM, seed=k + 1))
        if k == new_segment_after:
            await index.wal.start_segment(index.wal.seq + 1)
    await engine.power_cut()
    await index.aclose()  # no checkpoint: the engine is dead
    await engine.aclose()
    runtime.close()
    return [directory / segment_name(seq) for seq in list_segments(str(directory))]


@pytest.mark.parametrize("record", [0, BATCHES - 2, BATCHES - 1])
def test_a_flipped_log_byte_on_reopen(tmp_path: Path, record: int) -> None:
    async def main() -> None:
        segment = (await _crash_after_inserts(tmp_path / "index"))[-1]
        records, valid = read_segment(str(segment), DIM, np.float32)
        assert len(records) == BATCHES and valid == segment.stat().st_size
        record_bytes = valid // BATCHES  # equal batches: equal records
        data = bytearray(segment.read_bytes())
        data[record * record_bytes + 40] ^= 0x10  # in the record's ids
        segment.write_bytes(bytes(data))
        if record < BATCHES - 1:
            with pytest.raises(CorruptionError) as info:
                await SpannIndex.open(tmp_path / "index")
            assert info.value.path == str(segment)
            assert info.value.offset_bytes == record * record_bytes
            return
        async with await SpannIndex.open(tmp_path / "index") as index:  # a torn last append
            assert index.stats()["n_vectors"] == BUILT + (BATCHES - 1) * BATCH

    asyncio.run(main())


def test_a_lost_log_segment_is_an_error_not_a_silent_gap(tmp_path: Path) -> None:
    """A segment removed from the middle of the log (its records acknowledged) stops the open
    with CorruptionError naming it; the log's LSNs must run on from the checkpoint's."""

    async def main() -> None:
        segments = await _crash_after_inserts(tmp_path / "index", new_segment_after=0)
        assert len(segments) == 2
        lost = segments[0]
        lost.unlink()
        with pytest.raises(CorruptionError, match="missing") as info:
            await SpannIndex.open(tmp_path / "index")
        assert info.value.path == str(lost)

    asyncio.run(main())


def test_records_lost_from_the_start_of_the_log_are_an_error(tmp_path: Path) -> None:
    """The first segment emptied (its records gone, the file kept): the next record's LSN is
    not the one the checkpoint expects."""

    async def main() -> None:
        segments = await _crash_after_inserts(tmp_path / "index", new_segment_after=0)
        segments[0].write_bytes(b"")
        with pytest.raises(CorruptionError, match="LSN") as info:
            await SpannIndex.open(tmp_path / "index")
        assert info.value.path == str(segments[1])

    asyncio.run(main())
