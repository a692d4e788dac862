"""A standalone WebDataset timing loop: a cross-check of the peer in part (e), outside the harness.

It reads the shards part (e) wrote, with nothing of the harness around WebDataset: no child
process per run, no helper closing the iterator -- the loop a WebDataset user writes, with the
same pipeline and transform (``_tar_shards.webdataset_loader``'s, rebuilt inline here). Each run
evicts the shards from the page cache first (``posix_fadvise(DONTNEED)``, as the harness does)
and times ``--samples`` samples, or ``--time-s``, from building the loader. If its samples/s
agree with part (e)'s ``wds_nw*`` rows, the harness is not handicapping the peer.

    flock /tmp/tierkit-bench.lock .venv/bin/python -m benchmarks.dataload.wds_plain \\
        benchmarks/out/dataload_tar_fmnist_20000_8 --workers 0 2 4 --rounds 2
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import time
from pathlib import Path

import webdataset
from torch.utils.data import default_collate

from benchmarks.dataload._tar_shards import BATCH, SHUFFLE_BUFFER, sample_transform


def time_once(shards: list[str], workers: int, seed: int, samples: int, time_s: float) -> float:
    """Samples/s of one cold run of WebDataset's pipeline in a WebLoader."""
    for shard in shards:
        fd = os.open(shard, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    started = time.perf_counter()
    dataset = (
        webdataset.WebDataset(shards, shardshuffle=len(shards), detshuffle=True, seed=seed)
        .shuffle(SHUFFLE_BUFFER)
        .map(sample_transform)
        .batched(BATCH, collation_fn=default_collate, partial=True)
    )
    seen = 0
    loader = webdataset.WebLoader(dataset, batch_size=None, num_workers=workers)
    for images, _labels in loader:
        seen += int(images.shape[0])
        if seen >= samples or time.perf_counter() - started > time_s:
            break
    rate = seen / (time.perf_counter() - started)
    del loader
    gc.collect()  # the pipeline's generator holds the DataLoader iterator: stop its workers
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="a folder of shard-*.tar (part (e)'s)")
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2, 4])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--samples", type=int, default=20_000)
    parser.add_argument("--time-s", type=float, default=5.0)
    args = parser.parse_args()
    shards = sorted(str(p) for p in args.folder.glob("shard-*.tar"))
    if not shards:
        parser.error(f"no shard-*.tar in {args.folder}")
    results: dict[str, list[float]] = {}
    for round_index in range(args.rounds):
        for workers in args.workers:
            rate = time_once(shards, workers, 400 + round_index, args.samples, args.time_s)
            results.setdefault(f"wds_plain_nw{workers}", []).append(round(rate, 1))
            print(f"round {round_index} workers {workers}: {rate:,.0f} samples/s", flush=True)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
