"""DecodePool: jobs run smallest priority first, errors and cancellation behave as futures do,
and ParquetSource gives the earliest read's decoding the CPUs first."""

from __future__ import annotations

import pickle
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dataload import ParquetSource, ShuffledLoader, read_samples
from dataload.decode_pool import DecodePool
from tiers.io import EngineClosedError, InvalidArgumentError

pytestmark = pytest.mark.usefixtures("no_thread_leak")


def test_waiting_jobs_run_smallest_priority_first() -> None:
    pool = DecodePool(1, name="tierkit-decode-test")
    gate, started = threading.Event(), threading.Event()
    ran: list[int] = []

    def hold() -> bool:
        started.set()
        return gate.wait(10)

    try:
        first = pool.submit(9, hold)  # occupies the one thread while the rest queue
        # the thread must hold it before the rest arrive: a job still queued would run after
        # them (its priority is the largest), and the queue would drain past 5 unseen
        assert started.wait(10)
        futures = [pool.submit(p, ran.append, p) for p in (5, 1, 3, 1, 7)]
        while pool.queued < 5:
            time.sleep(0.001)
        gate.set()
        for future in [first, *futures]:
            future.result(10)
        assert ran == [1, 1, 3, 5, 7]
    finally:
        pool.close()


def test_errors_cancellation_and_close() -> None:
    pool = DecodePool(1, name="tierkit-decode-test")
    gate = threading.Event()
    blocker = pool.submit(0, gate.wait, 10)
    skipped = pool.submit(1, pytest.fail, "a cancelled job ran")
    failing = pool.submit(2, int, "not a number")
    assert skipped.cancel()
    gate.set()
    with pytest.raises(ValueError, match="not a number"):
        failing.result(10)
    assert blocker.result(10) is True
    queued = [pool.submit(5, gate.wait, 10) for _ in range(3)]
    pool.close()
    assert all(f.cancelled() or f.done() for f in queued)
    with pytest.raises(EngineClosedError, match="closed"):
        pool.submit(0, int, "1")
    assert not [t for t in threading.enumerate() if t.name == "tierkit-decode-test"]
    with pytest.raises(InvalidArgumentError):
        DecodePool(0)


def test_parquet_decodes_the_earliest_read_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With deep prefetch every batch misses groups at once; the decode jobs must run in the
    order of the reads that need them (the first batch's before the later ones')."""
    path = tmp_path / "t.parquet"
    rows = 2_000
    table = pa.table({"id": list(range(rows)), "text": [f"row {i}" * (i % 7) for i in range(rows)]})
    pq.write_table(table, path, row_group_size=50)  # 40 groups
    submitted: list[int] = []
    original = DecodePool.submit

    def recording(self, priority, fn, *args):
        submitted.append(priority)
        return original(self, priority, fn, *args)

    monkeypatch.setattr(DecodePool, "submit", recording)
    source = ParquetSource(path)
    with ShuffledLoader(source, 64, seed=1, prefetch_batches=6) as loader:
        ids = [int(i) for batch in loader for i in batch["id"]]
        pickle.loads(pickle.dumps(source))  # an open source still pickles (for workers)
    assert sorted(ids) == list(range(rows))
    # each read's jobs carry its sequence number: earlier reads get smaller numbers
    assert len(set(submitted)) > 1, submitted
    firsts = [submitted.index(p) for p in sorted(set(submitted))]
    assert firsts == sorted(firsts), submitted


@pytest.mark.parametrize("kind", [pa.string(), pa.large_string(), pa.binary(), pa.large_binary()])
def test_parquet_string_rows_equal_pyarrow_to_pylist(tmp_path: Path, kind: pa.DataType) -> None:
    """Rows of null-free string/binary columns are decoded per row from the group's buffers
    (multi-byte UTF-8, empty values); columns with nulls keep the per-group list."""
    words = ["", "a", "é", "日本語 text", "x" * 300, "line\nbreak"]
    values = [words[i % len(words)] + str(i) * (i % 3) for i in range(700)]
    if kind in (pa.binary(), pa.large_binary()):
        values = [v.encode() for v in values]  # type: ignore[misc]
    with_nulls = [None if i % 11 == 0 else v for i, v in enumerate(values)]
    table = pa.table({"v": pa.array(values, kind), "n": pa.array(with_nulls, kind)})
    path = tmp_path / "s.parquet"
    pq.write_table(table, path, row_group_size=64)
    indices = [699, 0, 5, 64, 63, 128, 333, 5]
    got = read_samples(ParquetSource(path), indices)
    assert [g["v"] for g in got] == [values[i] for i in indices]
    assert [g["n"] for g in got] == [with_nulls[i] for i in indices]
    with ShuffledLoader(ParquetSource(path), 50, seed=2) as loader:
        batches = list(loader)
    assert sorted(v for b in batches for v in b["v"]) == sorted(values)
