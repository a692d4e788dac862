r"""One system of the memory-budget benchmark, in a process of its own (started by _budget.py).

    python -m benchmarks.vectordb._budget_worker --system ours --index DIR --queries Q.npy \
        --gt GT.npy --knobs 4,8,12 --modes single,conc8,conc64,batch --budget-bytes B \
        [--cgroup PATH [--join]] [--probe]

It imports the same libraries whatever its system (numpy, faiss, vectordb, and torch where
installed: our head scan loads it) and runs its system once on a tiny throwaway index
(``warm_up``: compiled kernels, runtime threads, rings: what a process needs before it holds any
data). A measuring worker (``--join``) then hands its freed memory back and joins its cgroup,
so the limit counts only what it takes from then on; a probe is started inside an unlimited
group (``_cgroup.Cgroup.wrap``) and reports what all that cost (the baseline). Then it opens the
index (ours with ``memory_budget_bytes`` = the limit less what is charged at that point) and,
for every knob value and mode, starts cold (``cold()``: close, drop the page cache, reopen;
untimed) and runs the mode's queries once. Stdout gets a JSON line per pass
(``{"pass": {...}}``: recall@10, QPS, p50/p99 latency) as it ends, then one with everything:
baseline, peak RSS (VmHWM), the index's stats, the passes. faiss's C++ printf output goes to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import json
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.vectordb import _cgroup

LIBRARIES = ("numpy", "faiss", "vectordb", "torch")
K = 10
RECALL_GOAL = 0.9  # the recall the headline QPS figures are taken at
MIN_QUERIES = 20  # as _budget_report.MIN_QUERIES: a pass with fewer gives no QPS figure
STARTED = time.perf_counter()  # the worker's start (the parent's limit runs from about here)
_MARGIN_S = 4.0  # of the worker's time, kept to report after a batch given up


def _rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak_rss_bytes() -> int:
    """VmHWM, the peak RSS of this program's memory map. Not ``ru_maxrss``: Linux carries that
    across fork and exec, so a worker would report its (much larger) parent's RSS."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def _load_libraries(system: str, light: bool) -> None:
    """The same libraries in every worker; ``light`` (smoke runs): only the system's own."""
    names = LIBRARIES if not light else ("numpy", "vectordb" if system == "ours" else "faiss")
    for name in names:
        with contextlib.suppress(ImportError):  # torch is optional (the head scan needs none)
            importlib.import_module(name)


def _percentile_ms(latencies: list[float], q: float) -> float:
    import numpy as np

    return round(float(np.percentile(latencies, q)) * 1000, 3)


def _anon_bytes(cgroup: str | None) -> int | None:
    """The group's anonymous memory now (what reclaim cannot take back; the charge also holds
    page cache), from memory.stat: ``rss`` (v1) or ``anon`` (v2)."""
    if not cgroup:
        return None
    with contextlib.suppress(OSError):
        for line in Path(cgroup, "memory.stat").read_text().splitlines():
            name, value = line.split()
            if name in ("rss", "anon"):
                return int(value)
    return None


def _pass(
    system: Any,
    mode: str,
    value: int,
    queries: Any,
    gt: Any,
    limit_s: float,
    cgroup: str | None = None,
    batch_limit_s: float = float("inf"),
) -> dict[str, Any]:
    """One cold pass; a batch still running after ``batch_limit_s`` is given up
    (``_unfinished``)."""
    from benchmarks.vectordb._common import recall_at

    system.cold()
    start = time.perf_counter()
    deadline = start + limit_s
    if mode == "batch":
        timed = system.batch_within(queries, K, value, batch_limit_s)
        if timed is None:  # not done in time: a bound on its QPS, nothing more
            return _unfinished(value, len(queries), time.perf_counter() - start, cgroup)
        ids, latencies = timed
    elif mode == "single":
        ids, latencies = system.single(queries, K, value, deadline)
    else:
        callers = int(mode.removeprefix("conc"))
        ids, latencies = system.concurrent(queries, K, value, callers, deadline)
    wall_s = time.perf_counter() - start
    done = (ids >= 0).any(axis=1)  # rows searched before the deadline
    return {
        "mode": mode,
        "value": value,
        "queries": int(done.sum()),
        "recall": round(recall_at(ids[done], gt[done], K), 4),
        "qps": round(int(done.sum()) / wall_s, 1),
        "wall_s": round(wall_s, 3),
        "p50_ms": _percentile_ms(latencies, 50),
        "p99_ms": _percentile_ms(latencies, 99),
        "rss_bytes": _rss_bytes(),
        "anon_bytes": _anon_bytes(cgroup),  # the group's, after the pass
    }


