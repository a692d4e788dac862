"""ShuffledLoader: exactly-once epochs across ranks, determinism, exact resume, errors, shutdown."""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dataload import (
    CorruptSampleError,
    FixedSizeSource,
    RecordFileSource,
    ShuffledLoader,
    TransformError,
    write_records,
)
from dataload.testing import assert_resumes_exactly
from tests.dataload.conftest import STAMP_BYTES, ids_of, write_stamped
from tiers.io import InvalidArgumentError, IORuntime, default_runtime

pytestmark = pytest.mark.usefixtures("no_thread_leak")


def epoch_ids(loader: ShuffledLoader) -> list[int]:
    return [i for batch in loader for i in ids_of(batch)]


@pytest.mark.parametrize("world_size", [1, 2, 3, 8])
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("remainder", ["pad", "drop"])
def test_every_sample_once_per_epoch_across_ranks(
    stamped, world_size: int, drop_last: bool, remainder: str
) -> None:
    count, batch_size = 203, 8
    source = FixedSizeSource(stamped(count), STAMP_BYTES)
    per_rank, lengths = [], set()
    for rank in range(world_size):
        with ShuffledLoader(
            source,
            batch_size,
            seed=11,
            rank=rank,
            world_size=world_size,
            rank_remainder=remainder,
            drop_last=drop_last,
        ) as loader:
            ids = epoch_ids(loader)
            lengths.add((len(loader), len(ids)))
            per_rank.append(ids)
    assert len(lengths) == 1  # same batch count and sample count at every rank
    seen = Counter(i for ids in per_rank for i in ids)
    share = count // world_size + (1 if count % world_size and remainder == "pad" else 0)
    if drop_last:
        share = share // batch_size * batch_size
    assert sum(seen.values()) == share * world_size
    if remainder == "drop" or world_size == 1:
        assert max(seen.values()) == 1  # nothing twice
    if not drop_last:
        expected = count if remainder == "pad" else count // world_size * world_size
        assert len(seen) == expected  # nothing missed


def test_same_seed_same_order_and_each_epoch_reshuffles(stamped) -> None:
    source = FixedSizeSource(stamped(300), STAMP_BYTES)
    with ShuffledLoader(source, 32, seed=5) as a, ShuffledLoader(source, 32, seed=5) as b:
        first_a, first_b = epoch_ids(a), epoch_ids(b)
        second_a = epoch_ids(a)  # the loader counts epochs itself: no set_epoch needed
        assert first_a == first_b
        assert sorted(first_a) == sorted(second_a) == list(range(300))
        assert first_a != second_a
        assert a.epoch == 1
    with ShuffledLoader(source, 32, seed=6) as c:
        assert epoch_ids(c) != first_a


def test_batches_are_zero_copy_tensors_in_sampler_order(stamped) -> None:
    source = FixedSizeSource(stamped(100), STAMP_BYTES, dtype=np.int64, shape=(2,))
    with ShuffledLoader(source, 10, seed=1, drop_last=True) as loader:
        batches = list(loader)
    assert len(batches) == len(loader) == 10
    expected = loader.plan.indices(0)
    got = torch.cat(batches)
    assert got.dtype == torch.int64 and got.shape == (100, 2)
    assert got[:, 0].tolist() == expected.tolist()  # assembled in sampler order
    assert (got[:, 1] == got[:, 0] * 7).all()


@given(cuts=st.lists(st.integers(1, 30), max_size=3), seed=st.integers(0, 2**31))
@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_resume_at_random_points_repeats_and_skips_nothing(
    tmp_path: Path, cuts: list[int], seed: int
) -> None:
    path = write_stamped(tmp_path / "r.bin", 97)
    source = FixedSizeSource(path, STAMP_BYTES)

    def make() -> ShuffledLoader:
        return ShuffledLoader(source, 7, seed=seed, rank=1, world_size=2, prefetch_batches=3)

    assert_resumes_exactly(make, ids_of, cuts, total_batches=24)  # 3 epochs of 7 + 1


