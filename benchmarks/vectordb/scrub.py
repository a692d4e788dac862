"""Benchmark what corruption costs the vector index: scrub speed against fio, degraded searches
against clean ones, and a repair.

On debian-minilm (../shared; a generated 384-d Gaussian mixture of the same size where it is
missing) an index is built once under benchmarks/out/scrub/ (removed at the end), then, in
alternating rounds:

* ``verify``: ``SpannIndex.verify()`` reads and checks every posting list (O_DIRECT, file
  order); peer: fio reading the same ``postings.dat`` sequentially in its own process (io_uring,
  O_DIRECT, 4 MiB blocks at queue depth 8: the 32 MiB a scrub has in flight, in requests of at
  most 4 MiB as posting_reads merges them). Ratio: verify MB/s over fio MB/s.
* ``search``: QPS of the 500 queries as one batch, and of 100 of them one call each, on the clean
  index and on a copy of it with one byte flipped in the list the queries probe most (the
  search then answers without it: ``SearchResult.skipped_lists``); the two alternate, each
  opened afresh every round. Ratio: degraded over clean.
* ``repair``: seconds for ``SpannIndex.repair()`` to rebuild that list and checkpoint (once).

Medians over rounds, min-max shown. Tables to stdout, the last line one JSON object; progress
to stderr. ``--quick`` runs 3 rounds (about a minute with the build); the full mode 7::

    flock /tmp/tierkit-bench.lock .venv/bin/python -m benchmarks.vectordb.scrub --quick
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.common.fio import ensure_fio
from benchmarks.common.paths import OUT_DIR, SHARED_DATA
from benchmarks.vectordb._data import smoke_set
from vectordb import IndexConfig, SearchParams, SpannIndex

DATA = SHARED_DATA / "debian-minilm"
PARAMS = SearchParams(max_postings=8)
Samples = dict[str, list[float]]


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _data(smoke: bool) -> tuple[np.ndarray, np.ndarray, str]:
    if smoke:  # the test suite's: a tiny generated set, built in a second
        ds = smoke_set(4000)
        return ds.base, ds.queries, ds.name
    if (DATA / "embeddings.npy").exists() and (DATA / "queries.npy").exists():
        return np.load(DATA / "embeddings.npy"), np.load(DATA / "queries.npy"), "debian-minilm"
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(200, 384)).astype(np.float32)
    rows = centres[rng.integers(200, size=62_940)] + rng.normal(size=(62_940, 384)) * 0.3
    rows = (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)
    return rows[:62_440], rows[62_440:], "generated mixture (debian-minilm not found)"


def _fio_mb_per_s(path: Path) -> float:
    size = path.stat().st_size // (1 << 20) * (1 << 20)
    command = [
        ensure_fio(), "--name=scrubpeer", f"--filename={path}", f"--size={size}",
        "--rw=read", "--bs=4M", "--iodepth=8", "--ioengine=io_uring", "--direct=1",
        "--output-format=json",
    ]  # fmt: skip
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    job = json.loads(out[out.index("{") :])["jobs"][0]["read"]
    return job["bw_bytes"] / 1e6


async def _qps(index: SpannIndex, queries: np.ndarray) -> tuple[float, float, bool]:
    """(batch QPS, one-at-a-time QPS, whether any answer was degraded)."""
    start = time.perf_counter()
    result = await index.search(queries, 10, PARAMS)
    batch = len(queries) / (time.perf_counter() - start)
    degraded = result.degraded
    start = time.perf_counter()
    for query in queries[:100]:
        degraded |= (await index.search(query, 10, PARAMS)).degraded
    return batch, 100 / (time.perf_counter() - start), degraded


def _flip_most_probed(directory: Path, index: SpannIndex, queries: np.ndarray) -> int:
    """Flip a byte of record 0 of the list the queries probe most; returns the list."""
    pids, _ = index.navigator.search(queries, 8)
    pid = int(np.bincount(pids[pids >= 0]).argmax())
    offset = int(index.store.start[pid]) * 4096 + 100  # record 0's vector
    with open(directory / "postings.dat", "r+b") as file:
        file.seek(offset)
        byte = file.read(1)[0]
        file.seek(offset)
        file.write(bytes([byte ^ 0x40]))
    return pid


async def _measure(directory: Path, queries: np.ndarray, prefix: str, samples: Samples) -> bool:
    """One opening of the index at ``directory``: its batch and single QPS; whether degraded."""
    async with await SpannIndex.open(directory) as index:
        await index.search(queries[:50], 10, PARAMS)  # kernels and caches warm
        batch, single, degraded = await _qps(index, queries)
        samples[f"{prefix}_batch_qps"].append(batch)
        samples[f"{prefix}_single_qps"].append(single)
        if prefix == "clean":
            start = time.perf_counter()
            scrub = await index.verify()
            mb_per_s = scrub.bytes_read / 1e6 / (time.perf_counter() - start)
            samples["verify_mb_per_s"].append(mb_per_s)
    return degraded


async def _repair_s(directory: Path, pid: int) -> float:
    async with await SpannIndex.open(directory) as index:
        start = time.perf_counter()
        report = await index.repair()
        seconds = time.perf_counter() - start
    assert report.repaired_lists == [pid], report
    return seconds


async def _main(rounds: int, scratch: Path, smoke: bool) -> dict[str, float]:
    base, queries, name = _data(smoke)
    _log(f"data: {name}, {len(base)} x {base.shape[1]}, {len(queries)} queries")
    clean, broken = scratch / "clean", scratch / "broken"
    async with await SpannIndex.create(clean, IndexConfig(dim=base.shape[1])) as index:
        start = time.perf_counter()
        await index.build(None, base)
        _log(f"built in {time.perf_counter() - start:.1f} s")
    shutil.copytree(clean, broken)
    (broken / "LOCK").unlink(missing_ok=True)
    async with await SpannIndex.open(broken) as index:
        pid = _flip_most_probed(broken, index, queries)
    _log(f"flipped a byte in list {pid} of the copy")
    keys = ("verify_mb_per_s", "fio_seq_read_mb_per_s", "clean_batch_qps", "clean_single_qps")
    samples: Samples = {k: [] for k in (*keys, "degraded_batch_qps", "degraded_single_qps")}
    for i in range(rounds):  # the two indexes alternate, each opened afresh every round
        _log(f"round {i + 1}/{rounds}")
        first, second = ("clean", "degraded") if i % 2 == 0 else ("degraded", "clean")
        for prefix in (first, second):
            where = clean if prefix == "clean" else broken
            degraded = await _measure(where, queries, prefix, samples)
            assert degraded == (prefix == "degraded"), f"{prefix}: degraded={degraded}"
        samples["fio_seq_read_mb_per_s"].append(_fio_mb_per_s(clean / "postings.dat"))
    samples["repair_s"] = [await _repair_s(broken, pid)]
    return _report(samples, name)


def _report(samples: dict[str, list[float]], name: str) -> dict[str, float]:
    print(f"\nvectordb scrub and degraded search, {name}")
    print(f"{'figure':<24}{'median':>12}{'min':>12}{'max':>12}")
    median = {key: statistics.median(values) for key, values in samples.items()}
    for key, values in samples.items():
        print(f"{key:<24}{median[key]:>12.1f}{min(values):>12.1f}{max(values):>12.1f}")
    headline = {
        **{key: round(value, 2) for key, value in median.items()},
        "verify_vs_fio": round(median["verify_mb_per_s"] / median["fio_seq_read_mb_per_s"], 3),
        "degraded_vs_clean_batch": round(
            median["degraded_batch_qps"] / median["clean_batch_qps"], 3
        ),
        "degraded_vs_clean_single": round(
            median["degraded_single_qps"] / median["clean_single_qps"], 3
        ),
    }
    print(f"verify / fio sequential read: {headline['verify_vs_fio']:.2f}x")
    print(f"degraded / clean search: batch {headline['degraded_vs_clean_batch']:.2f}x, "
          f"single {headline['degraded_vs_clean_single']:.2f}x")  # fmt: skip
    return headline


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 rounds instead of 7")
    parser.add_argument("--smoke", action="store_true", help=argparse.SUPPRESS)  # tests only
    parser.add_argument("--out", type=Path, default=OUT_DIR)
    args = parser.parse_args(argv)
    scratch = args.out / "scrub"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    rounds = 1 if args.smoke else 3 if args.quick else 7
    try:
        headline = asyncio.run(_main(rounds, scratch, args.smoke))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(json.dumps({"benchmark": "vectordb_scrub", "cpus": os.cpu_count(), **headline}))


if __name__ == "__main__":
    main()