def _unfinished(value: int, offered: int, wall_s: float, cgroup: str | None) -> dict[str, Any]:
    """A batch pass that did not return in time: no recall and no latency, only that
    ``offered`` queries took longer than ``wall_s`` (its QPS is below offered / wall_s at this
    knob and at every slower one; _budget_report turns that into a bound)."""
    return {
        "mode": "batch",
        "value": value,
        "queries": 0,
        "offered": offered,
        "unfinished": True,
        "recall": 0.0,
        "qps": 0.0,
        "qps_below": round(offered / wall_s, 2),
        "wall_s": round(wall_s, 3),
        "p50_ms": round(wall_s * 1000, 3),
        "p99_ms": round(wall_s * 1000, 3),
        "rss_bytes": _rss_bytes(),
        "anon_bytes": _anon_bytes(cgroup),
    }


def measure(args: argparse.Namespace, baseline_bytes: int, reply: Any) -> dict[str, Any]:
    import numpy as np

    from benchmarks.vectordb._budget_systems import budget_supported, make

    queries = np.load(args.queries)
    gt = np.load(args.gt)
    paths = {"index": args.index, "data": args.data}
    # the limit counts what is charged from here on (a joined group); uncapped, the limit's
    # share is the index's budget as it stands
    charged = baseline_bytes if args.join and args.cgroup else 0
    ours_budget = None if args.budget_bytes is None else max(0, args.budget_bytes - charged)
    system = make(args.system, paths, ours_budget, args.keep_open)
    opened_anon = _anon_bytes(args.cgroup)
    values = [int(v) for v in args.knobs.split(",") if v]
    if args.system == "ours" and system.default_value not in values:
        values.append(system.default_value)  # the default SearchParams: recall_at_10_single
    # said at once: a worker the limit kills later still tells which passes are the default's
    print(json.dumps({"setting": {"default_value": system.default_value}}), file=reply, flush=True)
    counts = {"batch": len(queries), "single": args.single_queries}
    passes, skipped = [], []
    unfinished = False
    try:
        for mode in args.modes.split(","):
            rows = counts.get(mode, args.conc_queries)
            for value in sorted(values):
                last = passes[-1] if passes and passes[-1]["mode"] == mode else None
                # the default setting's one-query pass always runs: recall_at_10_single
                default = mode == "single" and value == getattr(system, "default_value", None)
                slow = last and last["wall_s"] > args.pass_s and last["recall"] >= RECALL_GOAL
                # a pass cut short with fewer queries than the report counts: larger knobs
                # are slower still and would give no figure either (a thrashing system spent
                # the worker's time on them: one query took 35 s at nprobe 32)
                thin = last and last["wall_s"] > args.pass_s and last["queries"] < MIN_QUERIES
                if (slow or thin) and not default:
                    # larger knobs: slower still, and the goal is reached; below it a slow
                    # system still gets its next knob, so its QPS at the goal is measured
                    skipped.append({"mode": mode, "value": value})
                    continue
                # a batch gets what is left of the worker's time, less a margin to report
                at_s = time.perf_counter() - STARTED
                left_s = args.worker_s - at_s - _MARGIN_S
                if mode == "batch":  # said first: a worker killed in it (the limit's OOM
                    # killer, the parent's timeout) still shows how long it ran unfinished
                    started = {"mode": mode, "value": value, "offered": rows, "at": time.time()}
                    print(json.dumps({"started": started}), file=reply, flush=True)
                done = _pass(
                    system, mode, value, queries[:rows], gt[:rows], args.pass_s, args.cgroup,
                    batch_limit_s=left_s,
                )  # fmt: skip
                passes.append(done)
                # each pass at once: a worker killed later (OOM, timeout) still reports it
                print(json.dumps({"pass": done}), file=reply, flush=True)
                print(
                    f"[{args.system}] {mode} {system.knob}={value}: recall {done['recall']:.4f}"
                    f", {done['qps']:,.0f} QPS, p50 {done['p50_ms']:.2f} ms",
                    file=sys.stderr, flush=True,
                )  # fmt: skip
                if done.get("unfinished"):  # its search still runs: nothing more can be
                    unfinished = True  # measured, and the index must not be touched
                    break
            if unfinished:
                break
        stats = system.stats()
    finally:
        if not unfinished:
            system.close()
    return {
        "knob": system.knob,
        "default_value": system.default_value,
        "budget_supported": budget_supported() if args.system == "ours" else None,
        "memory_budget_bytes": ours_budget if args.system == "ours" else None,
        "stats": {k: v for k, v in stats.items() if isinstance(v, int | float | str)},
        "passes": passes,
        "skipped": skipped,
        "opened_anon_bytes": opened_anon,
        "unfinished": unfinished,
    }


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="one system of the budget benchmark")
    parser.add_argument("--system", required=True)
    parser.add_argument("--index", help="ours: the index directory; faiss: the .index file")
    parser.add_argument("--data", help="faiss OnDisk: the .ivfdata file (dropped when cold)")
    parser.add_argument("--queries")
    parser.add_argument("--gt")
    parser.add_argument("--knobs", default="")
    parser.add_argument("--modes", default="single,conc8,conc64,batch")
    parser.add_argument("--single-queries", type=int, default=200)
    parser.add_argument("--conc-queries", type=int, default=500)
    parser.add_argument("--pass-s", type=float, default=30.0, help="a mode's passes stop past it")
    parser.add_argument("--budget-bytes", type=int, help="the cgroup's limit (ours: its budget)")
    parser.add_argument("--cgroup", help="this process's cgroup, to read its charge")
    parser.add_argument("--light", action="store_true", help="smoke: own libraries only")
    parser.add_argument("--probe", action="store_true", help="print the baseline and exit")
    parser.add_argument("--keep-open", action="store_true", help="ours: cold without reopening")
    parser.add_argument("--join", action="store_true", help="join --cgroup after warming up")
    parser.add_argument(
        "--worker-s", type=float, default=600.0, help="the parent's limit on this worker"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    reply = os.fdopen(os.dup(1), "w")  # our JSON line only: C++ printf output goes to stderr
    os.dup2(2, 1)
    _load_libraries(args.system, args.light)
    if not args.light and args.queries:
        import numpy as np

        from benchmarks.vectordb._budget_systems import warm_up

        warm_up(args.system, int(np.load(args.queries, mmap_mode="r").shape[1]))
    if args.join and args.cgroup:  # from here on, what this process takes is charged there
        from tiers.io import trim_heap

        gc.collect()
        trim_heap()  # the warm-up's freed memory: reused after joining, it would be uncharged
        Path(args.cgroup, "cgroup.procs").write_text(str(os.getpid()))
    charged = _cgroup.usage_bytes(args.cgroup) if args.cgroup else None
    # the cap counts what is charged to the group (anonymous memory, page cache this process
    # brought in), not RSS: shared libraries already cached are charged to whoever read them
    # first, and would make an RSS baseline ~250 MiB too generous
    baseline_bytes = charged if charged is not None else _rss_bytes()
    out: dict[str, Any] = {
        "system": args.system,
        "baseline_bytes": baseline_bytes,
        "baseline_rss_bytes": _rss_bytes(),
        "baseline_charged_bytes": charged,
    }
    if not args.probe:
        out.update(measure(args, baseline_bytes, reply))
    out["peak_rss_bytes"] = _peak_rss_bytes()
    print(json.dumps(out), file=reply, flush=True)
    if out.get("unfinished"):  # a search thread still runs in the library: end here
        os._exit(0)


if __name__ == "__main__":
    main()