def test_set_epoch_after_resume_does_not_restart_the_epoch(stamped) -> None:
    source = FixedSizeSource(stamped(64), STAMP_BYTES)
    with ShuffledLoader(source, 8, seed=2) as loader:
        loader.set_epoch(3)  # jump to the start of epoch 3
        full = epoch_ids(loader)
        loader.set_epoch(4)  # the next epoch: what the loader does by itself anyway
        assert loader.epoch == 3 and epoch_ids(loader) != full and loader.epoch == 4
    with ShuffledLoader(source, 8, seed=2) as loader:
        loader.set_epoch(3)
        head = [ids_of(b) for _, b in zip(range(3), loader, strict=False)]
        state = loader.state_dict()
    with ShuffledLoader(source, 8, seed=0) as resumed:
        resumed.load_state_dict(state)
        resumed.set_epoch(3)  # the DistributedSampler habit: must not rewind
        rest = epoch_ids(resumed)
    assert [i for ids in head for i in ids] + rest == full
    assert state["seed"] == 2 and state["samples_consumed"] == 24


def test_state_from_another_world_is_refused(stamped) -> None:
    source = FixedSizeSource(stamped(64), STAMP_BYTES)
    with ShuffledLoader(source, 8, rank=0, world_size=2) as a:
        state = a.state_dict()
    with ShuffledLoader(source, 8) as b, pytest.raises(InvalidArgumentError, match="world_size"):
        b.load_state_dict(state)


def test_transform_runs_per_sample_and_default_collate_stacks(stamped) -> None:
    source = FixedSizeSource(stamped(50), STAMP_BYTES)

    def decode(raw: np.ndarray) -> tuple[torch.Tensor, int]:
        index, seven = raw.view("<i8").tolist()
        return torch.tensor([float(index)]), seven

    with ShuffledLoader(source, 16, transform=decode, num_workers=2) as loader:
        for features, labels in loader:
            assert features.shape[1:] == (1,)
            assert (labels == features[:, 0].long() * 7).all()


def test_skip_mode_drops_and_counts_bad_samples(stamped) -> None:
    source = FixedSizeSource(stamped(40), STAMP_BYTES)

    def picky(raw: np.ndarray) -> int:
        index = int(raw.view("<i8")[0])
        if index % 10 == 3:
            raise ValueError("undecodable")
        return index

    with ShuffledLoader(source, 8, transform=picky, on_error="skip") as loader:
        got = sorted(int(i) for batch in loader for i in batch)
        stats = loader.stats()
    assert got == [i for i in range(40) if i % 10 != 3]
    assert stats["skipped"] == 4 and stats["samples"] == 36
    with ShuffledLoader(source, 8, transform=picky) as loader, pytest.raises(TransformError):
        list(loader)


def test_corrupt_sample_raises_then_skip_mode_continues(tmp_path: Path) -> None:
    path = write_records(tmp_path / "c.tkr", [bytes([i]) * 32 for i in range(20)])
    with open(path, "r+b") as file:
        file.seek(RecordFileSource(path)._offsets[7] + 1)  # type: ignore[index]
        file.write(b"\xff")
    loader = ShuffledLoader(RecordFileSource(path, verify=True), 5)
    with loader, pytest.raises(CorruptSampleError, match="sample 7"):
        list(loader)
    with ShuffledLoader(RecordFileSource(path, verify=True), 5, on_error="skip") as loader:
        firsts = sorted(int(t[0]) for batch in loader for t in batch)
    assert firsts == [i for i in range(20) if i != 7]


def test_abandoned_iterator_and_close_give_everything_back(stamped) -> None:
    runtime = IORuntime(engine="thread")
    source = FixedSizeSource(stamped(500), STAMP_BYTES)
    loader = ShuffledLoader(source, 10, prefetch_batches=8, runtime=runtime)
    iterator = iter(loader)
    next(iterator)  # prefetch is in flight now
    del iterator
    assert runtime.stats()["leases"] == 1
    loader.close()
    loader.close()  # idempotent
    assert runtime.stats()["leases"] == 0 and runtime.stats()["engines_open"] == 0
    runtime.close()


