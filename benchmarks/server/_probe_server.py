"""The service with its memory watched from inside: what ``memory_probe`` runs instead of
``python -m tierkit serve``.

    python -m benchmarks.server._probe_server --data DIR --port P --report R.jsonl \
        --every-s 10 --tracemalloc-frames 1 --snapshot-at-s 60

The same app (``server.app.create_app``) under uvicorn, one worker, as ``server.run.serve``
runs it; beside it a sampler thread writes one JSON line to ``--report`` every ``--every-s``:

* ``/proc/self/status``: VmRSS, RssAnon, RssFile;
* glibc's ``mallinfo2``: bytes the C allocator hands out (``in_use``), holds free in its heaps
  (``free``: what fragmentation or retention keeps), and has mapped on its own (``mmapped``);
* Python's heap: ``tracemalloc``'s traced bytes (when on), ``sys.getallocatedblocks()``, gc
  generation counts and the number of tracked objects;
* the event loop's tasks, threads, and per collection: points, heads, the index's resident
  bytes, its list cache, and LMDB's map and readers (read on the loop thread, where they live).

With ``--tracemalloc-frames`` > 0 a snapshot is taken at ``--snapshot-at-s`` (after the soak's
warm-up) and again at shutdown; the 30 source lines whose traced bytes grew most go to the report's
last line (``{"top_growth": [...]}``). Diagnostics only: tracemalloc slows the server.
Thread-safety: the sampler only reads; loop-side figures are collected on the loop thread.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import sys
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any

import uvicorn

from server.app import create_app
from server.memory import malloc_bytes
from server.settings import Settings


def proc_status() -> dict[str, int]:
    found: dict[str, int] = {}
    with open("/proc/self/status") as stream:
        for line in stream:
            name, _, value = line.partition(":")
            if name in ("VmRSS", "RssAnon", "RssFile", "Threads"):
                number = int(value.split()[0])
                found[name] = number if name == "Threads" else number * 1024
    return found


async def loop_figures(app: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"tasks": len(asyncio.all_tasks())}
    catalog = getattr(app.state, "catalog", None)
    if catalog is None:
        return out
    for name in catalog.names():
        c = catalog.get(name)
        stats = c.index.stats()
        env = c.store._env  # diagnostics: LMDB's own figures
        info, stat = env.info(), env.stat()
        out[name] = {
            "points": c.store.count(),
            "heads": stats.get("n_heads"),
            "resident_bytes": stats.get("resident_bytes"),
            "cache": {k: v for k, v in stats.items() if "cache" in k},
            "lmdb_used_bytes": (info["last_pgno"] + 1) * stat["psize"],
            "lmdb_readers": info["num_readers"],
            "wal_bytes": stats.get("wal_bytes"),
        }
    return out


def _sample(app: Any, loop: asyncio.AbstractEventLoop, started: float) -> dict[str, Any]:
    row: dict[str, Any] = {"t": round(time.perf_counter() - started, 1)}
    row.update(proc_status())
    row["malloc"] = malloc_bytes()
    if tracemalloc.is_tracing():
        row["traced_bytes"] = tracemalloc.get_traced_memory()[0]
    row["blocks"] = sys.getallocatedblocks()
    row["gc_counts"] = gc.get_count()
    row["gc_objects"] = len(gc.get_objects())
    try:
        row.update(asyncio.run_coroutine_threadsafe(loop_figures(app), loop).result(30))
    except Exception as exc:  # a figure missing is said, not fatal
        row["loop_error"] = repr(exc)
    return row


def _top_growth(first: tracemalloc.Snapshot, last: tracemalloc.Snapshot) -> list[Any]:
    stats = last.compare_to(first, "lineno")
    return [[str(s.traceback), s.size_diff, s.count_diff] for s in stats[:30]]


async def _main(args: argparse.Namespace) -> None:
    settings = Settings(data_dir=str(args.data), host="127.0.0.1", port=args.port)
    app = create_app(settings)
    config = uvicorn.Config(app, host="127.0.0.1", port=args.port, log_config=None)
    config.access_log = False
    server = uvicorn.Server(config)
    loop, started, stop = asyncio.get_running_loop(), time.perf_counter(), threading.Event()
    snapshots: list[tracemalloc.Snapshot] = []
    report = open(args.report, "a")  # noqa: SIM115, ASYNC230 - before serving; closed below

    def sampler() -> None:
        while not stop.wait(args.every_s):
            report.write(json.dumps(_sample(app, loop, started)) + "\n")
            report.flush()
            late = time.perf_counter() - started >= args.snapshot_at_s
            if tracemalloc.is_tracing() and late and not snapshots:
                snapshots.append(tracemalloc.take_snapshot())

    thread = threading.Thread(target=sampler, daemon=True)
    thread.start()
    try:
        await server.serve()
    finally:
        stop.set()
        thread.join()
        if snapshots:
            top = _top_growth(snapshots[0], tracemalloc.take_snapshot())
            report.write(json.dumps({"top_growth": top}) + "\n")
        report.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--report", type=Path, required=True)
    parser.add_argument("--every-s", type=float, default=10.0)
    parser.add_argument("--tracemalloc-frames", type=int, default=0)
    parser.add_argument("--snapshot-at-s", type=float, default=60.0)
    args = parser.parse_args()
    if args.tracemalloc_frames:
        tracemalloc.start(args.tracemalloc_frames)
    os.environ.setdefault("TIERKIT_LOG_LEVEL", "warning")
    asyncio.run(_main(args))


if __name__ == "__main__":
    main()
