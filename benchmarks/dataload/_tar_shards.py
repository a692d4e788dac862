"""Workload (e): Fashion-MNIST as WebDataset tar shards, decoded with Pillow per sample.

The shards hold each image as ``<key>.png`` (28x28 grayscale) and its label as ``<key>.cls``
(ASCII digits), as WebDataset's own tools write them: 20,000 images in 8 shards in quick mode,
all 70,000 in 16 in full (written once into benchmarks/out with ``webdataset.TarWriter`` and
kept; synthetic images with a note when the Debian package is absent). Both systems run the
same per-sample transform, :func:`sample_transform`: PNG bytes -> Pillow decode -> normalised
1x28x28 float tensor, label bytes -> int; batches of 128 collated by ``default_collate``.

* tierkit: ``ShuffledLoader(TarShards(shards), 128, transform=sample_transform,
  num_workers=N)`` -- a global shuffle over every sample of every shard, each sample one
  ranged read on the I/O core. The one-time index build (sidecars) happens in the parent, as a
  user pays it once; opening the sidecars is inside the timed region, cold.
* peer: WebDataset's own loader as its docs show it -- ``WebDataset(shards,
  shardshuffle=..., detshuffle=True, seed=...).shuffle(1000).map(sample_transform)
  .batched(128)`` in ``DataLoader(batch_size=None, num_workers=N)`` (what ``WebLoader``
  wraps; used directly so its workers can be shut down and their CPU counted): shards split across
  workers, read sequentially, shuffled within a 1,000-sample buffer (a weaker shuffle than
  tierkit's, and cheaper: sequential reads).
"""

from __future__ import annotations

import io
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, default_collate

from benchmarks.dataload import _fmnist, _map_dataset

WORKLOAD = "tar_shards"
BATCH = 128
SHUFFLE_BUFFER = 1000
SIZES = {"full": (70_000, 16), "quick": (20_000, 8), "smoke": (1_000, 2)}  # (samples, shards)


def sample_transform(sample: dict[str, Any]) -> tuple[torch.Tensor, int]:
    """The per-sample transform, the same in both systems."""
    with Image.open(io.BytesIO(sample["png"])) as image:
        pixels = np.asarray(image, np.float32)
    tensor = torch.from_numpy(pixels).reshape(1, 28, 28)
    return (tensor / 255.0 - 0.2860) / 0.3530, int(sample["cls"])


def prepare(out: Path, mode: str, notes: list[str]) -> dict[str, Any]:
    """Write the shards (once) and index them (once); paths, count and the index time."""
    count, shard_count = SIZES[mode]
    real = _fmnist.ensure_fmnist(notes, install=mode != "smoke")
    folder = out / f"dataload_tar_{'fmnist' if real else 'synthetic'}_{count}_{shard_count}"
    done = folder / ".complete"
    if not done.exists():
        _write(folder, count, shard_count, real, notes)
        done.write_text(str(count))
    shards = sorted(str(p) for p in folder.glob("shard-*.tar"))
    from dataload import TarShards

    started = time.perf_counter()
    dataset = TarShards(shards)
    index_s = time.perf_counter() - started
    if dataset.indexed_now:
        notes.append(f"(e) indexed {len(shards)} shards once: {index_s:.2f} s ({count} samples)")
    return {"shards": shards, "count": len(dataset)}


def _write(folder: Path, count: int, shard_count: int, real: bool, notes: list[str]) -> None:
    import webdataset

    if real:
        images, labels = _map_dataset._fmnist_arrays(count)
    else:
        notes.append("(e) Fashion-MNIST absent: synthetic 28x28 PNGs")
        rng = np.random.default_rng(7)
        images = rng.integers(0, 256, (count, 28, 28), dtype=np.uint8)
        labels = np.arange(count) % 10
    folder.mkdir(parents=True, exist_ok=True)
    per_shard = -(-count // shard_count)
    for shard in range(shard_count):
        with webdataset.TarWriter(str(folder / f"shard-{shard:06d}.tar")) as sink:
            for index in range(shard * per_shard, min(count, (shard + 1) * per_shard)):
                png = io.BytesIO()
                Image.fromarray(images[index]).save(png, format="PNG")
                label = str(int(labels[index])).encode()
                sink.write({"__key__": f"{index:07d}", "png": png.getvalue(), "cls": label})


def starter(system: str, workers: int, seed: int, data: dict[str, Any]) -> Any:
    """A () -> (iterator, closer) for ``system`` ("tierkit" or the WebDataset peer)."""
    shards = data["shards"]
    if system == "tierkit":
        from dataload import ShuffledLoader, TarShards

        def ours() -> tuple:
            loader = ShuffledLoader(
                TarShards(shards), BATCH, seed=seed, transform=sample_transform, num_workers=workers
            )
            return iter(loader), loader.close

        return ours
    return lambda: webdataset_loader(shards, workers, seed)


def webdataset_loader(shards: list[str], workers: int, seed: int) -> tuple:
    """WebDataset's pipeline and loader, shuffled as its documentation shows."""
    import webdataset

    dataset = (
        webdataset.WebDataset(shards, shardshuffle=len(shards), detshuffle=True, seed=seed)
        .shuffle(SHUFFLE_BUFFER)
        .map(sample_transform)
        .batched(BATCH, collation_fn=default_collate, partial=True)
    )
    # WebLoader is this DataLoader inside a pipeline whose generator hides the DataLoader's
    # iterator; without it the workers outlive the run (their CPU uncounted, and competing
    # with the next run)
    iterator = iter(DataLoader(dataset, batch_size=None, num_workers=workers))

    def close() -> None:
        shutdown = getattr(iterator, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()

    return iterator, close


def files(data: dict[str, Any]) -> list[Path]:
    """What a cold run evicts: the shards and their sidecars."""
    shards = [Path(p) for p in data["shards"]]
    return shards + [p for p in (Path(f"{s}.tkidx") for s in shards) if p.exists()]
