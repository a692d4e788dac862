"""Process workers: exactly-once epochs, errors naming samples, a killed worker, seeding."""

from __future__ import annotations

import ast
import os
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest
import torch

from dataload import FixedSizeSource, ShuffledLoader, TransformError
from dataload.testing import assert_resumes_exactly
from dataload.workers import WorkerDiedError, WorkerError, shm_names
from dataload.workers.select import base_seed_of, work_modules
from tests.dataload import _work
from tests.dataload.conftest import STAMP_BYTES

pytestmark = pytest.mark.usefixtures("no_thread_leak")


@pytest.mark.parametrize(("world_size", "workers"), [(1, 2), (3, 2), (2, 1)])
def test_every_sample_once_across_ranks_and_workers(stamped, world_size, workers) -> None:
    count, batch = 157, 8
    source = FixedSizeSource(stamped(count), STAMP_BYTES)
    seen: Counter[int] = Counter()
    lengths = set()
    for rank in range(world_size):
        with ShuffledLoader(
            source,
            batch,
            seed=3,
            rank=rank,
            world_size=world_size,
            rank_remainder="drop",
            transform=_work.stamp_pair,
            num_workers=workers,
        ) as loader:
            assert loader.stats()["workers"] == f"{workers} processes"
            ids = []
            for features, sevens in loader:
                ids += features[:, 0].long().tolist()
                assert (sevens == features[:, 0].long() * 7).all()  # bytes of the right sample
            lengths.add(len(ids))
            seen.update(ids)
    assert len(lengths) == 1
    assert set(seen.values()) == {1}
    assert len(seen) == count - count % world_size


def test_same_batches_as_threads_and_inline(stamped) -> None:
    source = FixedSizeSource(stamped(90), STAMP_BYTES)
    runs = []
    for workers, kind in ((0, "process"), (2, "thread"), (2, "process")):
        with ShuffledLoader(
            source, 16, seed=8, transform=_work.stamp_id, num_workers=workers, worker_type=kind
        ) as loader:
            runs.append([batch.tolist() for _ in range(2) for batch in loader])
    assert runs[0] == runs[1] == runs[2]


def test_resume_at_random_points_with_process_workers(stamped) -> None:
    source = FixedSizeSource(stamped(61), STAMP_BYTES)

    def make() -> ShuffledLoader:
        return ShuffledLoader(source, 7, seed=5, transform=_work.stamp_id, num_workers=2)

    cuts = sorted(torch.randint(1, 20, (3,), generator=torch.Generator().manual_seed(9)).tolist())
    assert_resumes_exactly(make, lambda b: b.tolist(), cuts, total_batches=20)


def test_a_failing_transform_names_its_sample(stamped) -> None:
    source = FixedSizeSource(stamped(40), STAMP_BYTES)
    with ShuffledLoader(source, 8, transform=_work.fails_on_13, num_workers=2) as loader:
        with pytest.raises(TransformError, match="sample 13") as caught:
            list(loader)
        assert caught.value.sample_index == 13
        assert "undecodable" in str(caught.value) and "loader worker" in str(caught.value)
        assert loader.state_dict()["samples_consumed"] % 8 == 0
    with ShuffledLoader(
        source, 8, transform=_work.fails_on_13, num_workers=2, on_error="skip"
    ) as loader:
        assert sorted(i for b in loader for i in b.tolist()) == [i for i in range(40) if i != 13]


def test_a_killed_worker_raises_and_the_state_resumes(stamped) -> None:
    count, batch = 96, 4
    source = FixedSizeSource(stamped(count), STAMP_BYTES)
    got: list[int] = []
    loader = ShuffledLoader(source, batch, seed=2, transform=_work.slow_stamp_id, num_workers=2)
    with loader:
        iterator = iter(loader)
        got += next(iterator).tolist()
        os.kill(loader._fetcher.pool.pids[1], signal.SIGKILL)
        started = time.monotonic()
        with pytest.raises(WorkerDiedError, match="SIGKILL") as caught:
            for _ in range(count):
                got += next(iterator).tolist()
        assert time.monotonic() - started < 10  # an error, never a hang
        assert caught.value.exitcode == -signal.SIGKILL
        state = loader.state_dict()
    assert shm_names(os.getpid()) == []  # close() itself unlinked them (no collection needed)
    assert state["samples_consumed"] == len(got)
    with ShuffledLoader(source, batch, seed=2, transform=_work.stamp_id, num_workers=1) as again:
        again.load_state_dict(state)
        got += [i for b in again for i in b.tolist()]
    assert sorted(got) == list(range(count))


