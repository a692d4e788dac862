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

* (d) ``map_dataset``: a map-style Dataset over a folder of PNG files (Fashion-MNIST images),
  decoded with Pillow per sample (``_map_dataset.py``).
* (e) ``tar_shards``: the same images as WebDataset tar shards, ``dataload.TarShards`` vs
  WebDataset's own loader, same transform (``_tar_shards.py``).

(b)-(e) run each system in its own process at equal worker counts (0, 2, 4), cold
cache (``_isolated.py``); ``--in-process`` runs (b) and (c) the old way, both loaders in this
process (and the HF datasets peer); the smoke plan does that too, and (d) at 2 workers only.

The loaders run back to back in each round; ratios are medians of per-round ratios. CPU per
sample is process CPU (workers included) / samples. ``--quick`` (about 1-2 minutes) prints one
JSON object as its last line. A part whose data is missing is skipped with a note in that line.

    flock /tmp/tierkit-bench.lock .venv/bin/python -m benchmarks.dataload.loader --quick
    flock /tmp/tierkit-bench.lock .venv/bin/python -m benchmarks.dataload.loader
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common.paths import OUT_DIR
from benchmarks.common.scratch import remove_at_exit
from benchmarks.dataload._fmnist import run_fmnist
from benchmarks.dataload._isolated import WORKERS, run_workload
from benchmarks.dataload._measure import Run
from benchmarks.dataload._records import check_stamps, data_path, ensure_records, run_round
from benchmarks.dataload._report import headline, print_report
from benchmarks.dataload._text import run_text


@dataclass(frozen=True)
class Plan:
    """How much each part reads; the peers' worker counts of (a)."""

    mode: str  # "full", "quick" or "smoke" (the test suite's: seconds, figures meaningless)
    rounds: int
    records: int  # 32 KiB records in (a)'s file
    records_time_s: float  # cap per timed run of (a)
    torch_workers: tuple[int, ...]

    @property
    def quick(self) -> bool:
        """Quick sizes for (b) and (c); the smoke plan cuts them further itself."""
        return self.mode != "full"


FULL = Plan("full", 3, 100_000, 30.0, (0, 2, 4))  # 3.05 GiB of records
QUICK = Plan("quick", 2, 24_576, 8.0, (0, 2, 4))  # 768 MiB
SMOKE = Plan("smoke", 1, 512, 0.5, (0, 2))  # 16 MiB


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small files, 2 rounds, ~1-2 min")
    parser.add_argument("--smoke", action="store_true", help=argparse.SUPPRESS)  # tests only
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--parts", default=None, help="workloads, any of a-e (default: all)")
    parser.add_argument(
        "--in-process", action="store_true", help="(b), (c): both loaders in this process"
    )
    parser.add_argument("--out", type=Path, default=OUT_DIR)
    parser.add_argument(
        "--keep-data", action="store_true", help="keep the big records file for the next run"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    plan = SMOKE if args.smoke else QUICK if args.quick else FULL
    rounds = args.rounds or plan.rounds
    runs: list[Run] = []
    notes: list[str] = []
    started = time.time()
    print(f"dataload benchmark: {plan.mode}, {rounds} rounds", flush=True)
    if args.parts is None:  # the test suite's smoke plan leaves (e) out: ~30 s on the CI VM
        args.parts = "abcd" if plan.mode == "smoke" else "abcde"
    if "a" in args.parts:
        runs += part_records(args.out, plan, rounds, args.keep_data)
    isolated = not args.in_process and plan.mode != "smoke"
    if "b" in args.parts:
        if isolated:
            runs += run_workload("fmnist", args.out, plan.mode, rounds, notes)
        else:
            runs += run_fmnist(args.out, plan.mode, rounds, notes)
    if "c" in args.parts:
        if isolated:
            runs += run_workload("parquet_text", args.out, plan.mode, rounds, notes)
        else:
            runs += run_text(args.out, plan.mode, rounds, notes)
    if "d" in args.parts:
        workers = (2,) if plan.mode == "smoke" else WORKERS
        runs += run_workload("map_dataset", args.out, plan.mode, rounds, notes, workers)
    if "e" in args.parts:
        workers = (2,) if plan.mode == "smoke" else WORKERS
        runs += run_workload("tar_shards", args.out, plan.mode, rounds, notes, workers)
    print_report(runs, notes, plan.quick, time.time() - started)
    print(json.dumps(headline(runs, notes)))


def part_records(out: Path, plan: Plan, rounds: int, keep: bool) -> list[Run]:
    path = remove_at_exit(data_path(out, plan.records), keep)
    print(f"(a) 32 KiB records: {plan.records} records, {path}", flush=True)
    ensure_records(path, plan.records)
    check_stamps(path)
    runs: list[Run] = []
    for round_index in range(rounds):
        runs += run_round(path, plan.records, round_index, plan.records_time_s, plan.torch_workers)
    return runs


if __name__ == "__main__":
    main()
