"""The memory-budget part of the vectordb benchmark (issue 14): every system in its own process
under one memory cgroup limit, at two budgets.

raw = the base vectors' bytes. A worker loads its libraries and runs its system once on a tiny
throwaway index (code, not data: kernels compiled or loaded, runtime threads), hands freed memory
back to the OS, and only then joins its cgroup (_budget_worker.py): a cgroup is charged for what
its processes allocate or read after they join, so the limit is what the system may hold for
its data -- tight = 0.15 * raw, ample = 2 * raw -- whatever its interpreter and libraries take
(the probes report that baseline: the largest of one probe per system).
Every system at a budget gets the same limit. Per system and budget one worker process sweeps
the system's knob through the modes (one batch, one query per call, 8 and 64 concurrent
callers), each pass cold (index reopened, page cache dropped; opening untimed). The parent makes
the cgroups, reads each one's peak and limit hits, removes it, and hands the workers' figures to
_budget_report.py. faiss_plain.py, a script with only read_index + search, runs at the ample
limit too, as a check on the harness's faiss figure.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common.paths import REPO_ROOT
from benchmarks.vectordb import _cgroup
from benchmarks.vectordb._budget_report import (
    BudgetRun,
    headline,
    passes_table,
    summary_table,
    verdicts,
)
from benchmarks.vectordb._common import log, stdout_to_stderr
from benchmarks.vectordb._data import Dataset
from benchmarks.vectordb._ours import code_hash

# tight and ample are issue 14's; short (0.3 x raw) sits between, where memory is short but
# both disk systems can hold their working set (at tight neither opened here)
TIGHT_SHARE, SHORT_SHARE, AMPLE_SHARE = 0.15, 0.3, 2.0
TIGHT_SYSTEMS = ["ours", "faiss_ondisk"]
SYSTEMS = {
    "tight": TIGHT_SYSTEMS,
    "short": TIGHT_SYSTEMS,
    "ample": [*TIGHT_SYSTEMS, "faiss_ivf", "faiss_hnsw"],
}
BUDGETS = tuple(SYSTEMS)
PLAIN_BUDGET = "ample"  # where faiss_plain.py checks the harness's faiss OnDisk figures
_WORKER = "benchmarks.vectordb._budget_worker"


@dataclass(frozen=True)
class BudgetPlan:
    sweeps: dict[str, list[int]]
    single_queries: int  # one query per call (and per caller in the concurrent modes)
    conc_queries: int
    plain_nprobe: int  # faiss_plain.py's setting, one of the faiss_ondisk sweep's
    pass_s: float  # a one-query pass stops taking queries after this; a mode after such a pass
    worker_timeout_s: float  # a worker still running then is killed (a thrashing system)
    # the keyed one-query modes first: their passes stop at a deadline, so a thrashing
    # system still reports them before the worker's time is up; then the batch, given what
    # is left (a batch given up bounds the peer's QPS: _budget_worker); conc64 (no key) last:
    # at 13.7 MiB faiss OnDisk spent the rest of its 90 s in 64 callers' queries
    modes: str = "single,conc8,batch,conc64"
    smoke: bool = False  # no cgroups, workers at once, own libraries only: fast, figures moot
    # ours opens once per worker, a cold start empties its cache and drops its files' pages
    # (at 2M an opening rebuilds the navigator). On debian-minilm at 13.7 MiB, kept open it
    # completed 14 of 16 passes before its batch at 12 lists was killed (git bb40f55);
    # reopened before each pass it was killed at its first reopening (ecbf77e, 00c9fb3):
    # the group's anonymous memory grows ~0.3 MiB a reopening (RESULTS.md, issue 14)
    keep_open: bool = True


_FAISS = [4, 8, 16, 32]  # recall 0.85-0.97 on debian-minilm (IVF1024)
_QUICK_SWEEPS = {"ours": [4, 8, 12], "faiss_ondisk": _FAISS, "faiss_ivf": _FAISS}
# 90 s a worker: a peer thrashing at the tight limit spends ~40 s on its one-query passes,
# and what is left bounds its batch (it finished no batch of 500 in 60 s: _budget_report)
QUICK = BudgetPlan({**_QUICK_SWEEPS, "faiss_hnsw": [10, 16, 32]}, 200, 300, 16, 4.0, 90.0)
_WIDE = [2, *_FAISS, 64]
_FULL_SWEEPS = {"ours": [3, 4, 5, 6, 8, 12, 16, 24], "faiss_ondisk": _WIDE, "faiss_ivf": _WIDE}
FULL = BudgetPlan({**_FULL_SWEEPS, "faiss_hnsw": [10, 16, 32, 64, 128]}, 500, 500, 16, 30, 600)
# smoke: only the systems the JSON keys need (HNSW left out), a process each, all at once
_SMOKE_SWEEPS = {"ours": [2, 4], "faiss_ondisk": [2, 32], "faiss_ivf": [2, 32]}
SMOKE = BudgetPlan(_SMOKE_SWEEPS, 20, 20, 32, 5.0, 60.0, smoke=True, keep_open=False)
# the 2M sets (gmm-2000000): recall 0.9 takes ours ~115-190 lists and faiss nprobe 8-16 (IVF4096)
# on the diagonal mixture; ours' opening rebuilds its 165k-head HNSW navigator (~1-2 min) and
# measures its default (~180 lists there, a batch of 1,000 at it ~35 s), so a worker gets the
# time to; faiss HNSW is left out (its 2M build alone is ~5 min here)
BIG_ROWS = 1_000_000
_BIG_SWEEPS = {"ours": [64, 128, 192], "faiss_ondisk": [8, 16, 32], "faiss_ivf": [8, 16, 32]}
BIG = BudgetPlan(_BIG_SWEEPS, 200, 300, 16, 4.0, 360.0)


def _env() -> dict[str, str]:
    """The repository root first on PYTHONPATH: the workers run as modules of this package."""
    paths = [str(REPO_ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


@dataclass(frozen=True)
class Job:
    name: str
    cmd: list[str]
    limit_bytes: int | None  # None: an unlimited group (a probe)
    worker: bool = True  # a worker is told its group (it reads its own charge there)


def _start(job: Job, capped: bool) -> tuple[subprocess.Popen[str], _cgroup.Cgroup | None]:
    """Start the job's command in a new cgroup (or uncapped, when ``capped`` is false)."""
    group, cmd = None, job.cmd
    if capped:
        group, why = _cgroup.create(f"tierkit-bench-{job.name}")
        if group is None:
            raise RuntimeError(why)
        if job.limit_bytes is not None:
            group.set_limit(job.limit_bytes)
        # a worker joins its group itself once its libraries are loaded and warmed up (what it
        # held before is charged to us, not to its limit); a plain script starts inside it
        joins = job.worker and job.limit_bytes is not None  # probes: charged from the start
        cmd = [*cmd, "--cgroup", str(group.path), "--join"] if joins else group.wrap(cmd)
    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=_env(), stdout=subprocess.PIPE, text=True)
    return proc, group


