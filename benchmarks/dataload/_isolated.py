"""Workloads (b)-(d) with each system in its own process, at equal worker counts (issue 19).

For every round, tierkit's ShuffledLoader and torch's DataLoader each run in a fresh Python
process (``python -m benchmarks.dataload._child <spec>``) that times one cold-cache run per
worker count (0, 2, 4: processes for both; ``num_workers=0`` runs in the iterating thread for
both). The order of the two systems alternates between rounds. Data are prepared once in the
parent.

One-time costs: tierkit's workers fork from multiprocessing's forkserver, which imports torch
(and the module defining the workload's transform, ``WORK_MODULES``) once per process, and the
first engine of the I/O runtime takes its io_uring set-up; the child
does both *before* the timed runs and reports their times (``forkserver_s``, ``runtime_s``), as
a training process pays them once. Worker start
itself (the forks) is inside the timed region for both systems. CPU per sample counts the
workers: DataLoader's are children of the child process, tierkit's are the forkserver's, whose
reaped-children CPU (from /proc) is added.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks.dataload import _fmnist, _map_dataset, _tar_shards, _text
from benchmarks.dataload._measure import Run, time_run
from benchmarks.dataload._peers import RecordDataset, torch_loader

WORKERS = (0, 2, 4)
# (max samples, max seconds) per timed run; full mode reads whole epochs (None: all)
BUDGETS = {
    "fmnist": {"full": (None, 30.0), "quick": (30_000, 5.0), "smoke": (1_000, 0.5)},
    "parquet_text": {"full": (None, 20.0), "quick": (8_000, 5.0), "smoke": (500, 0.5)},
    "map_dataset": {"full": (None, 30.0), "quick": (10_000, 5.0), "smoke": (500, 0.5)},
    "tar_shards": {"full": (None, 30.0), "quick": (20_000, 5.0), "smoke": (500, 0.5)},
}
PEER_PREFIX = {"tar_shards": "wds_nw"}  # the peer's run names (default: DataLoader's)
PNG_COUNT = {"full": 70_000, "quick": 10_000, "smoke": 1_000}
# where each workload's per-sample work is defined: the forkserver imports them once, as it
# would a user's training script (a script run as a file is preloaded there with its imports;
# this child runs with ``-m``, which multiprocessing does not preload)
WORK_MODULES = {
    "fmnist": ["benchmarks.dataload._fmnist"],
    "parquet_text": ["benchmarks.dataload._text"],
    "map_dataset": ["benchmarks.dataload._map_dataset", "dataload.image_folder"],
    "tar_shards": ["benchmarks.dataload._tar_shards", "dataload.shards.tar_shards"],
}


def prepare(workload: str, out: Path, mode: str, notes: list[str]) -> dict[str, Any] | None:
    """Build the workload's data in the parent; None (with a note) when it cannot."""
    install = mode != "smoke"
    if workload == "fmnist":
        if not _fmnist.ensure_fmnist(notes, install):
            return None
        path = out / "dataload_fmnist.rec"
        return {"path": str(path), "count": _fmnist.build_records(path)}
    if workload == "parquet_text":
        if not _text.DOCS.exists():
            notes.append(f"(c) skipped: {_text.DOCS} is absent")
            return None
        smoke = mode == "smoke"
        path = out / ("dataload_docs_smoke.parquet" if smoke else "dataload_docs.parquet")
        count = _text.build_parquet(path, _text.SMOKE_DOCS if smoke else None)
        return {"path": str(path), "count": count}
    if workload == _tar_shards.WORKLOAD:
        return _tar_shards.prepare(out, mode, notes)
    folder = _map_dataset.ensure_pngs(out, PNG_COUNT[mode], notes, install)
    return {"folder": str(folder), "count": PNG_COUNT[mode]}


def _starter(workload: str, system: str, workers: int, seed: int, data: dict[str, Any]) -> Any:
    from dataload import FixedSizeSource, ParquetSource, ShuffledLoader

    def ours(source: Any, batch: int, transform: Any = None) -> Any:
        loader = ShuffledLoader(source, batch, seed=seed, transform=transform, num_workers=workers)
        return iter(loader), loader.close

    if workload == "fmnist":
        path, count = Path(data["path"]), data["count"]
        if system == "tierkit":
            return lambda: ours(FixedSizeSource(path, _fmnist.RECORD_BYTES), 128, _fmnist.decode)
        dataset = RecordDataset(path, _fmnist.RECORD_BYTES, count, transform=_fmnist.decode)
        return lambda: torch_loader(dataset, 128, workers, seed)
    if workload == "parquet_text":
        path = Path(data["path"])
        if system == "tierkit":
            source = ParquetSource(path, columns=["text"])
            return lambda: ours(source, _text.BATCH, _text.sample_tokens)
        return lambda: torch_loader(_text.TableDataset(path), _text.BATCH, workers, seed)
    if workload == _tar_shards.WORKLOAD:
        return _tar_shards.starter(system, workers, seed, data)
    folder, batch_size = Path(data["folder"]), _map_dataset.BATCH
    if system == "tierkit":
        return lambda: ours(_map_dataset.make_dataset(folder), batch_size)
    return lambda: torch_loader(_map_dataset.make_dataset(folder), batch_size, workers, seed)


