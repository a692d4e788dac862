"""One system's process: build its data (``--build``), or open it and run the load cells.

    python -m benchmarks.server._worker --system qdrant_local --dir D --manifest M --build
    python -m benchmarks.server._worker --system http --port P --server-pid S --manifest M \
        --cells query:1,query:8,mix:8 --warmup-s 2 --duration-s 5 --rounds 1

For ``http`` this process is only the load generator; the server is the watched ``--server-pid``.
For the in-process systems it is both caller and callee (its own CPU is the system's). The last
stdout line is one JSON object; a failure prints ``{"error": ...}`` there instead.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from benchmarks.server._dataset import Work
from benchmarks.server._loadgen import Cell, run_cell
from benchmarks.server._peers import HttpOps, build, open_system


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--system", required=True)
    parser.add_argument("--manifest", required=True)
    parser.add_argument("--dir", type=Path)
    parser.add_argument("--build", action="store_true")
    parser.add_argument("--port", type=int)
    parser.add_argument("--server-pid", type=int)
    parser.add_argument("--cells", default="")
    parser.add_argument("--warmup-s", type=float, default=2.0)
    parser.add_argument("--duration-s", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--id-start", type=int, default=0)
    parser.add_argument("--id-wrap", type=int, default=0)  # > 0: upserts overwrite ids below
    parser.add_argument("--rss-every-s", type=float, default=0.0)
    return parser.parse_args(argv)


async def measure(args: argparse.Namespace, work: Work) -> dict[str, Any]:
    cells = Cell.parse(args.cells)
    load1 = [round(os.getloadavg()[0], 2)]
    started = time.perf_counter()
    if args.system == "http":
        ops: Any = HttpOps(args.port, work.queries, work.upserts)
        facts: dict[str, Any] = {"api": "REST POST /points/query, one keep-alive conn per caller"}
        closer = None
        watch = {"server": args.server_pid, "client": os.getpid()}
    else:
        ops, facts, closer = await open_system(args.system, args.dir, work.queries, work.upserts)
        watch = {"process": os.getpid()}
    open_s = time.perf_counter() - started
    ids = {"next": args.id_start, "rows": len(work.upserts), "wrap": args.id_wrap}
    results = []
    try:
        for round_index in range(args.rounds):
            for cell in cells:
                ops.prepare(cell.concurrency)
                print(
                    f"  {args.system} {cell.key} round {round_index + 1}",
                    file=sys.stderr,
                    flush=True,
                )
                out = await run_cell(
                    ops, cell, work.gt, args.warmup_s, args.duration_s, watch, ids, args.rss_every_s
                )
                out["round"] = round_index
                results.append(out)
    finally:
        ops.close()
        if closer is not None:
            await closer()
    load1.append(round(os.getloadavg()[0], 2))
    return {
        "system": args.system,
        "open_s": open_s,
        "facts": facts,
        "results": results,
        "load1": load1,
    }


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    try:
        work = Work.read(args.manifest)
        if args.build:
            reply: dict[str, Any] = {"build_s": build(args.system, args.dir, work.base)}
        else:
            reply = asyncio.run(measure(args, work))
    except Exception as exc:  # the parent reports the system as unavailable, with this
        traceback.print_exc(file=sys.stderr)
        reply = {"error": f"{type(exc).__name__}: {exc}"[:500]}
    sys.stdout.flush()
    print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    main()
