"""The tiers benchmark's driver: modes, the order of the parts, progress lines and the report."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.common.fio import ensure_fio
from benchmarks.common.measure import (
    MIB,
    code_version,
    ensure_data_file,
    machine_string,
    median,
    spread,
)
from benchmarks.common.paths import OUT_DIR
from benchmarks.common.scratch import remove_at_exit
from benchmarks.tiers._store_batch import (
    batch_counts,
    batch_figures,
    batch_round,
    batch_tiers,
    fill,
)
from benchmarks.tiers._store_lru_peer import (
    POLICIES as PEER_POLICIES,
)
from benchmarks.tiers._store_lru_peer import (
    naive_gets_per_s,
    peer_work,
    populate_peer,
    store_gets_per_s,
)
from benchmarks.tiers._store_memory import SIZES, OpSample, hit_overhead, memory_round, size_label
from benchmarks.tiers._store_nvme import QD, nvme_round, object_counts
from benchmarks.tiers._store_report import (
    MEMORY_ROWS,
    NVME_ROWS,
    extra_rows,
    extra_verdicts,
    headline,
    hit_table,
    op_table,
    target_table,
    zipf_table,
)
from benchmarks.tiers._store_zipf import (
    BATCH,
    CONCURRENCY,
    VARIANTS,
    ZipfSample,
    make_workload,
    populate,
    run_variant,
    simulated_lru_hit_rate,
    static_oracle_hit_rate,
)
from tiers.io import IORuntime
from tiers.nvme import NvmeTier, record_bytes

DEFAULT_DIR = OUT_DIR


@dataclass(frozen=True)
class Plan:
    mode: str  # "full", "quick" or "smoke": also picks the NVMe object counts
    rounds: int
    warmup_s: float
    duration_s: float
    copy_budget_bytes: int  # bytes per memory-tier series (op count = budget / size, clamped)
    min_ops: int
    max_ops: int
    hit_repeats: int
    hit_loop_ops: int
    zipf_rounds: int
    zipf_dram_bytes: int
    zipf_warmup_ops: int
    zipf_measure_ops: int
    zipf_s: float


QUICK = Plan("quick", 2, 0.25, 1.5, 64 * MIB, 20, 2000, 12, 5000, 2, 16 * MIB, 2000, 4000, 1.0)
FULL = Plan("full", 5, 0.5, 3.0, 512 * MIB, 60, 20000, 24, 20000, 3, 64 * MIB, 8000, 16000, 1.0)
# the test suite's: every part and every key of the report, in seconds; the figures mean nothing
SMOKE = Plan("smoke", 1, 0.05, 0.2, 4 * MIB, 3, 50, 2, 200, 1, 1 * MIB, 100, 200, 1.0)


def cpu_ticks() -> tuple[int, int]:
    """(steal, total) jiffies of all CPUs so far, from /proc/stat; (0, 0) where unreadable."""
    try:
        with open("/proc/stat") as stat:
            fields = [int(v) for v in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return 0, 0
    return (fields[7] if len(fields) > 7 else 0), sum(fields[:8])


class Phase:
    """Load and CPU steal (time the hypervisor gave our vCPUs to others) over one phase."""

    def __init__(self, name: str, into: dict[str, str]) -> None:
        self.name, self.into = name, into

    def __enter__(self) -> Phase:
        self.ticks, self.load1 = cpu_ticks(), os.getloadavg()[0]
        return self

    def __exit__(self, *exc: object) -> None:
        steal, total = (b - a for a, b in zip(self.ticks, cpu_ticks(), strict=True))
        share = f"{steal / total:.1%}" if total else "?"
        self.into[self.name] = f"load1 {self.load1:.1f}->{os.getloadavg()[0]:.1f}, steal {share}"


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _log_samples(samples: list[OpSample], round_index: int, rounds: int) -> None:
    for s in samples:
        log(
            f"[round {round_index + 1}/{rounds}] {size_label(s.size_bytes):>6} {s.tier:>6} "
            f"{s.op:>8}: {s.gbps:7.2f} GB/s  p50 {s.p50_us:9.1f} us  p99 {s.p99_us:9.1f} us "
            f"({s.ops} ops, load1={os.getloadavg()[0]:.1f})"
        )


async def _hit_chunk(plan: Plan, hits: dict[str, list[float]]) -> None:
    """Some of the hit-cost repeats: they are spread over the run (at the start and after each
    round) so that a burst of load from another tenant cannot decide them all."""
    chunk = await hit_overhead(-(-plan.hit_repeats // (plan.rounds + 1)), plan.hit_loop_ops)
    for name, values in chunk.items():
        hits.setdefault(name, []).extend(values)


async def _micro(
    plan: Plan, out_dir: Path, fio: str, fio_path: Path, runtime: Any, hits: dict[str, list[float]]
) -> tuple:
    counts = object_counts(plan.mode)
    capacity = sum(record_bytes(size) * n for size, n in counts.items())
    capacity = capacity * 5 // 4 + QD * record_bytes(max(SIZES)) + 64 * MIB
    tier_dir = out_dir / "tiers_nvme"
    shutil.rmtree(tier_dir, ignore_errors=True)
    samples: list[OpSample] = []
    notes: dict[str, Any] = {}
    tier = await NvmeTier.open(
        "nvme", capacity, tier_dir, runtime=runtime, direct=True, create=True
    )
    try:
        for r in range(plan.rounds):
            memory, notes = await memory_round(
                r, plan.copy_budget_bytes, plan.min_ops, plan.max_ops
            )
            _log_samples(memory, r, plan.rounds)
            nvme = await nvme_round(tier, fio, fio_path, counts, r, plan.warmup_s, plan.duration_s)
            _log_samples(nvme, r, plan.rounds)
            samples += memory + nvme
            await _hit_chunk(plan, hits)
        stats = tier.stats()
        notes["nvme_engine"] = stats.get("engine")
        notes["nvme_puts"] = stats.get("puts")
        notes["nvme_catalog_commits"] = stats.get("catalog_commits")
    finally:
        await tier.aclose()
        shutil.rmtree(tier_dir, ignore_errors=True)
    return samples, notes, counts


async def _batches(plan: Plan, out_dir: Path, fio: str, fio_path: Path, runtime: Any) -> dict:
    """get_many vs fio randread QD32, put_many and concurrent puts vs fio fsync'd writes."""
    counts = batch_counts(plan.mode)
    directory = out_dir / "tiers_batch"
    shutil.rmtree(directory, ignore_errors=True)
    put_path = remove_at_exit(out_dir / "tiers_fio_fsync.dat", False)
    capacity = sum(size * n for size, n in counts.items()) * 2 + 256 * MIB
    samples = []
    try:
        async with batch_tiers(directory, capacity, runtime) as (gets, puts):
            for tier in (gets, puts):  # the puts' tier holds the same objects as before
                await fill(tier, counts)
            for r in range(plan.rounds):
                got = await batch_round(
                    gets, puts, fio, fio_path, put_path, counts, r, plan.warmup_s, plan.duration_s
                )
                for s in got:
                    what = f"{s.what:>16} {s.size_bytes // 1024:>3} KiB"
                    log(f"[batch round {r + 1}/{plan.rounds}] {what}: {s.per_s:10,.0f} /s")
                samples += got
            stats = puts.stats()
            notes = {k: stats[k] for k in ("fdatasyncs", "fdatasync_waits", "catalog_commits")}
    finally:
        shutil.rmtree(directory, ignore_errors=True)
        put_path.unlink(missing_ok=True)
    return {"figures": batch_figures(samples), "notes": notes}


