"""A user's own map-style Dataset: plain, batched, located bytes, and a folder of PNG images."""

from __future__ import annotations

import io
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader

from dataload import (
    DatasetSource,
    ImageFolder,
    SampleReadError,
    ShuffledLoader,
    TransformError,
)
from dataload.testing import assert_resumes_exactly
from tests.dataload import _work

pytestmark = pytest.mark.usefixtures("no_thread_leak")


@pytest.mark.parametrize(("workers", "kind"), [(0, "process"), (2, "process"), (2, "thread")])
def test_a_plain_dataset_once_per_epoch_across_ranks(workers: int, kind: str) -> None:
    count, world = 45, 2
    seen: Counter[int] = Counter()
    for rank in range(world):
        with ShuffledLoader(
            _work.IdDataset(count),
            4,
            seed=1,
            rank=rank,
            world_size=world,
            num_workers=workers,
            worker_type=kind,
        ) as loader:
            for ids, triples in loader:
                assert (triples == 3 * ids).all()
                seen.update(ids.tolist())
    assert sorted(seen) == list(range(count))
    assert sum(seen.values()) == count + 1  # "pad": one sample twice so both ranks get 23


def test_getitems_is_used_as_dataloader_uses_it() -> None:
    with ShuffledLoader(_work.BatchedIdDataset(20), 5, num_workers=2) as loader:
        for ids, negatives in loader:
            assert (negatives == -3 * ids).all()  # __getitems__'s values, not __getitem__'s


def test_located_bytes_are_read_by_the_io_core(stamped) -> None:
    count = 77
    dataset = _work.StampFileDataset(stamped(count), count)
    assert DatasetSource(dataset).located
    for workers in (0, 2):
        with ShuffledLoader(dataset, 8, seed=4, num_workers=workers) as loader:
            ids = [i for batch in loader for i in batch.tolist()]  # decode checks each value
            assert sorted(ids) == list(range(count))
            assert loader.stats()["bytes_read"] == 16 * count  # read by the loader, not decode


def test_resume_at_random_points_over_a_dataset(stamped) -> None:
    dataset = _work.StampFileDataset(stamped(50), 50)

    def make() -> ShuffledLoader:
        return ShuffledLoader(dataset, 6, seed=12, num_workers=2)

    cuts = np.random.default_rng(3).integers(1, 25, 3).tolist()
    assert_resumes_exactly(make, lambda b: b.tolist(), cuts, total_batches=25)


def test_getitem_that_raises_names_the_sample() -> None:
    for workers in (0, 2):
        with ShuffledLoader(_work.BrokenItemDataset(30), 5, num_workers=workers) as loader:
            with pytest.raises(TransformError, match="sample 21") as caught:
                list(loader)
            assert "KeyError" in str(caught.value)
    with ShuffledLoader(_work.BrokenItemDataset(30), 5, num_workers=2, on_error="skip") as loader:
        ids = sorted(i for ids, _ in loader for i in ids.tolist())
        assert ids == [i for i in range(30) if i != 21]
        assert loader.stats()["skipped"] == 1


def test_a_missing_located_file_is_a_read_error(tmp_path: Path) -> None:
    folder = write_pngs(tmp_path / "imgs", classes=2, per_class=4)
    dataset = ImageFolder(folder)
    Path(dataset.samples[5][0]).unlink()
    with (
        ShuffledLoader(dataset, 4, num_workers=2) as loader,
        pytest.raises(SampleReadError, match="sample 5"),
    ):
        list(loader)
    with ShuffledLoader(dataset, 4, num_workers=2, on_error="skip") as loader:
        assert sum(len(labels) for _, labels in loader) == 7


def write_pngs(root: Path, classes: int, per_class: int) -> Path:
    """PNGs whose pixels encode their sample number: image k is filled with k % 251."""
    k = 0
    for c in range(classes):
        (root / f"class_{c}").mkdir(parents=True)
        for j in range(per_class):
            pixels = np.full((6, 5, 3), k % 251, np.uint8)
            pixels[0, 0] = (c, j, 7)
            Image.fromarray(pixels).save(root / f"class_{c}" / f"{j:03d}.png")
            k += 1
    return root


def test_image_folder_decodes_every_png_once_like_dataloader(tmp_path: Path) -> None:
    folder = write_pngs(tmp_path / "imgs", classes=3, per_class=7)
    dataset = ImageFolder(folder)
    assert dataset.classes == ["class_0", "class_1", "class_2"] and len(dataset) == 21
    expected = {}
    for images, labels in DataLoader(dataset, batch_size=4):
        for image, label in zip(images, labels.tolist(), strict=True):
            expected[int(image[0, 1, 1])] = (image.clone(), label)
    got = {}
    with ShuffledLoader(dataset, 4, seed=9, num_workers=2) as loader:
        for images, labels in loader:
            assert images.dtype == torch.uint8 and images.shape[1:] == (3, 6, 5)
            for image, label in zip(images, labels.tolist(), strict=True):
                key = int(image[0, 1, 1])
                assert key not in got
                got[key] = (image, label)
    assert got.keys() == expected.keys() == set(range(21))
    for key, (image, label) in got.items():
        assert torch.equal(image, expected[key][0]) and label == expected[key][1]
        assert label == key // 7 and int(image[0, 0, 0]) == label


def test_state_dict_speaks_statefuldataloader(tmp_path: Path) -> None:
    dataset = _work.IdDataset(30)
    with ShuffledLoader(dataset, 4, seed=6, num_workers=2) as loader:
        iterator = iter(loader)
        first = [next(iterator)[0].tolist() for _ in range(3)]
        state = loader.state_dict()
        rest = [ids.tolist() for ids, _ in iterator]
    assert loader.dataset is dataset
    assert state["_num_yielded"] == state["_sampler_iter_yielded"] == 3
    assert state["_sampler_iter_state"]["samples_yielded"] == 12
    assert state["_iterator_finished"] is False
    buffer = io.BytesIO()
    torch.save(state, buffer)  # as checkpointing code saves a StatefulDataLoader's state
    buffer.seek(0)
    with ShuffledLoader(dataset, 4, seed=6, num_workers=1) as again:  # another worker count
        again.load_state_dict(torch.load(buffer, weights_only=True))
        assert [ids.tolist() for ids, _ in again] == rest
        assert again.state_dict()["_iterator_finished"] is True
    assert len(first) + len(rest) == 8