def _killed_in(started: dict[str, Any], ended_at: float, why: str) -> dict[str, Any]:
    """The pass a worker was killed in (by the limit's OOM killer or the timeout) after
    saying it started it: it answered none of its queries from ``started["at"]`` (the
    worker's clock, seconds since the epoch) to its death, seen here at ``ended_at`` (a few
    ms late at most: the bound it gives is, if anything, a little low)."""
    wall_s = max(ended_at - started["at"], 1e-3)
    return {
        "mode": started["mode"],
        "value": started["value"],
        "queries": 0,
        "offered": started["offered"],
        "unfinished": True,
        "killed": why,
        "recall": 0.0,
        "qps": 0.0,
        "qps_below": round(started["offered"] / wall_s, 2),
        "wall_s": round(wall_s, 3),
        "p50_ms": round(wall_s * 1000, 3),
        "p99_ms": round(wall_s * 1000, 3),
        "rss_bytes": 0,
        "anon_bytes": None,
    }


def _finish(
    proc: subprocess.Popen[str], group: _cgroup.Cgroup | None, timeout_s: float
) -> dict[str, Any]:
    """Wait for the process; its JSON line plus its cgroup's peak and events."""
    try:
        stdout, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        stdout, _ = proc.communicate()
        failed = f"killed after {timeout_s:.0f} s"
    else:  # -9 with oom_kills > 0: the OOM killer, the group at its limit
        failed = "" if proc.returncode == 0 else f"exit status {proc.returncode}"
    ended_at = time.time()
    replies = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    out: dict[str, Any] = {"passes": [r["pass"] for r in replies if "pass" in r]}
    if failed and replies and "started" in replies[-1]:  # killed in the pass it started
        out["passes"].append(_killed_in(replies[-1]["started"], ended_at, failed))
    for reply in replies:
        out.update(reply.get("setting", {}))  # the default setting, said before the passes
    if replies and "pass" not in replies[-1] and "setting" not in replies[-1]:
        out = replies[-1]  # the worker's last word: everything, its passes included
    if failed or not replies:
        out["failed"] = failed or "no output"
    return {**out, **_group_figures(group)}