async def _lru_peer(plan: Plan, out_dir: Path, runtime: Any) -> dict[str, list[float]]:
    """The store's policies vs a hand-written dict + OrderedDict LRU over O_DIRECT preads."""
    work = peer_work(plan.mode)
    directory = out_dir / "tiers_peer"
    shutil.rmtree(directory, ignore_errors=True)
    out: dict[str, list[float]] = {"naive": [], "ratio": [], "naive_hit": []}
    try:
        await populate_peer(directory, work, runtime)
        for r in range(plan.zipf_rounds):
            naive, naive_hit = await asyncio.to_thread(naive_gets_per_s, directory, work)
            rates = {}
            for policy in PEER_POLICIES:
                rates[policy], hit = await store_gets_per_s(directory, work, policy, runtime)
                out.setdefault(policy, []).append(rates[policy])
                out.setdefault(f"{policy}_hit", []).append(hit)
            out["naive"].append(naive)
            out["naive_hit"].append(naive_hit)
            out["ratio"].append(max(rates.values()) / naive)
            policies = ", ".join(f"{p} {v:,.0f}" for p, v in rates.items())
            log(f"[lru peer round {r + 1}] naive {naive:,.0f} gets/s ({naive_hit:.3f}); {policies}")
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return out


async def _zipf(plan: Plan, out_dir: Path, runtime: Any) -> tuple:
    work = make_workload(
        plan.zipf_dram_bytes, plan.zipf_warmup_ops, plan.zipf_measure_ops, plan.zipf_s, seed=11
    )
    directory = out_dir / "tiers_zipf"
    shutil.rmtree(directory, ignore_errors=True)
    try:
        took = await populate(directory, runtime, work)
        log(
            f"zipf: {len(work.keys)} objects, {work.sizes.sum() / MIB:.0f} MiB on NVMe "
            f"(DRAM {plan.zipf_dram_bytes / MIB:.0f} MiB) written in {took:.1f} s"
        )
        samples: list[ZipfSample] = []
        extras: dict[str, Any] = {}
        for r in range(plan.zipf_rounds):
            order = VARIANTS[r % len(VARIANTS) :] + VARIANTS[: r % len(VARIANTS)]
            for variant in order:
                sample, extra = await run_variant(variant, directory, runtime, work, r)
                samples.append(sample)
                if extra:
                    extras[variant] = extra["tiers"][0]
                log(
                    f"[zipf round {r + 1}/{plan.zipf_rounds}] {variant:>9}: hit "
                    f"{sample.hit_rate:.3f} (bytes {sample.byte_hit_rate:.3f}), "
                    f"{sample.gets_per_s:8,.0f} gets/s, {sample.mb_per_s:6,.0f} MB/s, p50 "
                    f"{sample.p50_us:6.0f} us, p99 {sample.p99_us:7.0f} us, drain "
                    f"{sample.drain_share:.2f}, NVMe reads/miss {sample.nvme_reads_per_miss:.2f}"
                )
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    sims = {"lru": simulated_lru_hit_rate(work), "oracle": static_oracle_hit_rate(work)}
    return samples, sims, work, extras


