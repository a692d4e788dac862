"""Every benchmark runs as ``python -m benchmarks...`` and ends with its JSON line of figures.

Each runs in a subprocess, as a user runs it (so the ``-m`` entry points, the package imports and
the helper processes are what is tested), with tiny sizes: ``--smoke`` where the benchmark has it
(one round, files of a few MiB, fractions of a second per timed run, generated vectors instead of
../shared), small explicit options for io_engine. Only the shape of the result is checked: the
last stdout line parses as JSON and holds the keys RESULTS.md and the README quote. Speed is not
checked; a smoke run's figures mean nothing. All files go under pytest's tmp_path (64 MiB at
most). The whole file takes about 45 s on a 2 vCPU machine.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from benchmarks.common.paths import REPO_ROOT, SHARED_DATA

pytestmark = pytest.mark.slow
_TIMEOUT_S = 100  # a smoke run takes 5-12 s here; this only stops a hung one


@dataclass(frozen=True)
class Smoke:
    module: str
    args: tuple[str, ...]  # "{out}" stands for the run's tmp_path
    keys: frozenset[str]  # what the last line must hold
    needs_fio: bool = False  # fio (io_uring engine) is the reference: without it, skip


_IO_ENGINE_TINY = ("--rounds", "1", "--duration-s", "0.1", "--warmup-s", "0.02", "--size-gib")
IO_ENGINE = Smoke(
    "benchmarks.tiers.io_engine",
    # the quick configs, one round of 0.1 s runs over a 64 MiB file
    ("--quick", *_IO_ENGINE_TINY, "0.0625", "--dir", "{out}"),
    frozenset(
        {"uring_vs_fio_4k_qd32", "thread_vs_fio_4k_qd32", "uring_vs_fio_128k_qd32"}
        | {"uring_vs_aiofiles_4k_qd32", "uring_cpu_us_per_io_4k", "fio_cpu_us_per_io_4k"}
        | {"uring_iops_4k_qd32", "targets", "load1_median", "machine", "mode", "code", "drive"}
        | {"uring_tasks_vs_fio_4k_qd32", "thread_tasks_vs_fio_4k_qd32"}
    ),
    needs_fio=True,
)
TIERS_STORE = Smoke(
    "benchmarks.tiers.store",
    ("--smoke", "--dir", "{out}"),
    frozenset(
        {f"dram_get_vs_memcpy_{size}" for size in ("4kib", "64kib", "1mib", "16mib")}
        | {f"nvme_get_vs_fio_{size}" for size in ("4kib", "64kib", "1mib", "16mib")}
        | {"nvme_put_vs_fio_write_1mib", "hbm_get_vs_memcpy_1mib", "cxl_get_vs_memcpy_1mib"}
        | {"dram_hit_overhead_us", "dram_tier_hit_overhead_us", "bare_copy_4k_us"}
        | {"nvme_get_many_vs_fio_4k", "nvme_get_many_vs_fio_64k", "zipf_gets_vs_naive_lru"}
        | {"nvme_put_many_objects_per_s_4k", "fio_fsync_writes_per_s_4k", "spreads"}
        | {"nvme_concurrent_puts_per_s_4k", "nvme_put_many_vs_fio_fsync_4k"}
        | {f"store_hit_overhead_us_{policy}" for policy in ("lru", "lfu", "cost")}
        | {"zipf_hit_rate_best", "zipf_hit_rate_lru", "zipf_best_policy"}
        | {"zipf_throughput_vs_nvme_only_cost", "zipf_hit_rate_static_oracle", "targets"}
        | {"cxl_emulated", "nvme_qd", "nvme_engine", "phases", "machine", "mode", "code"}
    ),
    needs_fio=True,
)
DATALOAD = Smoke(
    "benchmarks.dataload.loader",
    ("--smoke", "--out", "{out}"),
    frozenset(
        {"vs_torch_dataloader_records", "vs_torch_dataloader_records_by_workers"}
        | {"vs_fio_records", "cpu_us_per_sample", "torch_cpu_us_per_sample"}
        | {"tierkit_samples_per_s_records", "notes"}
    ),
    needs_fio=True,
)
VECTORDB_SPANN = Smoke(
    "benchmarks.vectordb.spann",
    ("--smoke", "--out", "{out}"),
    frozenset(
        {"dataset", "default_max_postings", "recall_at_10", "qps", "qps_vs_faiss_ondisk"}
        | {"qps_vs_diskann", "fp16_qps_vs_faiss_ondisk", "resident_fraction"}
        | {"pages_per_query", "pages_per_query_batched", "qps_at_recall_0_9"}
        | {"insert_vectors_per_s", "recall_after_updates", "min_recall_during_updates"}
        | {"notes", "elapsed_s"}
        # the memory-budget part (issue 14): every system in its own process
        | {"single_qps_vs_faiss_ondisk", "single_p50_ms", "conc8_qps_vs_faiss_ondisk"}
        | {"batch_qps_vs_faiss_ondisk", "ample_single_qps_vs_faiss_ondisk"}
        | {"ample_batch_qps_vs_faiss_ivf_ram", "recall_at_10_single", "rss_mib", "faiss_plain"}
        | {"budget_mib", "budget_capped", "qps_at_recall_budget", "cgroup_peak_mib"}
    ),
)
VECTORDB_PLACEMENT = Smoke(
    "benchmarks.vectordb.placement", ("--smoke", "--out", "{out}"), frozenset({"qps_at_recall_0_9"})
)
VECTORDB_SCRUB = Smoke(
    "benchmarks.vectordb.scrub",
    ("--smoke", "--out", "{out}"),
    frozenset(
        {"verify_mb_per_s", "fio_seq_read_mb_per_s", "verify_vs_fio", "repair_s"}
        | {"clean_batch_qps", "clean_single_qps", "degraded_batch_qps", "degraded_single_qps"}
        | {"degraded_vs_clean_batch", "degraded_vs_clean_single"}
    ),
    needs_fio=True,
)


def run_smoke(smoke: Smoke, out: Path) -> dict[str, Any]:
    """Run ``smoke`` as ``python -m`` from the repository root; its last line, parsed."""
    if smoke.needs_fio and shutil.which("fio") is None:
        pytest.skip("fio is not installed (apt-get install fio): it is this benchmark's reference")
    args = [arg.replace("{out}", str(out)) for arg in smoke.args]
    done = subprocess.run(
        [sys.executable, "-m", smoke.module, *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, f"{smoke.module} failed:\n{done.stderr[-4000:]}"
    lines = done.stdout.strip().splitlines()
    assert lines, f"{smoke.module} printed nothing:\n{done.stderr[-2000:]}"
    figures = json.loads(lines[-1])
    assert isinstance(figures, dict)
    missing = smoke.keys - figures.keys()
    assert not missing, f"{smoke.module}: the last line lacks {sorted(missing)}"
    return figures


@pytest.mark.uring
def test_io_engine(tmp_path: Path) -> None:
    figures = run_smoke(IO_ENGINE, tmp_path)
    assert figures["mode"] == "quick" and figures["drive"] == "stream"
    assert set(figures["targets"].values()) <= {"PASS", "MISS"}
    assert not list(tmp_path.iterdir()), "the data file is scratch: removed at exit"


@pytest.mark.uring
def test_tiers_store(tmp_path: Path) -> None:
    figures = run_smoke(TIERS_STORE, tmp_path)
    assert figures["mode"] == "smoke" and figures["nvme_qd"] == 16
    assert figures["zipf_best_policy"] in ("lru", "lfu", "cost")
    assert set(figures["targets"].values()) <= {"PASS", "MISS"}


@pytest.mark.uring
def test_dataload_loader(tmp_path: Path) -> None:
    figures = run_smoke(DATALOAD, tmp_path)
    assert set(figures["vs_torch_dataloader_records_by_workers"]) == {"torch_nw0", "torch_nw2"}
    notes = " ".join(figures["notes"])
    if (SHARED_DATA / "debian-minilm" / "docs.jsonl").exists():
        assert "vs_torch_dataloader_parquet_text" in figures  # part (c) ran
    else:
        assert "(c) skipped" in notes  # no ../shared checkout: said so, not failed
    if "vs_torch_dataloader_fmnist" not in figures:
        assert "(b) skipped" in notes


def test_vectordb_spann(tmp_path: Path) -> None:
    figures = run_smoke(VECTORDB_SPANN, tmp_path)
    assert figures["dataset"] == "smoke-4000"
    assert {"ours", "ours_fp16", "faiss_ondisk", "faiss_ivf", "faiss_hnsw"} <= set(
        figures["qps_at_recall_0_9"]
    )
    assert 0 < figures["resident_fraction"] < 1
    assert (tmp_path / "vectordb_spann_smoke-4000.png").exists()
    # the budget part ran every worker (smoke: uncapped) and the plain faiss script
    assert {"ours", "faiss_ondisk"} <= set(figures["rss_mib"]["tight"])
    assert {"ours", "faiss_ondisk", "faiss_ivf"} <= set(figures["rss_mib"]["ample"])
    assert figures["single_qps_vs_faiss_ondisk"] is not None, figures["notes"]
    assert 0 < figures["recall_at_10_single"] <= 1
    assert figures["faiss_plain"]["plain_batch_qps"] > 0


def test_vectordb_placement(tmp_path: Path) -> None:
    figures = run_smoke(VECTORDB_PLACEMENT, tmp_path)
    assert set(figures["qps_at_recall_0_9"]) == {"r4-c1.5", "r2-cinf"}


@pytest.mark.uring
def test_vectordb_scrub(tmp_path: Path) -> None:
    figures = run_smoke(VECTORDB_SCRUB, tmp_path)
    assert figures["benchmark"] == "vectordb_scrub"
    assert figures["repair_s"] > 0
    assert not (tmp_path / "scrub").exists(), "the indexes are scratch: removed at the end"