def test_seeding_worker_info_and_worker_init_fn_as_in_dataloader(stamped) -> None:
    source = FixedSizeSource(stamped(64), STAMP_BYTES)
    with ShuffledLoader(
        source,
        8,
        seed=77,
        transform=_work.worker_facts,
        collate_fn=list,
        num_workers=2,
        worker_init_fn=_work.init_mark,
    ) as loader:
        facts = [fact for batch in loader for fact in batch]
        base = loader.base_seed
        assert loader.state_dict()["_base_seed"] == base
    assert base == base_seed_of(77)
    by_worker = {worker: (seed, pid, mark) for _, worker, seed, pid, mark in facts}
    assert set(by_worker) == {0, 1}
    for worker, (seed, pid, mark) in by_worker.items():
        assert seed == base + worker  # torch.initial_seed() in a DataLoader worker
        assert mark == 100 + worker
        assert pid != os.getpid()
    # batches are dealt round-robin, as DataLoader deals them
    assert [facts[i * 8][1] for i in range(8)] == [0, 1] * 4


def test_a_failing_worker_init_fn_is_an_error_not_a_hang(stamped) -> None:
    source = FixedSizeSource(stamped(16), STAMP_BYTES)
    with (
        ShuffledLoader(
            source, 4, transform=_work.stamp_id, num_workers=1, worker_init_fn=_work.init_fails
        ) as loader,
        pytest.raises(WorkerError, match="no GPU for worker 0"),
    ):
        list(loader)


def test_unpicklable_work_falls_back_to_threads(stamped) -> None:
    source = FixedSizeSource(stamped(16), STAMP_BYTES)
    with ShuffledLoader(source, 4, transform=lambda raw: 1, num_workers=2) as loader:
        assert loader.stats()["workers"].startswith("2 threads (not processes")
        assert sum(int(b.sum()) for b in loader) == 16
    with pytest.raises(Exception, match="picklable"):
        ShuffledLoader(
            source, 4, transform=lambda raw: 1, num_workers=2, worker_init_fn=_work.init_mark
        )


def test_records_without_python_work_start_no_process(stamped) -> None:
    source = FixedSizeSource(stamped(16), STAMP_BYTES)
    before = shm_names(os.getpid())
    with ShuffledLoader(source, 4, num_workers=4) as loader:
        assert loader.stats()["workers"].startswith("none needed")
        assert sum(len(b) for b in loader) == 16
    assert shm_names(os.getpid()) == before


PRELOAD_CHECK = """
import sys
from dataload import FixedSizeSource, ShuffledLoader
from tests.dataload import _work
with ShuffledLoader(FixedSizeSource(sys.argv[1], 16), 4, transform=_work.pid_and_import_pid,
                    num_workers=2) as loader:
    pids = {tuple(row) for batch in loader for row in batch.tolist()}
print(sorted(pids))
"""


def test_the_forkserver_preloads_the_modules_of_the_work(stamped) -> None:
    assert work_modules(_work.stamp_id, None, _work.init_mark, _work.IdDataset(3)) == [
        "tests.dataload._work"
    ]
    assert work_modules(len, FixedSizeSource) == ["dataload.record_source"]
    # a fresh interpreter, so that the first loader is the one starting the forkserver
    done = subprocess.run(
        [sys.executable, "-c", PRELOAD_CHECK, str(stamped(16))],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    pids = ast.literal_eval(done.stdout.strip().splitlines()[-1])
    workers, importers = {p for p, _ in pids}, {i for _, i in pids}
    assert len(workers) == 2 and len(importers) == 1
    assert not workers & importers  # imported once, before the workers were forked
