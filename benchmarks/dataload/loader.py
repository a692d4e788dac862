"""Benchmark the globally shuffled loader (issue 5) against torch's DataLoader, HF datasets and fio.

Every timed run starts from a cold page cache (``posix_fadvise(DONTNEED)`` on the data files) and
reads a globally shuffled epoch (or as much of it as fits the time cap):

* (a) ``records_32k``: a file of 32 KiB records (>= 3 GiB in full mode), no decoding.
  tierkit (O_DIRECT and buffered) vs DataLoader(map-style, RandomSampler, num_workers 0/2/4)
  vs fio random 32 KiB O_DIRECT reads at the loader's queue depth (the device limit).
* (b) ``fmnist``: Fashion-MNIST (Debian ``dataset-fashion-mnist``) as 785-byte records (image +
  label), decoded per sample by the same transform in both loaders.
* (c) ``parquet_text``: ``../shared/data/debian-minilm/docs.jsonl`` as Parquet, tokenised per
  sample by a simple deterministic tokenizer; vs DataLoader over the same Parquet table and HF
  ``datasets`` (shuffled) where it can be installed.

The loaders run back to back in each round; ratios are medians of per-round ratios. CPU per
sample is process CPU (workers included) / samples. ``--quick`` (about 1-2 minutes) prints one
JSON object as its last line.

    flock /tmp/tierkit-bench.lock .venv/bin/python benchmarks/dataload.py --quick
    flock /tmp/tierkit-bench.lock .venv/bin/python benchmarks/dataload.py
"""

from __future__ import annotations

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(_HERE)


def _package_first() -> None:
    """Put the repository root first on ``sys.path``: this file is named like the ``dataload``
    package (and benchmarks/tiers.py like ``tiers``), and a script's directory leads sys.path."""
    sys.path[:] = [_ROOT, *(p for p in sys.path if os.path.abspath(p or os.curdir) != _ROOT)]


if __name__ == "dataload":
    # Imported as ``dataload`` by a sibling script: load the package in this module's place.
    import importlib

    _package_first()
    del sys.modules["dataload"]
    importlib.import_module("dataload")
else:
    _package_first()

import argparse  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

from _dataload_measure import Run  # noqa: E402
from _dataload_report import headline, print_report  # noqa: E402


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small files, 2 rounds, ~1-2 min")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--parts", default="abc", help="which workloads: any of a, b, c")
    parser.add_argument("--out", type=Path, default=Path(_HERE) / "out")
    parser.add_argument(
        "--keep-data", action="store_true", help="keep the big records file for the next run"
    )
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    quick = args.quick
    rounds = args.rounds or (2 if quick else 3)
    runs: list[Run] = []
    notes: list[str] = []
    started = time.time()
    print(f"dataload benchmark: {'quick' if quick else 'full'}, {rounds} rounds", flush=True)
    if "a" in args.parts:
        runs += part_records(args.out, quick, rounds, args.keep_data)
    if "b" in args.parts:
        from _dataload_fmnist import run_fmnist

        runs += run_fmnist(args.out, quick, rounds, notes)
    if "c" in args.parts:
        from _dataload_text import run_text

        runs += run_text(args.out, quick, rounds, notes)
    print_report(runs, notes, quick, time.time() - started)
    print(json.dumps(headline(runs, notes)))


def part_records(out: Path, quick: bool, rounds: int, keep: bool) -> list[Run]:
    from _dataload_records import check_stamps, data_path, ensure_records, run_round
    from _scratch import remove_at_exit

    count = 24_576 if quick else 100_000  # 768 MiB or 3.05 GiB of 32 KiB records
    path = remove_at_exit(data_path(out, count), keep)
    print(f"(a) 32 KiB records: {count} records, {path}", flush=True)
    ensure_records(path, count)
    check_stamps(path)
    runs: list[Run] = []
    max_time_s = 8.0 if quick else 30.0
    for round_index in range(rounds):
        runs += run_round(path, count, round_index, max_time_s, (0, 2, 4))
    return runs


if __name__ == "__main__":
    main()