def test_dropped_loader_gives_its_lease_back(stamped) -> None:
    runtime = IORuntime(engine="thread")
    loader = ShuffledLoader(FixedSizeSource(stamped(30), STAMP_BYTES), 4, runtime=runtime)
    next(iter(loader))
    del loader
    import gc

    gc.collect()
    assert runtime.stats()["leases"] == 0
    runtime.close()


def test_loaders_on_one_runtime_share_its_loop_and_engine(stamped) -> None:
    runtime = IORuntime(engine="thread")
    source = FixedSizeSource(stamped(64), STAMP_BYTES)
    with (
        ShuffledLoader(source, 8, runtime=runtime, seed=1) as one,
        ShuffledLoader(source, 8, runtime=runtime, seed=2) as two,
    ):
        assert one._fetcher.engine is two._fetcher.engine
        assert runtime.stats()["engines_open"] == 1
        seen = sorted(i for batch in one for i in ids_of(batch))
        assert seen == sorted(i for batch in two for i in ids_of(batch)) == list(range(64))
    runtime.close()


def test_a_private_engine_gets_a_private_runtime_closed_with_the_loader(stamped) -> None:
    source = FixedSizeSource(stamped(16), STAMP_BYTES)
    loader = ShuffledLoader(source, 4, engine="thread")
    private = loader._runtime
    assert private is not default_runtime()
    assert len(list(loader)) == 4
    loader.close()
    assert private.closed
    with pytest.raises(InvalidArgumentError):
        ShuffledLoader(source, 4, engine="thread", runtime=private)


def test_stats_progress_and_pin_memory_note(stamped, capsys) -> None:
    source = FixedSizeSource(stamped(64), STAMP_BYTES)
    with ShuffledLoader(source, 16, progress=True, pin_memory=True) as loader:
        list(loader)
        stats = loader.stats()
    assert stats["batches"] == 4 and stats["samples"] == 64
    assert stats["bytes_read"] == 64 * STAMP_BYTES
    assert stats["time_to_first_batch_s"] is not None and stats["samples_per_s"] > 0
    if not torch.cuda.is_available():
        assert stats["pin_memory"].startswith("ignored")
    assert "4/4" in capsys.readouterr().err  # the tqdm bar reached the end


def test_slabs_are_reused_only_after_the_batch_is_dropped(stamped) -> None:
    source = FixedSizeSource(stamped(400), STAMP_BYTES)
    with ShuffledLoader(source, 10, prefetch_batches=1) as loader:
        kept = [b for _, b in zip(range(30), loader, strict=False)]  # keep every batch alive
        ids = [ids_of(b) for b in kept]  # still intact: no slab was overwritten under them
        assert len({i for batch_ids in ids for i in batch_ids}) == 300
        del kept
        allocated = loader._fetcher._slabs.allocated
        for batch in loader:
            del batch  # dropped at once: slabs come back
        assert loader._fetcher._slabs.allocated - allocated <= 4


def test_num_workers_0_assembles_in_the_iterating_thread(stamped) -> None:
    source = FixedSizeSource(stamped(60), STAMP_BYTES)
    threads: set[int] = set()

    def decode(raw: np.ndarray) -> int:
        threads.add(threading.get_ident())
        return int(raw.view("<i8")[0])

    with ShuffledLoader(source, 8, seed=4, transform=decode, num_workers=0) as loader:
        inline = [batch.tolist() for batch in loader]
    assert threads == {threading.get_ident()}
    with ShuffledLoader(source, 8, seed=4, transform=decode, num_workers=2) as loader:
        assert [batch.tolist() for batch in loader] == inline

    def picky(raw: np.ndarray) -> int:
        index = int(raw.view("<i8")[0])
        if index == 13:
            raise ValueError("undecodable")
        return index

    with ShuffledLoader(source, 8, transform=picky, num_workers=0, on_error="skip") as loader:
        assert sorted(i for batch in loader for i in batch.tolist()) == [
            i for i in range(60) if i != 13
        ]
    with ShuffledLoader(source, 8, transform=picky, num_workers=0) as loader:
        with pytest.raises(TransformError, match="sample 13"):
            list(loader)
        assert loader.state_dict()["samples_consumed"] % 8 == 0  # the failed batch is not consumed
