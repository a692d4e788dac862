"""PackedStrings: a batch's string rows as bytes plus offsets equal the list they replace, and
with worker processes they reach the transform through the shared slab, not the pipe."""

from __future__ import annotations

import asyncio
import pickle
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dataload import ParquetSource, ShuffledLoader
from dataload.packed_strings import PackedStrings, pack_rows
from dataload.workers.fetcher import _detach
from dataload.workers.shm import ShmSlabPool
from tiers.io import default_runtime

WORDS = ["", "a", "é", "日本語 text", "x" * 300, "line\nbreak"]


def _values(n: int) -> list[str]:
    return [WORDS[i % len(WORDS)] + str(i) * (i % 3) for i in range(n)]


def test_pack_rows_equals_the_list_and_pickles() -> None:
    texts, raw = _values(40), [b"\x00\xff", b"", b"bin"] * 5
    pieces = {
        "t": ([memoryview(v.encode()) for v in texts], True),
        "b": ([memoryview(v) for v in raw], False),
    }
    data, columns = pack_rows(pieces, lambda size: np.empty(size, np.uint8))
    assert len(data) == sum(len(v.encode()) for v in texts) + sum(map(len, raw))
    for values, column in ((texts, columns["t"]), (raw, columns["b"])):
        assert len(column) == len(values)
        assert list(column) == column.tolist() == values
        assert [column[j] for j in (-1, 0, 7)] == [values[j] for j in (-1, 0, 7)]
        assert pickle.loads(pickle.dumps(column)).tolist() == values
        detached = column.detached()
        with pytest.raises(ValueError, match="attach"):
            detached[0]
        assert detached.attached(np.frombuffer(data.tobytes(), np.uint8)).tolist() == values


def test_worker_task_carries_offsets_not_bytes(tmp_path: Path) -> None:
    """The task sent to a worker names the slab; its pickle is far smaller than the text."""
    texts = ["word " * 200 + str(i) for i in range(256)]  # ~1 KB a row
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"text": texts}), path, row_group_size=64)
    source, slabs = ParquetSource(path), ShmSlabPool(4)
    try:
        batch = _read(source, slabs, np.arange(0, 256, 4))
        column = batch.columns["text"]
        assert isinstance(column, PackedStrings) and column.data is batch.data
        sent = _detach(batch.columns, batch.data)
        assert len(pickle.dumps(sent)) < 2_000 < 64 * 1_000
        received = sent["text"].attached(np.frombuffer(batch.data.tobytes(), np.uint8))
        assert received.tolist() == [texts[i] for i in range(0, 256, 4)]
    finally:
        slabs.clear()


def test_rows_through_worker_processes_exactly_once(tmp_path: Path) -> None:
    values = _values(700)
    path = tmp_path / "w.parquet"
    pq.write_table(pa.table({"v": values, "i": list(range(700))}), path, row_group_size=64)
    source = ParquetSource(path)
    with ShuffledLoader(source, 50, seed=3, transform=_pair, num_workers=2) as loader:
        batches = list(loader)
    got = [(int(i), v) for ids, texts in batches for i, v in zip(ids, texts, strict=True)]
    assert sorted(got) == list(enumerate(values))


def _pair(sample: dict) -> tuple[int, str]:
    """Runs in the worker: the row as (id, text), the text decoded there."""
    return int(sample["i"]), sample["v"]


def _read(source: ParquetSource, slabs: ShmSlabPool, indices: np.ndarray):
    """One ``source.read`` on a runtime's engine, as the process fetcher does it."""
    runtime = default_runtime()

    async def go():
        engine = runtime.acquire_engine()
        try:
            await source.open(engine)
            try:
                return await source.read(indices, slabs)
            finally:
                await source.close()
        finally:
            await runtime.release_engine(engine)

    return asyncio.run_coroutine_threadsafe(go(), runtime.loop).result(30)