def _group_figures(group: _cgroup.Cgroup | None) -> dict[str, Any]:
    """The group's peak and events; removes it."""
    out: dict[str, Any] = {}
    if group is not None:
        out["cgroup_peak_bytes"] = group.peak_bytes()
        out.update(group.events())
        group.remove()
    return out


def _run_all(
    jobs: list[Job], capped: bool, at_once: bool, timeout_s: float
) -> list[dict[str, Any]]:
    """Run the jobs one after another (measurements), or all at once (probes, smoke)."""
    if at_once:
        started = [_start(job, capped) for job in jobs]
        return [_finish(*run, timeout_s) for run in started]
    return [_finish(*_start(job, capped), timeout_s) for job in jobs]


def _paths(system: str, built: dict[str, Any]) -> list[str]:
    if system == "ours":
        return ["--index", str(built["ours"])]
    if system == "faiss_ondisk":
        ondisk = built["faiss_ondisk"]
        return ["--index", str(ondisk.path), "--data", str(ondisk.data_path)]
    return ["--index", str(built[system])]


def _worker_cmd(
    system: str, built: dict[str, Any], plan: BudgetPlan, files: dict[str, Path]
) -> list[str]:
    cmd = [sys.executable, "-m", _WORKER, "--system", system, *_paths(system, built)]
    cmd += ["--queries", str(files["queries"]), "--gt", str(files["gt"])]
    cmd += ["--keep-open"] if plan.keep_open and system == "ours" else []
    cmd += ["--worker-s", str(plan.worker_timeout_s)]
    return cmd + (["--light"] if plan.smoke else [])


def _systems(plan: BudgetPlan) -> dict[str, list[str]]:
    """The systems per budget: those the plan sweeps (the 2M plan has no faiss HNSW)."""
    return {b: [s for s in names if s in plan.sweeps] for b, names in SYSTEMS.items()}


def run_budgets(ds: Dataset, built: dict[str, Any], plan: BudgetPlan, work_dir: Path) -> BudgetRun:
    """Probe the baseline, then run every system at every budget; faiss_plain at ample."""
    work_dir.mkdir(parents=True, exist_ok=True)
    files = {"queries": work_dir / f"{ds.name}_queries.npy", "gt": work_dir / f"{ds.name}_gt.npy"}
    np.save(files["queries"], np.ascontiguousarray(ds.queries, np.float32))
    np.save(files["gt"], np.ascontiguousarray(ds.gt[:, :10], np.int64))
    capped, notes = not plan.smoke, []
    if capped:
        probe, why = _cgroup.create("tierkit-bench-probe")
        if probe is None:
            capped = False
            notes.append(f"budget part ran UNCAPPED: {why}")
        else:
            probe.remove()
    elif plan.smoke:
        notes.append("budget part: smoke mode runs uncapped (no cgroups)")
    per_budget = _systems(plan)
    systems = sorted({s for names in per_budget.values() for s in names})
    if plan.smoke:  # no probes: a stand-in baseline (the limits are not applied anyway)
        probes = [{"system": "parent", "baseline_bytes": _rss_bytes()}]
    else:  # probes import, warm up and exit: one after another, each in its own group
        jobs = [Job(f"probe-{s}", [*_worker_cmd(s, built, plan, files), "--probe"], None)
                for s in systems]  # fmt: skip
        probes = _run_all(jobs, capped, False, plan.worker_timeout_s)
    # a probe's peak, not its charge at the end: the warm-up's passing needs (compiling,
    # building) come back when the real index opens, and must not meet the limit
    baseline = max(max(int(p.get("baseline_bytes", 0)), p.get("cgroup_peak_bytes") or 0)
                   for p in probes)  # fmt: skip
    raw = ds.raw_bytes
    shares = {"tight": TIGHT_SHARE, "short": SHORT_SHARE, "ample": AMPLE_SHARE}
    limits = {budget: int(share * raw) for budget, share in shares.items()}
    shown = ", ".join(f"{b} {v / 2**20:.1f} MiB" for b, v in limits.items())
    log(f"budget: baseline {baseline / 2**20:.1f} MiB; limits {shown}")
    result = BudgetRun(raw, baseline, limits, capped, notes=notes)
    result.results["probe"] = {p.get("system", "?"): p for p in probes}
    jobs = []
    for budget, names in per_budget.items():
        for system in names:
            mine = built
            if plan.smoke and system == "ours" and budget != "tight":
                # at once, each ours worker needs its own copy: an open index locks its directory
                mine = {"ours": work_dir / f"ours-{budget}"}
                shutil.rmtree(mine["ours"], ignore_errors=True)
                shutil.copytree(built["ours"], mine["ours"])
            cmd = _worker_cmd(system, mine, plan, files)
            cmd += ["--knobs", ",".join(map(str, plan.sweeps[system])), "--modes", plan.modes]
            cmd += ["--single-queries", str(plan.single_queries)]
            cmd += ["--conc-queries", str(plan.conc_queries)]
            cmd += ["--budget-bytes", str(limits[budget]), "--pass-s", str(plan.pass_s)]
            jobs.append(Job(f"{budget}-{system}", cmd, limits[budget]))
    plain = built["faiss_ondisk"]
    cmd = [sys.executable, "-m", "benchmarks.vectordb.faiss_plain", "--index", str(plain.path)]
    cmd += ["--queries", str(files["queries"]), "--gt", str(files["gt"])]
    cmd += ["--nprobe", str(plan.plain_nprobe), "--single-queries", str(plan.single_queries)]
    # at ample, where faiss OnDisk finishes: it joins its group after its imports, as workers do
    jobs.append(Job("plain", cmd, limits[PLAIN_BUDGET]))
    log(f"budget: {len(jobs)} processes, {'at once (smoke)' if plan.smoke else 'one by one'}")
    replies = dict(
        zip(
            (job.name for job in jobs),
            _run_all(jobs, capped, plan.smoke, plan.worker_timeout_s),
            strict=True,
        )
    )
    result.plain = replies.pop("plain")
    for name, reply in replies.items():
        budget, system = name.split("-", 1)
        result.results.setdefault(budget, {})[system] = reply
    return result


