r"""One system of the tenancy benchmark, in a process of its own (started by tenancy.py).

    python -m benchmarks.vectordb._tenancy_worker --system ours --manifest M.json \
        --index DIR --knobs 256,512,default --out IDS.npz [--single-rows 50] [--pass-s 60]

The manifest names the base vectors (.npy, memory-mapped), the access model (CSR .npz:
``indptr``, ``indices``) and the rows (.npz: ``queries``, ``tenant``, ``cls``). After one untimed
warm-up (a few rows of each class, batch and single, then a whole batch of each class at the
first knob value), per knob value and selectivity class:
``--rounds`` timed ``batch`` passes over the class's rows, each cold (the system's files dropped
from the page cache first), the median kept (a pass over a quarter of ``--pass-s`` is not
repeated); then ``single`` passes (one query per call, cold first) over the first
``--single-rows`` rows of each class. The ids found go to ``--out`` (the parent scores them
against the ground truth and the access model: a worker never sees the ground truth); the
timings, the system's memory and disk figures and the process's peak RSS (VmHWM) are the JSON line
on stdout. Ours also times, per knob and class under 1%, the cold read of only the runs its batch
pass read (``read_bound``: the compact twins it read; ``read_bound_f32``: the full runs).
``--system ours_updates`` times grants, revokes and inserts instead (_tenancy_updates.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import numpy as np

_WARM_ROWS = 16


def _peak_rss_bytes() -> int:
    """VmHWM: this process's own peak (ru_maxrss would carry the parent's across fork+exec)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def load_context(manifest_path: str) -> Any:
    from benchmarks.vectordb._tenancy_data import tenant_csr
    from benchmarks.vectordb._tenancy_peers import Context

    with open(manifest_path) as stream:
        manifest = json.load(stream)
    access = np.load(manifest["access"])
    rows = np.load(manifest["rows"])
    t_indptr, t_docs = tenant_csr(access["indptr"], access["indices"])
    ctx = Context(
        np.load(manifest["base"], mmap_mode="r"),
        np.ascontiguousarray(rows["queries"], np.float32),
        rows["tenant"].astype(np.int64),
        t_indptr,
        t_docs,
    )
    return ctx, rows["cls"].astype(np.int64)


def make(name: str, ctx: Any, index: str) -> Any:
    if name == "ours":
        from benchmarks.vectordb._tenancy_ours import Ours

        return Ours(ctx, index)
    if name == "shared_filter":
        from benchmarks.vectordb._tenancy_ours import SharedFilter

        return SharedFilter(ctx, index)
    from benchmarks.vectordb import _tenancy_peers as peers

    if name == "faiss_ivf_filter":
        return peers.FilteredIvf(ctx, index)
    if name == "per_tenant_ram":
        return peers.PerTenantRam(ctx)
    if name == "per_tenant_disk":
        return peers.PerTenantDisk(ctx, index)
    raise ValueError(f"unknown system {name!r}")


def label(value: Any) -> str:
    return "default" if value is None else str(value)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    ctx, classes = load_context(args.manifest)
    system = make(args.system, ctx, args.index)
    passes: list[dict[str, Any]] = []
    found: dict[str, Any] = {}
    try:
        values = system.values(args.knobs.split(",") if args.knobs else [])
        by_class = [(int(c), np.flatnonzero(classes == c)) for c in np.unique(classes)]
        for _, rows in by_class:  # untimed: compiled kernels, threads, first-call costs
            system.batch(rows[:_WARM_ROWS], values[0], time.perf_counter() + args.pass_s)
            system.single(int(rows[0]), values[0])
        for _, rows in by_class:  # untimed: a whole batch of each class, so the process's
            # first large buffers (fresh memory, faulted in page by page) are not charged to
            # the first knob's timed passes; deadline now: no extra rounds (shared_filter)
            system.batch(rows, values[0], time.perf_counter())
        for value in values:
            for cls, rows in by_class:
                walls = []
                for _ in range(args.rounds):  # the median; a slow pass is not repeated
                    system.cold(rows)
                    start = time.perf_counter()
                    ids, cut = system.batch(rows, value, start + args.pass_s)
                    walls.append(time.perf_counter() - start)
                    if walls[-1] > args.pass_s / 4:
                        break
                wall_s = float(np.median(walls))
                key = f"batch|{label(value)}|{cls}"
                found[key], found[key + "|rows"] = ids, rows
                passes.append(
                    {
                        "mode": "batch",
                        "value": label(value),
                        "cls": cls,
                        "rows": len(rows),
                        "wall_s": wall_s,
                        "walls": walls,
                        "cut": cut,
                    }
                )
                print(
                    f"[{system.name}] batch {system.knob}={label(value)} class {cls}: "
                    f"{len(rows) / wall_s:,.0f} QPS",
                    file=sys.stderr,
                    flush=True,
                )
        if hasattr(system, "read_bound"):
            passes += _read_bound_passes(system, values, by_class, args.rounds, found)
        for value in values if args.single_rows else []:
            for cls, rows in by_class:
                sample = rows[: args.single_rows]
                system.cold(sample)
                ids = np.full((len(sample), 10), -1, np.int64)
                latencies = []
                deadline = time.perf_counter() + args.pass_s
                for i, row in enumerate(sample):
                    start = time.perf_counter()
                    if start > deadline:
                        break
                    ids[i] = system.single(int(row), value)
                    latencies.append(time.perf_counter() - start)
                key = f"single|{label(value)}|{cls}"
                done = len(latencies)
                found[key], found[key + "|rows"] = ids[:done], sample[:done]
                passes.append(
                    {
                        "mode": "single",
                        "value": label(value),
                        "cls": cls,
                        "rows": done,
                        "wall_s": float(sum(latencies)),
                        "p50_ms": float(np.median(latencies) * 1e3) if done else None,
                        "cut": len(sample) - done,
                    }
                )
        if args.single_rows and hasattr(system, "concurrent"):
            passes += _concurrent_passes(system, values, by_class, args.single_rows, found)
        figures = system.figures()
    finally:
        system.close()
    np.savez(args.out, **found)
    return {"system": system.name, "knob": system.knob, "passes": passes, "figures": figures}


