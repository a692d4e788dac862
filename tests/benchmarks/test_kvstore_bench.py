"""The KV-cache benchmark (issue 17): Belady against exhaustive search, the LRU model against
the store's "lru" policy, and ``python -m benchmarks.kvstore.cache --smoke`` end to end.

The smoke run is a subprocess, as a user runs it, on the synthetic trace (no ../shared needed),
with 64 KiB blocks for the throughput part and KIVI skipped (tests/kvstore covers it); only
the shape of the last line and invariants that hold at any size are checked (no policy beats
Belady; no tier goes over its cap; a reopened store holds what it held). About 15 s.
"""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.common.paths import REPO_ROOT
from benchmarks.kvstore.belady import belady
from benchmarks.kvstore.crosscheck_belady import (
    optimum_block_hits,
    random_flat_trace,
    random_forest_trace,
)
from benchmarks.kvstore.lru_model import (
    lru_oracle_admission_hits,
    lru_prefix_hits,
    lru_store_model_hits,
)
from benchmarks.kvstore.replay import ReplayCounts, open_replay_store, replay_requests
from benchmarks.kvstore.trace import check_prefix_forest, synthetic_trace

_TIMEOUT_S = 120  # a smoke run takes ~10 s here; this only stops a hung one
KEYS = frozenset(
    {"hit_rate_vs_belady_10pct", "hit_rate_vs_lru_10pct", "load_gbps_vs_tier"}
    | {"reopen_s_per_million_blocks", "capacity_overrun_bytes", "kivi4_bytes_ratio"}
    | {"kivi4_max_abs_logit_err", "capacity_overrun_bytes_tier_accounting"}
    | {"capacity_overrun_bytes_extent_files"}
    | {f"hit_rate_{p}_{c}pct" for p in ("lru", "cost", "prefix", "belady") for c in (5, 10, 25)}
    | {"hit_rates", "throughput", "reopen", "restart", "machine", "mode", "trace", "targets"}
)


def test_belady_equals_exhaustive_optimum_on_tiny_traces() -> None:
    rng = random.Random(5)
    checked = 0
    for index in range(120):
        if index % 2:
            trace = random_forest_trace(rng, rng.randint(2, 5), roots=2)
        else:
            trace = random_flat_trace(rng, rng.randint(3, 9), blocks=rng.randint(2, 5))
        if sum(map(len, trace)) > 11:
            continue
        for capacity in range(4):
            assert belady(trace, capacity).block_hits == optimum_block_hits(trace, capacity), (
                trace,
                capacity,
            )
            checked += 1
    assert checked > 200


def test_belady_keeps_what_lru_cycles_out() -> None:
    cycle = [[1], [2], [3], [1], [2], [3]]  # capacity 2: LRU always evicts the next one
    assert belady(cycle, 2).block_hits == 2
    assert lru_prefix_hits(cycle, 2) == 0
    forest = [[0, 1, 2], [0, 1, 3], [0, 4]]
    result = belady(forest, 3)
    assert (result.block_hits, result.prefix_hits, result.accesses) == (3, 3, 8)


def test_oracle_admission_lru_between_lru_and_belady() -> None:
    # one-use blocks 9 and 8 between the reuses: LRU admits them and loses block 1 (capacity 1)
    trace = [[1], [9], [1], [8], [1]]
    assert lru_prefix_hits(trace, 1) == 0
    assert lru_oracle_admission_hits(trace, 1) == 2
    rng = random.Random(11)
    for _ in range(200):
        trace = random_forest_trace(rng, rng.randint(2, 12), roots=3)
        for capacity in range(5):
            oracle = lru_oracle_admission_hits(trace, capacity)
            assert oracle <= belady(trace, capacity).block_hits, (trace, capacity)


def test_prefix_forest_check() -> None:
    assert check_prefix_forest(synthetic_trace(requests=500, conversations=30).requests) == 0
    assert check_prefix_forest([[0, 1], [2, 1]]) == 1  # block 1 under two parents


@pytest.mark.parametrize("capacity_blocks", [7, 40, 150])
def test_store_lru_matches_lru_models(tmp_path: Path, capacity_blocks: int) -> None:
    requests = synthetic_trace(requests=300, conversations=25, seed=3).requests

    async def replay() -> ReplayCounts:
        store = await open_replay_store(tmp_path / "store", capacity_blocks, "lru", "dram")
        try:
            return await replay_requests(store, requests, ReplayCounts())
        finally:
            await store.aclose()

    counts = asyncio.run(replay())
    assert counts.accesses == sum(map(len, requests))
    assert counts.hits == lru_store_model_hits(requests, capacity_blocks)
    plain = lru_prefix_hits(requests, capacity_blocks)  # differs only where chains crowd
    assert abs(counts.hits - plain) <= 0.02 * counts.accesses or capacity_blocks < 64
    assert counts.max_resident_blocks <= capacity_blocks
    assert counts.tier_overrun_bytes <= 0


@pytest.mark.slow
def test_cache_bench_smoke(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.kvstore.cache", "--smoke", "--skip", "kivi",
         "--out", str(tmp_path)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=_TIMEOUT_S, check=False,
    )  # fmt: skip
    assert done.returncode == 0, f"kvstore benchmark failed:\n{done.stderr[-4000:]}"
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    missing = KEYS - figures.keys()
    assert not missing, f"the last line lacks {sorted(missing)}"
    assert figures["mode"] == "smoke"
    assert figures["trace"]["name"] == "synthetic-zipf-prefix"
    assert figures["trace"]["prefix_conflicts"] == 0
    assert figures["capacity_overrun_bytes_tier_accounting"] == 0
    assert figures["capacity_overrun_bytes_extent_files"] == 0  # the catalog is beside them
    assert figures["kivi4_bytes_ratio"] is None  # skipped
    for cell in figures["hit_rates"]:
        for policy, result in cell["policies"].items():
            assert 0 <= result["hit_rate"] <= cell["belady_block_hit_rate"], (policy, cell)
            assert result["max_resident_blocks"] <= cell["capacity_blocks"]
        assert cell["belady_prefix_hit_rate"] == cell["belady_block_hit_rate"]
    restart = figures["restart"]
    assert restart["blocks_after_restart"] == restart["blocks_before_restart"] > 0
    assert figures["load_gbps_vs_tier"] > 0
    assert figures["reopen"][0]["blocks"] == 2000
