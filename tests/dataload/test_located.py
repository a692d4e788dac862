"""The located-bytes protocol's batch form: ``locate_many`` against ``locate``, and the reads
DatasetSource builds from either."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dataload import ImageFolder, MDSShards, SampleIndexError, TarShards
from dataload.dataset_source import DatasetSource
from dataload.located import locate_batch
from dataload.slabs import SlabPool
from tests.dataload.shards._shards import write_mds, write_shards
from tests.dataload.test_dataset_source import write_pngs
from tiers.io import InvalidArgumentError, default_runtime

pytestmark = pytest.mark.usefixtures("no_thread_leak")


def datasets(root: Path) -> list:
    return [
        TarShards(write_shards(root / "tar", 3, 7)),
        MDSShards(write_mds(root / "mds", {"id": "int", "text": "str"}, _rows(19), 6)),
        ImageFolder(write_pngs(root / "png", classes=2, per_class=5)),
    ]


def _rows(count: int) -> list[dict]:
    return [{"id": i, "text": f"row {i}" * (1 + i % 4)} for i in range(count)]


class OneByOne:
    """The same dataset with only ``locate``: DatasetSource then asks sample by sample."""

    def __init__(self, dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int):
        return self.dataset[index]

    def locate(self, index: int):
        return self.dataset.locate(index)

    def decode(self, index: int, data):
        return self.dataset.decode(index, data)


@settings(max_examples=25, deadline=None)
@given(picks=st.lists(st.integers(0, 10**6), min_size=1, max_size=12))
def test_locate_many_is_locate_for_every_index(tmp_path_factory, picks) -> None:
    for dataset in datasets(tmp_path_factory.mktemp("located")):
        indices = np.array([p % len(dataset) for p in picks], np.int64)  # repeats allowed
        paths, path_ids, offsets, lengths = dataset.locate_many(indices)
        for j, index in enumerate(indices.tolist()):
            path, offset, length = dataset.locate(index)
            assert (paths[path_ids[j]], offsets[j], lengths[j]) == (path, offset, length)
        with pytest.raises(SampleIndexError, match=str(len(dataset))):
            dataset.locate_many(np.array([0, len(dataset)]))
        with pytest.raises(SampleIndexError):
            dataset.locate_many(np.array([-1]))


def test_batched_and_per_sample_reads_give_the_same_bytes(tmp_path: Path) -> None:
    runtime = default_runtime()
    for dataset in datasets(tmp_path):
        indices = np.random.default_rng(5).permutation(len(dataset))[:9]
        got = []
        for located in (dataset, OneByOne(dataset)):
            got.append(runtime.submit(_read(DatasetSource(located), indices)).result(30))
        (fast, slow) = got
        assert fast == slow
        for j, index in enumerate(indices.tolist()):
            path, offset, length = dataset.locate(int(index))
            with open(path, "rb") as file:
                file.seek(offset)
                assert fast[j] == file.read(length)


async def _read(source: DatasetSource, indices: np.ndarray) -> list[bytes]:
    engine = default_runtime().acquire_engine()
    try:
        await source.open(engine)
        batch = await source.read(indices, SlabPool(4))
        assert not batch.errors and batch.bytes_read == int(batch.sizes.sum())
        return [bytes(batch.sample(j)) for j in range(len(batch))]
    finally:
        await source.close()
        await default_runtime().release_engine(engine)


def test_a_locate_many_of_the_wrong_length_is_a_typed_error(tmp_path: Path) -> None:
    class Short(OneByOne):
        def locate_many(self, indices):
            paths, ids, offsets, lengths = self.dataset.locate_many(indices)
            return paths, ids[:-1], offsets, lengths

    dataset = Short(TarShards(write_shards(tmp_path, 1, 4)))
    with pytest.raises(InvalidArgumentError, match="locate_many"):
        locate_batch(dataset, np.arange(3))