def _read_bound_passes(
    system: Any, values: list[Any], by_class: list[tuple[int, np.ndarray]], rounds: int,
    found: dict[str, Any],
) -> list[dict[str, Any]]:  # fmt: skip
    """Ours, tenants under 1%: per knob value and class, the cold read of just what the
    batch pass read (``read_bound``: the compact twins, where whole; the floor under that
    pass), and of the same shortlists' full runs (``read_bound_f32``: float records); the
    ids are the batch pass's, so each point carries the recall of the search it bounds."""
    passes = []
    for value in values:
        for cls, rows in by_class:
            if cls > 1:  # classes 0 and 1: "small"
                continue
            batch = f"batch|{label(value)}|{cls}"
            for mode, runs in (("read_bound", False), ("read_bound_f32", True)):
                walls = [system.read_bound(rows, value, runs) for _ in range(rounds)]
                key = f"{mode}|{label(value)}|{cls}"
                found[key], found[key + "|rows"] = found[batch], found[batch + "|rows"]
                passes.append(
                    {"mode": mode, "value": label(value), "cls": cls, "rows": len(rows),
                     "wall_s": float(np.median(walls)), "walls": walls, "cut": 0}
                )  # fmt: skip
    return passes


def _concurrent_passes(
    system: Any, values: list[Any], by_class: list[tuple[int, np.ndarray]], n: int,
    found: dict[str, Any],
) -> list[dict[str, Any]]:  # fmt: skip
    """Each class's single-call sample again, every row its own call, all awaited at once
    (systems with ``concurrent``: ours, whose small searches gather into shared batches)."""
    passes = []
    for value in values:
        for cls, rows in by_class:
            sample = rows[:n]
            system.cold(sample)
            start = time.perf_counter()
            ids = system.concurrent(sample, value)
            wall_s = time.perf_counter() - start
            key = f"concurrent|{label(value)}|{cls}"
            found[key], found[key + "|rows"] = ids, sample
            passes.append(
                {"mode": "concurrent", "value": label(value), "cls": cls, "rows": len(sample),
                 "wall_s": wall_s, "cut": 0}
            )  # fmt: skip
    return passes


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="one system of the tenancy benchmark")
    parser.add_argument("--system", required=True)
    parser.add_argument("--manifest", required=True)
    parser.add_argument("--index", default="", help="the system's index (directory or file)")
    parser.add_argument("--plain", default="", help="ours_updates: the build without tenancy")
    parser.add_argument("--scratch", default="", help="ours_updates: where copies go")
    parser.add_argument("--knobs", default="")
    parser.add_argument("--out", default="")
    parser.add_argument("--single-rows", type=int, default=0)
    parser.add_argument("--pass-s", type=float, default=60.0)
    parser.add_argument("--rounds", type=int, default=1, help="batch passes per setting")
    args = parser.parse_args(argv)
    reply = os.fdopen(os.dup(1), "w")  # our JSON line only: C++ printf output goes to stderr
    os.dup2(2, 1)
    if args.system == "ours_updates":
        from benchmarks.vectordb._tenancy_updates import update_timings

        ctx, _ = load_context(args.manifest)
        out: dict[str, Any] = {"system": "ours_updates"}
        out["updates"] = update_timings(ctx, args.index, args.plain, args.scratch)
    else:
        out = measure(args)
    out["peak_rss_bytes"] = _peak_rss_bytes()
    print(json.dumps(out), file=reply, flush=True)


if __name__ == "__main__":
    main()
