r"""Where the service's memory goes under the soak's load: a leak, a cache filling, or malloc.

    flock /tmp/tierkit-bench.lock .venv/bin/python -m benchmarks.server.memory_probe \
        --seconds 240 --overwrite [--tracemalloc-frames 1] [--env MALLOC_ARENA_MAX=2]

Runs the load benchmark's soak (the 90/10 query/upsert mix at concurrency 8 over loopback HTTP,
``_loadgen``) against ``_probe_server``: the same app, with a sampler inside the server process
(``/proc`` status, glibc's ``mallinfo2``, Python's heap, gc, the loop's tasks, the index's and
LMDB's sizes). Data: a fresh copy of the load benchmark's last ``http`` build (run
``benchmarks.server.load --quick`` once first). ``--overwrite``: the upserts overwrite existing
points (the store keeps its size), else they add new ones.

Prints one row per sample and, last, one JSON object: each figure at the first sample after the
warm-up and at the end, with the growth in bytes and percent, and (with tracemalloc) the source
lines whose traced bytes grew most.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common.paths import OUT_DIR
from benchmarks.common.scratch import remove_at_exit
from benchmarks.server._builds import fresh_copy
from benchmarks.server._service import Server
from benchmarks.server.load import run_worker

_FIGURES = ("VmRSS", "RssAnon", "RssFile", "in_use", "free", "mmapped", "traced_bytes", "blocks")


def latest_build(dataset: str) -> Path:
    builds = sorted(
        (OUT_DIR / "server" / "builds").glob(f"http-{dataset}-*/BUILT"),
        key=lambda p: p.stat().st_mtime,
    )
    if not builds:
        raise SystemExit(f"no http build of {dataset}: run benchmarks.server.load --quick first")
    return builds[-1].parent


def flat(row: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in row.items() if not isinstance(v, dict)}
    out.update(row.get("malloc", {}))
    for value in row.values():
        if isinstance(value, dict) and "points" in value:
            out.update(points=value["points"], heads=value["heads"])
            out.update(lmdb_used_bytes=value["lmdb_used_bytes"], readers=value["lmdb_readers"])
            out["resident_bytes"] = value["resident_bytes"]
    return out


def growth(rows: list[dict[str, Any]], warmup_s: float) -> dict[str, Any]:
    after = [r for r in rows if r["t"] >= warmup_s]
    first, last = after[0], after[-1]
    out: dict[str, Any] = {"from_s": first["t"], "to_s": last["t"]}
    names = [*_FIGURES, "gc_objects", "tasks", "points", "heads", "lmdb_used_bytes"]
    for name in [*names, "resident_bytes", "readers", "Threads"]:
        if name in first and name in last and first[name] is not None:
            delta = last[name] - first[name]
            pct = 100.0 * delta / first[name] if first[name] else None
            out[name] = {"first": first[name], "last": last[name], "delta": delta, "pct": pct}
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dataset", default="debian-minilm")
    parser.add_argument("--seconds", type=float, default=240.0)
    parser.add_argument("--warmup-s", type=float, default=30.0)
    parser.add_argument("--every-s", type=float, default=10.0)
    parser.add_argument("--overwrite", action="store_true")
    parser.add_argument("--cells", default="mix:8")
    parser.add_argument("--tracemalloc-frames", type=int, default=0)
    parser.add_argument("--env", action="append", default=[], help="KEY=VALUE for the server")
    args = parser.parse_args(argv)
    source = latest_build(args.dataset)
    work = OUT_DIR / "server" / "work" / args.dataset / "manifest.json"
    n_base = len(np.load(json.loads(work.read_text())["base"], mmap_mode="r"))
    scratch = remove_at_exit(OUT_DIR / "server" / f"probe-scratch-{os.getpid()}")
    where = fresh_copy(source, scratch / "http")
    report = scratch / "probe.jsonl"
    report.unlink(missing_ok=True)
    command = [sys.executable, "-m", "benchmarks.server._probe_server", "--report", str(report)]
    command += ["--every-s", str(args.every_s), "--tracemalloc-frames"]
    command += [str(args.tracemalloc_frames), "--snapshot-at-s", "0"]
    extra = dict(item.split("=", 1) for item in args.env)
    print(f"probe: {source.name}, {args.seconds:.0f} s, env {extra}", file=sys.stderr, flush=True)
    server = Server(where / "data", None, command=command, extra_env=extra)
    ready_s = server.ready_s
    worker = ["--system", "http", "--manifest", str(work), "--cells", args.cells]
    worker += ["--warmup-s", str(args.warmup_s), "--duration-s", str(args.seconds)]
    worker += ["--id-start", str(n_base), "--id-wrap", str(n_base if args.overwrite else 0)]
    worker += ["--port", str(server.port), "--server-pid", str(server.pid)]
    try:
        reply = run_worker(worker, args.seconds + args.warmup_s + 240.0)
    finally:
        server.stop()
    lines = [json.loads(line) for line in report.read_text().splitlines()]
    top = next((line["top_growth"] for line in lines if "top_growth" in line), None)
    rows = [flat(line) for line in lines if "t" in line]
    for row in rows:
        print(" ".join(f"{k}={row.get(k)}" for k in ("t", *_FIGURES, "gc_objects", "points")))
    cell = (reply.get("results") or [{}])[0]
    summary = {
        "source": source.name,
        "seconds": args.seconds,
        "overwrite": args.overwrite,
        "env": extra,
        "ready_s": round(ready_s, 1),
        "qps": cell.get("qps"),
        "upserts_per_s": cell.get("upserts_per_s"),
        "errors": cell.get("errors", reply.get("error")),
        "growth": growth(rows, ready_s + args.warmup_s),
        "top_growth": top,
    }
    print(json.dumps(summary, default=str))


if __name__ == "__main__":
    main()
