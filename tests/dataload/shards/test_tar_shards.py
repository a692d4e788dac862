"""TarShards: WebDataset's samples, sidecars kept fresh, every sample once, exact resume."""

from __future__ import annotations

import gc
import os
import tarfile
from pathlib import Path

import numpy as np
import pytest
import webdataset

from dataload import ShuffledLoader, SourceFormatError, TarShards
from dataload.shards import expand_shards
from dataload.shards.tar_sidecar import encode_sidecar, read_sidecar
from dataload.testing import assert_resumes_exactly
from tests.dataload.shards._shards import (
    checked_key,
    every_sample_once,
    payload,
    sample_members,
    write_shards,
    write_tar,
)

pytestmark = pytest.mark.usefixtures("no_thread_leak")


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.filterwarnings("ignore::ResourceWarning")  # webdataset leaves its shard files open
def test_same_samples_as_webdataset_in_shard_order(tmp_path: Path) -> None:
    members = [*sample_members(["a", "b/c", "d" * 130]), ("__meta__", b"m"), ("noext", b"n")]
    members += [("e.seg.PNG", b"s"), ("e.txt", b"t"), ("a.cls", b"again")]  # "a" comes back
    write_tar(tmp_path / "one.tar", members, tarfile.GNU_FORMAT)
    write_shards(tmp_path / "more", 2, 4)
    urls = [str(tmp_path / "one.tar"), *map(str, sorted((tmp_path / "more").glob("*.tar")))]
    ours = TarShards(urls)
    theirs = list(webdataset.WebDataset(urls, shardshuffle=False, empty_check=False))
    gc.collect()
    assert len(ours) == len(theirs) == 5 + 8
    for i, expected in enumerate(theirs):
        expected.pop("__local_path__", None)
        assert ours[i] == expected  # keys, extensions (lowercased) and bytes
        path, offset, length = ours.locate(i)
        with open(path, "rb") as file:
            file.seek(offset)
            assert ours.decode(i, file.read(length)) == expected  # the one ranged read
    assert ours.key(2) == "d" * 130


def test_brace_patterns_expand() -> None:
    assert expand_shards("s-{008..011}.tar") == [f"s-{n:03d}.tar" for n in range(8, 12)]
    assert expand_shards(["a-{x,y}-{1..2}"]) == ["a-x-1", "a-x-2", "a-y-1", "a-y-2"]


def test_a_modified_shard_is_reindexed_and_a_bad_sidecar_rebuilt(tmp_path: Path) -> None:
    path = write_tar(tmp_path / "s.tar", sample_members(["k1", "k2"]))
    first = TarShards(path)
    assert (first.indexed_now, len(first)) == (1, 2)
    assert TarShards(path).indexed_now == 0  # read from the sidecar
    write_tar(path, sample_members(["k1", "k2", "k3"]))  # same name, new content
    os.utime(path, ns=(1, 1))  # even with an mtime from the past: size and mtime both recorded
    again = TarShards(path)
    assert (again.indexed_now, len(again), again[2]["png"]) == (1, 3, payload("k3", "png"))
    sidecar = Path(str(path) + ".tkidx")
    raw = bytearray(sidecar.read_bytes())
    raw[-1] ^= 0xFF  # a flipped byte: the CRC catches it
    sidecar.write_bytes(bytes(raw))
    assert read_sidecar(str(sidecar)) is None
    assert TarShards(path).indexed_now == 1
    assert encode_sidecar(read_sidecar(str(sidecar))) == sidecar.read_bytes()  # type: ignore[arg-type]


def test_read_only_shard_folder_puts_sidecars_in_the_cache_dir(tmp_path: Path) -> None:
    shards = write_shards(tmp_path / "ro", 2, 3)
    if os.geteuid() == 0:  # root writes into read-only folders: block the sidecar path instead
        for shard in shards:
            Path(str(shard) + ".tkidx").mkdir()
    (tmp_path / "ro").chmod(0o555)
    try:
        dataset = TarShards(shards, cache_dir=tmp_path / "cache")
        assert len(list((tmp_path / "cache").iterdir())) == 2
        assert TarShards(shards, cache_dir=tmp_path / "cache").indexed_now == 0
        assert checked_key(dataset[4]) == "s1/00001"
    finally:
        (tmp_path / "ro").chmod(0o755)


def test_a_truncated_shard_is_a_typed_error_naming_it(tmp_path: Path) -> None:
    shards = write_shards(tmp_path, 2, 5)
    raw = shards[1].read_bytes()
    shards[1].write_bytes(raw[: len(raw) // 2])
    with pytest.raises(SourceFormatError, match=r"shard-0001\.tar"):
        TarShards(shards)


@pytest.mark.parametrize(("world_size", "workers"), [(1, 0), (3, 2)])
def test_every_sample_once_across_shards_ranks_and_workers(tmp_path, world_size, workers) -> None:
    dataset = TarShards(write_shards(tmp_path, 5, 13))  # 65 samples
    seen = every_sample_once(dataset, checked_key, world_size, workers)
    assert set(seen.values()) == {1}
    assert len(seen) == 65 - 65 % world_size
    with ShuffledLoader(dataset, 65, seed=1, transform=checked_key, collate_fn=list) as loader:
        order = next(iter(loader))
        shard_runs = np.count_nonzero(np.diff([int(k[1]) for k in order]))
        assert shard_runs > 20  # a global shuffle interleaves shards, not a shard at a time


def test_resume_at_random_points(tmp_path: Path) -> None:
    dataset = TarShards(write_shards(tmp_path, 4, 10))

    def make() -> ShuffledLoader:
        return ShuffledLoader(dataset, 6, seed=9, transform=checked_key, collate_fn=list)

    cuts = np.random.default_rng(11).integers(1, 14, 3).tolist()
    assert_resumes_exactly(make, list, cuts, total_batches=14)  # crosses an epoch boundary
