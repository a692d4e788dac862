"""The vectordb benchmark's driver: plans, the per-dataset rounds, the report and the JSON line."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common.paths import OUT_DIR
from benchmarks.vectordb._common import Point, log, recall_at, stdout_to_stderr
from benchmarks.vectordb._data import SMOKE_SET, Dataset, load
from benchmarks.vectordb._ours import code_hash
from benchmarks.vectordb._report import (
    LABELS,
    curve_table,
    plot,
    summary,
    summary_table,
    update_table,
    verdicts,
)

K = 10


_SETTLE_S = 0.5  # pause before each system's sweep


@dataclass(frozen=True)
class Plan:
    rounds: int
    sweeps: dict[str, list[int]]
    datasets: list[str]
    update_steps: int
    variant: dict[str, Any] | None = None  # also run ours with these IndexConfig settings


QUICK = Plan(
    rounds=2,
    sweeps={
        "ours": [3, 4, 5, 6, 8, 12, 16, 48],
        "faiss_ondisk": [2, 4, 8, 16, 32],
        "faiss_ivf": [2, 4, 8, 16, 32],
        "faiss_hnsw": [16, 32, 64, 128],
        "diskann": [10, 16, 32, 64, 128],
    },
    datasets=["debian-minilm"],
    update_steps=4,
)
FULL = Plan(
    rounds=3,
    sweeps={
        "ours": [2, 3, 4, 5, 6, 8, 12, 16, 32, 48, 64, 96, 128],
        "faiss_ondisk": [1, 2, 4, 8, 16, 32, 64, 128],
        "faiss_ivf": [1, 2, 4, 8, 16, 32, 64, 128],
        "faiss_hnsw": [10, 16, 32, 64, 128, 256],
        "diskann": [10, 16, 32, 48, 64, 96, 128, 200],
    },
    datasets=["debian-minilm", "fashion-mnist", "gmm-2000000"],
    update_steps=10,
)
# the test suite's: a tiny generated set (no ../shared needed), every part but DiskANN (its
# venv is a pip install) in seconds; the figures mean nothing
SMOKE = Plan(
    rounds=1,
    sweeps={
        "ours": [2, 4],
        "faiss_ondisk": [2, 32],
        "faiss_ivf": [2, 32],
        "faiss_hnsw": [16, 32],
        "diskann": [],
    },
    datasets=[SMOKE_SET],
    update_steps=2,
)


def _byte_valued(base: np.ndarray) -> bool:
    """Every value an integer in 0..255 (checked on the whole set: the variant must be exact)."""
    if len(base) > 200_000:
        return False  # the generated sets are real-valued; do not scan gigabytes to learn it
    return bool(((base >= 0) & (base <= 255) & (base == np.round(base))).all())


def _systems(
    runner: asyncio.Runner,
    ds: Dataset,
    out: Path,
    quick: bool,
    skip: set[str],
    notes: list[str],
    variant: dict[str, Any] | None = None,
) -> tuple[list[Any], dict[str, float]]:
    from benchmarks.vectordb._faiss import MemorySystem, OnDiskIvf
    from benchmarks.vectordb._ours import OursSystem

    cache = out / "vectordb"
    ours = OursSystem(runner, ds, cache / "spann")
    systems: list[Any] = [ours]
    if "fp16" not in skip:  # the same index with float16 posting lists (half the bytes)
        systems.append(OursSystem(runner, ds, cache / "spann", dtype="float16"))
    byte_valued = "u8" not in skip and ds.metric != "cosine" and _byte_valued(ds.base)
    if byte_valued:
        # integer pixels 0..255 (fashion-mnist): uint8 lists hold them exactly, 1/4 the bytes
        systems.append(OursSystem(runner, ds, cache / "spann", dtype="uint8"))
    if variant:  # the same index built with other settings (--variant)
        other = OursSystem(runner, ds, cache / "spann", overrides=variant)
        other.name = "ours_cfg"
        systems.append(other)
        if byte_valued:
            other = OursSystem(runner, ds, cache / "spann", dtype="uint8", overrides=variant)
            other.name = "ours_cfg_uint8"
            systems.append(other)
    with stdout_to_stderr():  # faiss prints "resizing ..." from C++
        systems.append(OnDiskIvf(ds, cache / "faiss"))
        if any(s.name == "ours_uint8" for s in systems):  # the peer at the same precision
            systems.append(OnDiskIvf(ds, cache / "faiss", codes="u8"))
        kinds = [kind for kind in ("ivf", "hnsw") if kind not in skip]
        systems += [MemorySystem(kind, ds, cache / "faiss") for kind in kinds]
    if "hnsw" in skip:
        notes.append(f"{ds.name}: faiss HNSW (in RAM) skipped by --skip hnsw")
    if "diskann" not in skip:
        from benchmarks.vectordb._diskann import DiskAnnSystem, Unavailable

        try:
            big = len(ds.base) > 200_000  # ~100 s per 20k vectors: hours at 2M
            if big:
                raise Unavailable(f"not built for {len(ds.base):,} vectors (hours here)")
            data_dir = cache / "data"
            systems.append(DiskAnnSystem(ds, out, data_dir, ours.resident_bytes, not quick))
        except Unavailable as why:
            notes.append(f"{ds.name}: DiskANN skipped: {why}")
            log(notes[-1])
    builds = {s.name: s.build_s for s in systems}
    return systems, builds


def run_dataset(
    runner: asyncio.Runner, ds: Dataset, plan: Plan, out: Path, quick: bool, skip: set[str],
    notes: list[str],
) -> tuple[list[Point], dict[str, float], dict[str, Any]]:  # fmt: skip

    systems, builds = _systems(runner, ds, out, quick, skip, notes, plan.variant)
    sweeps = dict(plan.sweeps)  # the default setting is always measured (the headline uses it)
    sweeps["ours"] = sorted({*sweeps["ours"], systems[0].stats["default_max_postings"]})
    if len(ds.base) > 1_000_000 and not quick:  # big indexes need more lists for high recall
        sweeps["ours"] = sorted({*sweeps["ours"], 192, 256})
    for name in ("ours_fp16", "ours_uint8", "ours_cfg", "ours_cfg_uint8"):
        sweeps[name] = sweeps["ours"]
    sweeps["faiss_ondisk_u8"] = sweeps["faiss_ondisk"]
    points: dict[tuple[str, int], Point] = {}
    extra = {"ours_stats": systems[0].stats}
    try:
        # one untimed pass first, for every system alike: first-touch costs (page faults on
        # fresh buffers, lazily loaded tables, the VM's host backing new memory) are not what
        # a serving index pays per batch
        for system in systems:
            time.sleep(_SETTLE_S)
            for value in sweeps[system.name]:
                system.run(value, ds.queries, K)
        log(f"[{ds.name}] warm-up pass done")
        for r in range(plan.rounds):
            # every system and setting once per round, back to back, so load bursts hit all
            for system in systems:
                # DiskANN's OpenMP (libiomp5) keeps its threads spinning ~200 ms after a
                # search (KMP_BLOCKTIME): let a system's leftovers settle before the next
                time.sleep(_SETTLE_S)
                for value in sweeps[system.name]:
                    ids, wall_s, io = system.run(value, ds.queries, K)
                    key = (system.name, value)
                    if key not in points:
                        points[key] = Point(system.name, system.knob, value,
                                            system.resident_bytes, len(ds.queries))  # fmt: skip
                    recall = recall_at(ids, ds.gt, K)
                    points[key].add_round(wall_s, recall, io)
                    log(
                        f"[{ds.name} round {r + 1}/{plan.rounds}] {system.name} "
                        f"{system.knob}={value}: recall {recall:.4f}, "
                        f"{len(ds.queries) / wall_s:,.0f} QPS, load1 {os.getloadavg()[0]:.1f}"
                    )
    finally:
        for system in systems:
            system.close()
    extra["diskann_rss_growth"] = next(
        (s.rss_growth_bytes for s in systems if s.name == "diskann"), None
    )
    return list(points.values()), builds, extra


def _settings(text: str) -> dict[str, Any]:
    """``key=value,...`` as IndexConfig settings (numbers parsed)."""
    out: dict[str, Any] = {}
    for item in filter(None, text.split(",")):
        key, _, value = item.partition("=")
        try:
            out[key.strip()] = int(value)
        except ValueError:
            out[key.strip()] = float(value)
    return out


def _describe(variant: dict[str, Any]) -> str:
    return ", ".join(f"{key}={value}" for key, value in sorted(variant.items()))


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="SPANN index vs faiss and DiskANN (issue 4)")
    parser.add_argument("--quick", action="store_true", help="debian-minilm only, ~1-2 min")
    parser.add_argument("--smoke", action="store_true", help=argparse.SUPPRESS)  # tests only
    parser.add_argument("--datasets", help="comma-separated, e.g. debian-minilm,gmm-500000")
    parser.add_argument("--rounds", type=int)
    parser.add_argument(
        "--skip", default="", help="comma-separated: diskann, update, fp16, u8, hnsw, budget"
    )
    parser.add_argument("--budget-only", action="store_true", help="only the memory-budget part")
    parser.add_argument(
        "--reuse-build",
        action="store_true",
        help="budget part: ours may search a finished build of the same data by other vectordb "
        "code when this code's is missing (same on-disk format; said in the notes)",
    )
    parser.add_argument(
        "--variant",
        default="",
        help="also run ours built with these settings, e.g. replica_count=2,closure=1.25",
    )
    parser.add_argument("--head-fraction", type=float, help="same as --variant head_fraction=X")
    parser.add_argument("--out", type=Path, default=OUT_DIR)
    return parser.parse_args(argv)


def run(argv: list[str] | None = None) -> None:
    args = parse(argv)
    plan = SMOKE if args.smoke else QUICK if args.quick else FULL
    args.quick = args.quick or args.smoke  # smoke: quick's choices, smaller
    datasets = args.datasets.split(",") if args.datasets else plan.datasets
    rounds = args.rounds or plan.rounds
    variant = _settings(args.variant)
    if args.head_fraction is not None:
        variant["head_fraction"] = args.head_fraction
    if variant:
        LABELS["ours_cfg"] = f"ours, {_describe(variant)} (cold cache)"
        LABELS["ours_cfg_uint8"] = f"ours, {_describe(variant)}, uint8 lists (cold cache)"
    plan = Plan(rounds, plan.sweeps, datasets, plan.update_steps, variant or None)
    skip = set(filter(None, args.skip.split(","))) | ({"diskann"} if args.smoke else set())
    started = time.time()
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    print(f"## vectordb benchmark ({'quick' if args.quick else 'full'}, {rounds} rounds)\n")
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    machine = f"{platform.system()} {platform.release()}, nproc={os.cpu_count()}"
    print(f"{machine}, git {head.stdout.strip()}, vectordb code {code_hash()}, {when}\n")
    notes: list[str] = []
    headline: dict[str, Any] = {}
    upd = None
    with asyncio.Runner() as runner:
        for name in datasets:
            ds = load(name, args.out / "vectordb" / "data")
            if ds is None:
                notes.append(f"{name}: data absent, skipped")
                continue
            log(f"=== {name}: {ds.base.shape[0]:,} x {ds.base.shape[1]}, {len(ds.queries)} queries")
            if args.budget_only:
                headline.update(_budget(runner, ds, args, notes))
                continue
            points, builds, extra = run_dataset(runner, ds, plan, args.out, args.quick, skip, notes)
            print(curve_table(name, ds.raw_bytes, points) + "\n")
            print(summary_table(name, points, builds) + "\n")
            plot(name, points, args.out / f"vectordb_spann_{name}.png")
            if name in ("debian-minilm", SMOKE_SET):  # the headline set, with the update phase
                headline = _headline(name, points, extra)
                if "update" not in skip:
                    from benchmarks.vectordb._update import update_phase

                    upd = update_phase(runner, ds, args.out / "vectordb" / "spann",
                                       plan.update_steps)  # fmt: skip
                    print(update_table(upd) + "\n")
                    if plan.variant:  # the same phase on the index built with --variant
                        other = update_phase(runner, ds, args.out / "vectordb" / "spann",
                                             plan.update_steps, plan.variant)  # fmt: skip
                        print(f"Update phase with {_describe(plan.variant)}:\n")
                        print(update_table(other) + "\n")
                    headline["insert_vectors_per_s"] = round(upd.insert_rate, 1)
                    headline["recall_after_updates"] = round(upd.final_recall, 4)
                    headline["min_recall_during_updates"] = round(upd.min_recall, 4)
                print("\n".join(verdicts(summary(points), headline["resident_fraction"], upd)))
                print()
                if "budget" not in skip:
                    headline.update(_budget(runner, ds, args, notes))
            else:  # the QPS and memory targets on the other sets too
                fraction = extra["ours_stats"]["resident_fraction"]
                print(f"#### {name}: targets\n")
                print("\n".join(verdicts(summary(points), fraction, None)) + "\n")
    for note in notes:
        print(f"* {note}")
    headline["notes"] = notes
    headline["elapsed_s"] = round(time.time() - started, 1)
    print(json.dumps(headline))


def _budget(
    runner: asyncio.Runner, ds: Dataset, args: argparse.Namespace, notes: list[str]
) -> dict[str, Any]:
    """The memory-budget part (issue 14): each system in its own process under a cgroup."""
    from benchmarks.vectordb import _budget

    plan = _budget.SMOKE if args.smoke else _budget.QUICK if args.quick else _budget.FULL
    if len(ds.base) > _budget.BIG_ROWS:  # the 2M sets: their own knobs, ours opened once
        plan = _budget.BIG
    cache = args.out / "vectordb"
    return _budget.budget_part(runner, ds, cache, plan, notes, args.reuse_build)


def _headline(name: str, points: list[Point], extra: dict[str, Any]) -> dict[str, Any]:
    """The JSON fields the issue asks for: ours at the default setting, and the ratios."""

    at = summary(points)
    default = extra["ours_stats"]["default_max_postings"]  # grows with the index's heads
    ours = next(p for p in points if p.system == "ours" and p.value == default)
    stats = extra["ours_stats"]

    def ratio(peer: str) -> float | None:
        return round(at["ours"] / at[peer], 3) if at.get("ours") and at.get(peer) else None

    def rounded(value: float | None) -> float | None:
        return None if value is None else round(value, 1)

    return {
        "dataset": name,
        "default_max_postings": default,
        "recall_at_10": round(ours.recall, 4),
        "qps": round(ours.qps, 1),
        "qps_vs_faiss_ondisk": ratio("faiss_ondisk"),
        "qps_vs_diskann": ratio("diskann"),
        "fp16_qps_vs_faiss_ondisk": (
            round(at["ours_fp16"] / at["faiss_ondisk"], 3)
            if at.get("ours_fp16") and at.get("faiss_ondisk")
            else None
        ),
        "resident_fraction": round(stats["resident_fraction"], 4),
        "pages_per_query": round(ours.io["pages_alone"], 1),
        "pages_per_query_batched": round(ours.io["pages"], 1),
        "qps_at_recall_0_9": {s: rounded(v) for s, v in at.items()},
    }
