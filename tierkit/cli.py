"""The ``tierkit`` command: ``serve`` runs the REST vector search service; ``demo`` measures the
I/O core, the tiered store and the vector index on real files; ``engines`` says which I/O
engines can run here.

A bad value is refused by argparse before anything runs (one ``error:`` line, exit status 2). A
failure the library reports while running (a typed tierkit error, or the OS refusing a file) is
one ``tierkit: error:`` line and exit status 1; anything else is a bug and keeps its traceback.
numpy, numba and faiss are imported only once a command runs, so ``--help`` and refusals are
instant and the demo's first line comes before its imports.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys

from tierkit.arguments import free_mib, positive_float, positive_int, writable_directory

__all__ = ["main"]

DESCRIPTION = """\
tierkit: tiered storage middleware for large-model work. One async I/O core
(io_uring, or a thread pool) and one tiered store (HBM, DRAM, CXL, NVMe), with a
disk-resident vector index and a globally shuffled data loader on top."""
EPILOG = """examples:
  tierkit serve --data .tierkit-data --sample
                         the REST vector search service on http://127.0.0.1:6333, with a
                         2,000-point sample collection (prints the admin key on first start)
  tierkit engines        which I/O engines can run here, and why not
  tierkit demo           the I/O core, the tiered store and the vector index on real files
                         (~15 s; the first run also compiles numba's kernels)
  tierkit demo --size-mib 64 --duration-s 1 --dir /mnt/nvme/scratch
                         a smaller file and shorter reads, on another disk
  tierkit demo | tail -n 1
                         the demo's figures as one JSON object (its last line)
"""
DEMO_DESCRIPTION = (
    "Write and read a file through the I/O core (O_DIRECT), run a Zipf load on a tiered store "
    "over DRAM, CXL and NVMe, then build, search, update and reopen a disk-resident vector "
    "index. Each step is printed as it starts and measured in a table; the last line is a JSON "
    "summary."
)


def _engines(_: argparse.Namespace) -> int:
    from tiers.io import UringEngine

    reason = UringEngine.probe()
    print(f"uring : {'available' if reason is None else 'unavailable: ' + reason}")
    print("thread: available (the fallback)")
    try:
        from tiers.io import GdsEngine

        GdsEngine(1)
        print("gds   : available")
    except Exception as exc:  # report any reason, this is a diagnostic command
        print(f"gds   : unavailable: {exc}")
    return 0


def _demo(args: argparse.Namespace) -> int:
    print("tierkit demo: loading numpy, numba and faiss...")
    from tierkit.demo import DemoOptions, run_demo

    options = DemoOptions(args.dir, args.size_mib, args.duration_s, args.engine, args.keep)
    summary = asyncio.run(run_demo(options))
    print(json.dumps(summary))
    return 0


def _serve(args: argparse.Namespace) -> int:
    from server.cli import run_serve

    return run_serve(args, args.parser)


def _check_room(args: argparse.Namespace) -> None:
    """Refuse a file bigger than the free space now, not after filling the disk."""
    free = free_mib(args.dir)
    if args.size_mib > free:
        need = f"{args.size_mib:,} MiB do not fit in {args.dir}"
        args.parser.error(f"argument --size-mib: {need} ({free:,} MiB free)")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tierkit",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="{serve,demo,engines}")
    from server.cli import SERVE_DESCRIPTION, add_serve_arguments

    serve = sub.add_parser(
        "serve", help="run the REST vector search service", description=SERVE_DESCRIPTION
    )
    add_serve_arguments(serve)
    serve.set_defaults(run=_serve, check=None, parser=serve)
    demo = sub.add_parser(
        "demo", help="measure the I/O core, the store and the index", description=DEMO_DESCRIPTION
    )
    demo.add_argument(
        "--dir",
        type=writable_directory,
        default=".tierkit-demo",
        help="where the demo's files go, in a fresh subdirectory (default: %(default)s)",
    )
    demo.add_argument(
        "--size-mib",
        type=positive_int,
        default=256,
        metavar="MIB",
        help="size of the I/O core's file in MiB (default: %(default)s)",
    )
    demo.add_argument(
        "--duration-s",
        type=positive_float,
        default=2.0,
        metavar="SECONDS",
        help="seconds of random reads (default: %(default)s)",
    )
    demo.add_argument(
        "--engine",
        choices=("auto", "uring", "thread"),
        default=None,
        help="I/O engine (default: $TIERKIT_IO_ENGINE, else auto: io_uring where it runs)",
    )
    demo.add_argument("--keep", action="store_true", help="keep the demo's files")
    demo.set_defaults(run=_demo, check=_check_room, parser=demo)
    engines = sub.add_parser("engines", help="which I/O engines can run here, and why not")
    engines.set_defaults(run=_engines, check=None)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.check is not None:
        args.check(args)
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]  # a pipe too
    logging.basicConfig(format="%(message)s")
    logging.getLogger("tierkit").setLevel(logging.INFO)  # the library's notes, not faiss's
    try:
        return args.run(args)
    except KeyboardInterrupt:
        print("tierkit: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader left (``| head``): stop quietly, as other tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except Exception as exc:
        from tiers.io import TierkitError

        if not isinstance(exc, TierkitError | OSError):
            raise
        print(f"tierkit: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