async def _main(plan: Plan, args: argparse.Namespace) -> dict[str, Any]:
    fio = ensure_fio()
    counts = object_counts(plan.mode)
    fio_bytes = max(size * n for size, n in counts.items())
    fio_path = remove_at_exit(args.dir / f"tiers_fio_{fio_bytes // MIB}m.dat", args.keep_data)
    made = ensure_data_file(fio_path, fio_bytes)
    log(f"{'wrote' if made else 'reusing'} {fio_path}")
    started = time.perf_counter()
    phases: dict[str, str] = {}
    hits: dict[str, list[float]] = {}
    with Phase("hit cost (first chunk)", phases):
        await _hit_chunk(plan, hits)
    runtime = IORuntime()
    try:
        with Phase("per-tier", phases):
            samples, notes, counts = await _micro(plan, args.dir, fio, fio_path, runtime, hits)
        log(
            "hit cost (us beyond the copy): "
            + ", ".join(f"{k} {median(v):.3f}" for k, v in hits.items())
        )
        with Phase("batches", phases):
            batches = await _batches(plan, args.dir, fio, fio_path, runtime)
        with Phase("zipf", phases):
            zipf, sims, work, extras = await _zipf(plan, args.dir, runtime)
        with Phase("lru peer", phases):
            peer = await _lru_peer(plan, args.dir, runtime)
    finally:
        runtime.close()
    return {
        "batches": batches,
        "peer": peer,
        "samples": samples,
        "hits": hits,
        "zipf": zipf,
        "sims": sims,
        "work": work,
        "notes": notes,
        "counts": counts,
        "extras": extras,
        "phases": phases,
        "elapsed_s": time.perf_counter() - started,
    }


