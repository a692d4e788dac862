r"""KV-cache store benchmark (issue 17 "Measure"): the Mooncake trace vs Belady, throughput of
real-size blocks vs the raw tier, reopen time, restart, capacity, KIVI.

Sections (each module's docstring has the details):

* hit rates (hit_rates.py, replay.py, belady.py, lru_model.py): the Mooncake conversation
  trace (``../shared/data/mooncake-traces/conversation_trace.jsonl``; a synthetic Zipf-prefix
  trace where it is missing, said so) replayed through ``KVBlockStore`` per policy at 5%, 10%
  and 25% of its unique blocks, beside Belady's MIN and a plain LRU. Blocks are scaled to 4
  KiB (the hit rate depends only on how many blocks fit); the full run replays the 10% cell
  on the NVMe tier (and again on DRAM, to show the decisions are the same), the others on a
  DRAM tier; ``--quick`` replays the whole trace too, all on DRAM (a prefix of the trace is
  not a smaller copy of it: its reuse distances are the whole trace's, its capacities 10% of
  fewer blocks, so its ratios to Belady are far lower), and checks the restart on the first
  2,000 requests (with and without it, on disk). ``admission_sweep.py`` shows how the
  ``prefix-admit`` policy's parameters were picked on the trace's first half.
* throughput (throughput.py): 64 MiB blocks of a 7B model (Mistral-7B-like) through
  ``store``/``load``/``load_layer`` vs the same bytes through ``tiers.open_store``
  ``put_many``/``get_many``/``get(byte_range)``, alternating rounds.
* reopen (reopen.py): open time of a store of N blocks; the hit rate of the trace's second
  half after a close + reopen at half time, vs the uninterrupted replay.
* capacity: after every ``store`` of every replay, the largest ``used_bytes - capacity_bytes``
  over the tiers; on disk, every 500 requests, the store directory's allocated bytes (extent
  files and the LMDB catalog) minus the disk cap. ``capacity_overrun_bytes`` is the largest of
  both (0 or more); ``capacity_overrun_bytes_tier_accounting`` the tiers' own figure alone,
  ``capacity_overrun_bytes_extent_files`` the data files' alone (without the catalog).
* KIVI (kivi_figures.py): bytes ratio of a 4-bit block, logit error on the tiny model.

Tables go to stdout, progress to stderr; the last line is one JSON object (the issue's keys,
per-policy hit rates, every section's raw figures, ``machine``, ``mode``, ``trace``).

    flock /tmp/tierkit-bench.lock .venv/bin/python -m benchmarks.kvstore.cache --quick  # ~4 min
    flock /tmp/tierkit-bench.lock .venv/bin/python -m benchmarks.kvstore.cache          # ~20 min

``--smoke`` (the test suite's): 300 requests of the synthetic trace, 64 KiB blocks for the
throughput, 2,000 blocks to reopen; its figures mean nothing. ``--skip kivi,...`` drops
sections; ``--requests N`` replays the first N requests.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from benchmarks.common.paths import OUT_DIR
from benchmarks.common.scratch import remove_at_exit
from benchmarks.kvstore import report
from benchmarks.kvstore.hit_rates import capacity_cell, replay_policy
from benchmarks.kvstore.kivi_figures import kivi_figures
from benchmarks.kvstore.reopen import measure_reopen, restart_hit_rates
from benchmarks.kvstore.throughput import FP_7B, measure_throughput
from benchmarks.kvstore.trace import (
    MOONCAKE_CONVERSATION,
    check_prefix_forest,
    load_trace,
    synthetic_trace,
)
from kvstore import ModelFingerprint

FRACTIONS = (0.05, 0.10, 0.25)
SECTIONS = ("hit_rates", "throughput", "reopen", "restart", "kivi")


@dataclass(frozen=True)
class Plan:
    requests: int | None  # replay the first N requests (None: all)
    restart_requests: int | None  # the restart check's first N requests (None: as requests)
    tp_blocks: int  # throughput: blocks per op
    tp_rounds: int  # throughput: timed rounds
    tp_layers: int  # throughput: layers load_layer reads
    reopen: tuple[int, ...]  # block counts to reopen


_QUICK = Plan(
    requests=None, restart_requests=2_000, tp_blocks=4, tp_rounds=4, tp_layers=2,
    reopen=(20_000,),
)  # fmt: skip
_FULL = Plan(
    requests=None, restart_requests=None, tp_blocks=16, tp_rounds=6, tp_layers=8,
    reopen=(200_000, 1_000_000),
)  # fmt: skip
# --smoke (the test suite's): the synthetic trace, 64 KiB "real" blocks; figures mean nothing
_SMOKE = Plan(
    requests=300, restart_requests=None, tp_blocks=2, tp_rounds=2, tp_layers=1,
    reopen=(2_000,),
)  # fmt: skip
_SMOKE_FP = ModelFingerprint(
    model="bench-smoke", dtype="bfloat16", num_layers=4, block_tokens=32, num_kv_heads=2,
    head_dim=64,
)  # fmt: skip


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="KV-cache store benchmark (issue 17)")
    parser.add_argument("--quick", action="store_true", help="a prefix of the trace, small N")
    parser.add_argument("--smoke", action="store_true", help="tiny synthetic run (tests)")
    parser.add_argument("--trace", type=Path, default=MOONCAKE_CONVERSATION)
    parser.add_argument("--requests", type=int, help="replay only the first N requests")
    parser.add_argument("--reopen-blocks", help="comma-separated block counts to reopen")
    parser.add_argument("--skip", default="", help=f"comma-separated, of {','.join(SECTIONS)}")
    parser.add_argument("--out", type=Path, default=OUT_DIR / "kvstore", help="scratch folder")
    args = parser.parse_args(argv)
    unknown = set(filter(None, args.skip.split(","))) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown sections to skip: {sorted(unknown)}")
    return args


def machine() -> str:
    model = next(
        (line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
         if line.startswith("model name")), "",
    )  # fmt: skip
    return (
        f"{platform.system()} {platform.release()}, nproc={os.cpu_count()}, {model}, "
        f"load1 at start {os.getloadavg()[0]:.2f}, Python {platform.python_version()}"
    )


def _progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    plan = _SMOKE if args.smoke else _QUICK if args.quick else _FULL
    if args.requests:
        plan = replace(plan, requests=args.requests)
    if args.reopen_blocks:
        plan = replace(plan, reopen=tuple(int(n) for n in args.reopen_blocks.split(",")))
    skip = set(filter(None, args.skip.split(",")))
    work = remove_at_exit(args.out / f"scratch-{os.getpid()}")
    work.mkdir(parents=True, exist_ok=True)
    if args.smoke:
        trace = synthetic_trace(requests=plan.requests or 300, conversations=40)
    else:
        trace = load_trace(args.trace, plan.requests)
    quick = args.quick or args.smoke
    figures: dict[str, Any] = {
        "mode": "smoke" if args.smoke else "quick" if args.quick else "full",
        "machine": machine(),
        "trace": {**trace.summary(), "prefix_conflicts": check_prefix_forest(trace.requests)},
        "scaling": "replay blocks are 4 KiB (1 layer, 16 tokens, 1 head, 64 dims, bf16); the "
        "store's last tier holds capacity_blocks * 4 KiB; hit rate = prefix-hit blocks / "
        "block accesses",
        "hit_rates": [],
    }
    if "hit_rates" not in skip:
        for fraction in FRACTIONS:
            on_disk = not quick and fraction == 0.10
            _progress(f"hit rates at {fraction:.0%} ({'disk' if on_disk else 'dram'})")
            figures["hit_rates"].append(
                await capacity_cell(
                    work, trace.requests, fraction, trace.unique_blocks,
                    "disk" if on_disk else "dram", check_dram=on_disk,
                )
            )  # fmt: skip
    ten = next((c for c in figures["hit_rates"] if c["fraction"] == 0.10), None)
    if "restart" not in skip and ten is not None:
        policy = ten["best_policy"]
        requests, capacity_blocks = trace.requests, ten["capacity_blocks"]
        if plan.restart_requests and plan.restart_requests < len(requests):
            requests = requests[: plan.restart_requests]
            unique = len({block for chain in requests for block in chain})
            capacity_blocks = max(1, round(unique * 0.10))
        _progress(f"restart mid-trace ({policy}, disk, {len(requests):,} requests)")
        restart = await restart_hit_rates(work / "restart", requests, capacity_blocks, policy)
        if requests is trace.requests:
            no_restart = ten["policies"][policy]["second_half_hit_rate"]
        else:  # the same prefix of the trace on disk, without the restart
            twin = await replay_policy(work, requests, capacity_blocks, policy, "disk")
            no_restart = twin["second_half_hit_rate"]
        restart["requests"] = len(requests)
        restart["second_half_hit_rate_no_restart"] = no_restart
        restart["restart_vs_no_restart"] = (
            round(restart["second_half_hit_rate_restart"] / no_restart, 4) if no_restart else None
        )
        figures["restart"] = restart
    if "throughput" not in skip:
        fingerprint = _SMOKE_FP if args.smoke else FP_7B
        _progress(f"throughput: {plan.tp_blocks} blocks, {plan.tp_rounds} rounds")
        figures["throughput"] = await measure_throughput(
            work / "throughput", plan.tp_blocks, plan.tp_rounds, plan.tp_layers,
            fingerprint,
        )  # fmt: skip
    if "reopen" not in skip:
        figures["reopen"] = []
        for blocks in plan.reopen:
            _progress(f"reopen: filling {blocks:,} blocks")
            figures["reopen"].append(await measure_reopen(work / "reopen", blocks))
    figures["kivi"] = {}
    if "kivi" not in skip:
        _progress("kivi")
        figures["kivi"] = kivi_figures()
    shutil.rmtree(work, ignore_errors=True)
    return figures


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    started_s = time.perf_counter()
    figures = asyncio.run(run(args))
    figures["elapsed_s"] = round(time.perf_counter() - started_s, 1)
    for line in report.tables(figures):
        print(line)
    keys = report.headline(figures)
    print(json.dumps({**keys, "targets": report.TARGETS, **figures}, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