def _files(workload: str, data: dict[str, Any]) -> list[Path]:
    if workload == "map_dataset":
        return _map_dataset.png_files(Path(data["folder"]))
    if workload == _tar_shards.WORKLOAD:
        return _tar_shards.files(data)
    return [Path(data["path"])]


def _counters(workload: str) -> tuple[Any, Any]:
    """(samples in a batch, bytes of a batch) for the workload's collated batches."""
    if workload == "parquet_text":
        return (lambda b: int(b.shape[0])), (lambda b: int(b.shape[0]) * _text.TOKENS * 8)
    if workload == "fmnist":
        return (lambda b: int(b[0].shape[0])), (lambda b: int(b[0].shape[0]) * 785)
    return (lambda b: int(b[0].shape[0])), (lambda b: int(b[0].numel()) * 4)


def _forkserver_cpu_s() -> float:
    """CPU of the forkserver and of the workers it reaped (tierkit's workers are its)."""
    from multiprocessing import forkserver

    pid = getattr(forkserver._forkserver, "_forkserver_pid", None)
    if not pid:
        return 0.0
    with open(f"/proc/{pid}/stat") as file:
        fields = file.read().rsplit(")", 1)[1].split()
    return sum(int(fields[i]) for i in (11, 12, 13, 14)) / os.sysconf("SC_CLK_TCK")


def child(spec: dict[str, Any]) -> None:
    """Time one system at each worker count; print one JSON line."""
    workload, system, data = spec["workload"], spec["system"], spec["data"]
    forkserver_s = runtime_s = 0.0
    if system == "tierkit":
        runtime_s = _warm_runtime(str(_files(workload, data)[0]))
        if any(spec["workers"]):
            from dataload.workers import warm_forkserver

            forkserver_s = warm_forkserver(preload=WORK_MODULES[workload])
    max_samples, max_time_s = BUDGETS[workload][spec["mode"]]
    per_batch, per_bytes = _counters(workload)
    runs = []
    for workers in spec["workers"]:
        peer = PEER_PREFIX.get(workload, "torch_nw")
        name = f"tierkit_w{workers}" if system == "tierkit" else f"{peer}{workers}"
        start = _starter(workload, system, workers, spec["seed"], data)
        extra0 = _forkserver_cpu_s()
        run = time_run(
            workload,
            name,
            spec["round"],
            _files(workload, data),
            start,
            per_batch,
            per_bytes,
            max_samples or data["count"],
            max_time_s,
        )
        run = dataclasses.replace(run, cpu_s=run.cpu_s + _forkserver_cpu_s() - extra0)
        runs.append(dataclasses.asdict(run))
    result = {"runs": runs, "forkserver_s": forkserver_s, "runtime_s": runtime_s}
    print(json.dumps(result), flush=True)


def _warm_runtime(path: str) -> float:
    """Start the I/O runtime's loop, make its engine and open a file once (first use in a
    process costs 0.3-1.7 s on the dev VM: the io_uring set-up, and ~0.3 s for the engine's
    first ``open``); seconds taken."""
    import time

    from tiers.io import default_runtime

    started = time.perf_counter()
    runtime = default_runtime()

    async def lease() -> None:
        engine = runtime.acquire_engine()
        try:
            await engine.close_file(await engine.open(path))
        finally:
            await runtime.release_engine(engine)

    runtime.submit(lease()).result()
    return time.perf_counter() - started


def run_workload(
    workload: str, out: Path, mode: str, rounds: int, notes: list[str], workers=WORKERS
) -> list[Run]:
    """Rounds of (tierkit process, DataLoader process), order alternating; their Runs."""
    data = prepare(workload, out, mode, notes)
    if data is None:
        print(notes[-1], flush=True)
        return []
    print(f"({workload}) {data}, workers {workers}, each system in its own process", flush=True)
    runs: list[Run] = []
    for round_index in range(rounds):
        order = ("tierkit", "torch") if round_index % 2 == 0 else ("torch", "tierkit")
        for system in order:
            spec = {
                "workload": workload,
                "system": system,
                "data": data,
                "mode": mode,
                "round": round_index,
                "seed": 400 + round_index,
                "workers": list(workers),
            }
            done = subprocess.run(
                [sys.executable, "-m", "benchmarks.dataload._child", json.dumps(spec)],
                capture_output=True,
                text=True,
                check=False,
            )
            if done.returncode:
                raise RuntimeError(f"{workload} {system} failed:\n{done.stderr[-3000:]}")
            result = json.loads(done.stdout.strip().splitlines()[-1])
            if system == "tierkit":
                print(
                    f"  once per process, before timing: I/O runtime {result['runtime_s']:.2f} s,"
                    f" forkserver {result['forkserver_s']:.2f} s"
                )
            for fields in result["runs"]:
                run = Run(**fields)
                runs.append(run)
                print(
                    f"  round {round_index} {workload} {run.loader:12s} "
                    f"{run.samples_per_s:9,.0f} samples/s cpu {run.cpu_us_per_sample:6.1f} "
                    f"us/sample first {run.first_batch_s * 1e3:6.1f} ms",
                    flush=True,
                )
    return runs