def _rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _builds(
    runner: asyncio.Runner, ds: Dataset, cache: Path, plan: BudgetPlan, reuse_build: bool
) -> dict[str, Any]:
    """Every system's index, built here (uncapped) when the cache lacks it."""
    from benchmarks.vectordb._faiss import MemorySystem, OnDiskIvf, nlist_for
    from benchmarks.vectordb._ours import cached_build

    ours = cached_build(runner, cache / "spann", ds.name, ds, reuse_any=reuse_build)[0]
    built: dict[str, Any] = {"ours": ours}
    with stdout_to_stderr():  # faiss prints "resizing ..." from C++
        built["faiss_ondisk"] = OnDiskIvf(ds, cache / "faiss")
        nlist = nlist_for(len(ds.base))
        names = {"ivf": f"{ds.name}-ivf{nlist}.index", "hnsw": f"{ds.name}-hnsw32.index"}
        for kind, name in names.items():
            if f"faiss_{kind}" not in plan.sweeps:
                continue
            if not (cache / "faiss" / name).exists():
                MemorySystem(kind, ds, cache / "faiss").close()
            built[f"faiss_{kind}"] = cache / "faiss" / name
    return built


def budget_part(
    runner: asyncio.Runner,
    ds: Dataset,
    cache: Path,
    plan: BudgetPlan,
    notes: list[str],
    reuse_build: bool = False,
) -> dict[str, Any]:
    """Run the budget part on ``ds``, print its tables; the JSON keys it adds.
    ``reuse_build``: ours may use a finished build of the same data by other vectordb code."""
    built = _builds(runner, ds, cache, plan, reuse_build)
    if built["ours"].name.rsplit("-", 1)[-1] != code_hash():
        notes.append(f"budget: ours searched {built['ours'].name}, built by other vectordb code")
    if "faiss_hnsw" not in plan.sweeps:
        notes.append(f"budget {ds.name}: faiss HNSW in RAM left out (its 2M build: ~5 min)")
    notes.append(f"budget {ds.name}: DiskANN not run (no cached build, no budget worker)")
    run = run_budgets(ds, built, plan, cache / "budget")
    for budget in BUDGETS:
        print(passes_table(run, budget) + "\n")
        print(summary_table(run, budget) + "\n")
    keys = headline(run)
    print(
        f"#### {ds.name}: memory-budget targets (tight: {run.limits['tight'] / 2**20:.1f} MiB, "
        f"ample: {run.limits['ample'] / 2**20:.1f} MiB, capped: {run.capped})\n"
    )
    print("\n".join(verdicts(keys)) + "\n")
    plain = keys["faiss_plain"]
    if plain:
        print(f"faiss_plain.py cross-check ({PLAIN_BUDGET}): {plain}\n")
    if keys["budget_supported"] is False:
        run.notes.append("ours: memory_budget_bytes not supported by this commit (uncapped index)")
    for budget in BUDGETS:
        for system, reply in run.results.get(budget, {}).items():
            if "failed" in reply:
                oom = reply.get("oom_kills", "n/a")
                run.notes.append(f"budget {budget}, {system}: {reply['failed']} (OOM kills {oom})")
    notes.extend(run.notes)
    return keys