def _report(plan: Plan, mode: str, result: dict[str, Any], version: str) -> dict[str, Any]:
    samples, zipf, work = result["samples"], result["zipf"], result["work"]
    figures = headline(samples, result["hits"], zipf, result["sims"])
    batch, peer = result["batches"]["figures"], result["peer"]
    spreads: dict[str, str] = {}
    for key, values in [*batch.items(), ("zipf_gets_vs_naive_lru", peer["ratio"])]:
        digits = 3 if "_vs_" in key else 0
        figures[key] = round(median(values), digits)
        spreads[key] = spread(values, ".3f" if digits else ",.0f")
    figures["zipf_naive_lru_gets_per_s"] = round(median(peer["naive"]))
    for policy in PEER_POLICIES:
        figures[f"zipf_peer_gets_per_s_{policy}"] = round(median(peer[policy]))
    figures["spreads"] = spreads
    figures["targets"].update(extra_verdicts(figures))
    notes = result["notes"]
    figures.update(
        {
            "cxl_emulated": notes.get("cxl_emulated"),
            "hbm_device": notes.get("hbm_device"),
            "nvme_qd": QD,
            "nvme_engine": notes.get("nvme_engine"),
            "zipf_s": work.zipf_s,
            "zipf_objects": len(work.keys),
            "zipf_dram_mib": work.dram_bytes // MIB,
            "elapsed_s": round(result["elapsed_s"], 1),
            "phases": result["phases"],
            "machine": machine_string(),
            "mode": mode,
            "code": version,
        }
    )
    counts = ", ".join(f"{size_label(s)} x {n}" for s, n in result["counts"].items())
    compactions = {
        v: (e.get("compactions"), e.get("compacted_bytes", 0) // MIB, e.get("promotions"))
        for v, e in result["extras"].items()
        if v != "nvme-only"
    }
    lines = [
        f"## tiers ({mode}): {plan.rounds} rounds; NVMe and fio {plan.duration_s:g} s per run "
        f"(+{plan.warmup_s:g} s warm-up) at QD{QD}",
        "",
        f"machine: {figures['machine']}; code: {version}",
        "load and CPU steal per phase: "
        + "; ".join(f"{k}: {v}" for k, v in result["phases"].items()),
        f"DRAM pinned: {notes.get('dram_pinned')}; HBM device: {notes.get('hbm_device')}; CXL "
        f"emulated: {notes.get('cxl_emulated')} ({notes.get('cxl_model')}); NVMe engine: "
        f"{notes.get('nvme_engine')}, O_DIRECT; NVMe objects per size: {counts}",
        "",
        "### Memory tiers vs np.copyto (reference: copy between two preallocated arrays)",
        "",
        *op_table(samples, MEMORY_ROWS),
        "",
        f"### NVMe vs fio (io_uring, O_DIRECT, QD{QD}): gets vs randread; puts (write + "
        "fdatasync + catalog commit) vs sequential write with --fdatasync=1",
        "",
        *op_table(samples, NVME_ROWS),
        "",
        f"NVMe puts: {notes.get('nvme_puts')} puts, each with its own fdatasync of the extent "
        f"file; {notes.get('nvme_catalog_commits')} catalog (LMDB) commits, group-committed. "
        "Objects of whole 4 KiB pages move as bare records (4 KiB takes 4 KiB); others carry a "
        "64-byte header in their last page's padding.",
        "",
        f"### DRAM hit bookkeeping (4 KiB objects, {len(result['hits']['tier'])} repeats of "
        f"{plan.hit_loop_ops} gets, spread over the run: at the start and after each round)",
        "",
        *hit_table(result["hits"]),
        "",
        f"### Zipf(s={work.zipf_s:g}): {len(work.keys)} objects, "
        f"{work.sizes.sum() / MIB:.0f} MiB = 4x DRAM {work.dram_bytes // MIB} MiB; "
        f"{work.warmup_ops} warm-up + {len(work.trace) - work.warmup_ops} measured gets, "
        f"{CONCURRENCY} concurrent, drain() every {BATCH}; {plan.zipf_rounds} rounds",
        "",
        *zipf_table(zipf),
        "",
        f"References on the same trace: textbook LRU (synchronous admission) "
        f"{result['sims']['lru']:.3f}; static oracle (highest popularity/size) "
        f"{result['sims']['oracle']:.3f}. DRAM tier (compactions, MiB compacted, promotions), last "
        f"round: {compactions}",
        "",
        "### Batches and group commit (median (min-max) of per-round figures)",
        "",
        *[f"* {key}: {value}" for key, value in spreads.items()],
        f"* NvmeTier fdatasyncs / waits / catalog commits over the batch phase: "
        f"{result['batches']['notes']}",
        f"* Zipf(0.99) LRU peer, gets/s: naive {figures['zipf_naive_lru_gets_per_s']:,}; "
        + ", ".join(f"{p} {figures[f'zipf_peer_gets_per_s_{p}']:,}" for p in PEER_POLICIES)
        + f"; DRAM hit rates: naive {median(peer['naive_hit']):.3f}, "
        + ", ".join(f"{p} {median(peer[f'{p}_hit']):.3f}" for p in PEER_POLICIES),
        "",
        "### Targets",
        "",
        *target_table(figures),
        *[f"| {a} | {b} | {c} | {d} |" for a, b, c, d in extra_rows(figures)],
        "",
    ]
    print("\n".join(lines), flush=True)
    return figures


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Tier and TieredStore benchmark (issue 3)")
    parser.add_argument("--quick", action="store_true", help="2 rounds, small sizes (~2 min)")
    parser.add_argument("--smoke", action="store_true", help=argparse.SUPPRESS)  # tests only
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="where the files live")
    parser.add_argument(
        "--keep-data", action="store_true", help="keep the fio data file for the next run"
    )
    return parser.parse_args(argv)


def run(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    plan = SMOKE if args.smoke else QUICK if args.quick else FULL
    mode = plan.mode
    version = code_version()
    log(f"tiers code: {version}")
    args.dir.mkdir(parents=True, exist_ok=True)
    result = asyncio.run(_main(plan, args))
    figures = _report(plan, mode, result, version)
    print(json.dumps(figures), flush=True)
