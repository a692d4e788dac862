"""SpannIndex crash consistency: simulated power cuts (FaultyEngine) at many points of a run of
inserts (with splits) and deletes, and a real ``kill -9`` of a writer process. After each
crash the reopened index must find every acknowledged insert and never return an acknowledged
delete; the one operation in flight may have landed or not. A corrupt page is a typed error."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from tests.vectordb import crash_writer as writer
from tests.vectordb.helpers import clustered, flip_byte, run_and_kill, run_until_power_cut
from tiers.io.errors import CorruptionError
from vectordb import IndexConfig, SearchParams, SpannIndex
from vectordb.index import POSTINGS_FILE

EVERYTHING = SearchParams(max_postings=100_000, prune_ratio=1e9)
CONFIG = IndexConfig(dim=writer.DIM, posting_limit=32, merge_threshold=3, reassign_neighbours=8)


async def _create(directory: Path) -> None:
    async with await SpannIndex.create(directory, CONFIG) as index:
        await index.build(np.arange(300), clustered(300, writer.DIM, seed=0))


async def _check(directory: Path, ops: list[writer.Op], acked: int) -> None:
    """Every insert among the first ``acked`` ops is found (unless deleted later); no deleted
    id comes back; the op after them may or may not have happened."""
    live: dict[int, np.ndarray] = {i: v for i, v in enumerate(clustered(300, writer.DIM, seed=0))}
    for kind, ids, vectors in ops[:acked]:
        if kind == "insert":
            assert vectors is not None
            live.update(zip(ids.tolist(), vectors, strict=True))
        else:
            for i in ids.tolist():
                live.pop(i, None)
    maybe: set[int] = set()
    if acked < len(ops):
        kind, ids, _ = ops[acked]
        maybe = set(ids.tolist())
    async with await SpannIndex.open(directory) as index:
        ids = np.array(sorted(live))
        found, _scores = await index.search(np.stack([live[i] for i in ids]), 1, EVERYTHING)
        lost = ids[found[:, 0] != ids]
        assert not set(lost.tolist()) - maybe, f"acknowledged inserts lost: {lost[:10]}"
        everything = set(live) | maybe
        probe = clustered(50, writer.DIM, seed=1)
        near, _ = await index.search(probe, 20, EVERYTHING)
        assert set(near[near >= 0].tolist()) <= everything, "a deleted id came back"
        assert abs(index.stats()["n_vectors"] - len(live)) <= len(maybe)


@pytest.mark.parametrize("seed", [1, 2])
def test_power_cut_at_many_points_keeps_every_acknowledged_update(
    tmp_path: Path, seed: int
) -> None:
    ops = writer.schedule(seed)[:16]

    async def run_op(index: SpannIndex, op: writer.Op) -> None:
        kind, ids, vectors = op
        if kind == "insert":
            await index.insert(ids, vectors)
        else:
            await index.delete(ids)

    async def run(directory: Path, cut_at: int) -> tuple[int, int]:
        acked, starts = await run_until_power_cut(directory, ops, run_op, cut_at, seed=seed)
        return acked, starts[-1]

    async def main() -> None:
        dry = tmp_path / "dry"
        await _create(dry)
        _, total = await run(dry, 10**9)
        rng = np.random.default_rng(seed)
        points = sorted({2, total - 1, *rng.choice(np.arange(3, total - 1), 4).tolist()})
        for cut_at in points:
            directory = tmp_path / f"cut{cut_at}"
            await _create(directory)
            acked, _ = await run(directory, int(cut_at))
            await _check(directory, ops, acked)

    asyncio.run(main())


def _run_and_kill(directory: Path, seed: int, acks_before_kill: int, delay_s: float) -> int:
    return run_and_kill(Path(writer.__file__), directory, seed, acks_before_kill, delay_s)


def test_kill_9_of_a_writer_loses_no_acknowledged_update(tmp_path: Path) -> None:
    directory = tmp_path / "index"
    asyncio.run(_create(directory))
    acked = _run_and_kill(directory, seed=5, acks_before_kill=25, delay_s=0.05)
    asyncio.run(_check(directory, writer.schedule(5), acked))


def test_a_flipped_byte_in_a_posting_page_is_skipped_or_raised(tmp_path: Path) -> None:
    async def main() -> None:
        await _create(tmp_path / "i")
        path = tmp_path / "i" / POSTINGS_FILE
        flip_byte(path, 100)  # the first list starts at page 0
        async with await SpannIndex.open(tmp_path / "i") as index:
            strict = SearchParams(max_postings=100_000, prune_ratio=1e9, strict=True)
            with pytest.raises(CorruptionError, match="posting list 0"):
                await index.search(clustered(20, writer.DIM, seed=0), 5, strict)
            result = await index.search(clustered(20, writer.DIM, seed=0), 5, EVERYTHING)
            assert result.skipped_lists.tolist() == [0]

    asyncio.run(main())
