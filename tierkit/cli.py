"""The ``tierkit`` command line: ``demo`` and ``engines`` (more with later issues)."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys

from tierkit.demo import DemoOptions, run_demo

__all__ = ["main"]


def _engines(_: argparse.Namespace) -> int:
    from tiers.uring import UringEngine

    reason = UringEngine.probe()
    print(f"uring : {'available' if reason is None else 'unavailable: ' + reason}")
    print("thread: available (the fallback)")
    try:
        from tiers.gds import GdsEngine

        GdsEngine(1)
        print("gds   : available")
    except Exception as exc:  # report any reason, this is a diagnostic command
        print(f"gds   : unavailable: {exc}")
    return 0


def _demo(args: argparse.Namespace) -> int:
    options = DemoOptions(
        directory=args.dir,
        size_mib=args.size_mib,
        duration_s=args.duration_s,
        engine=args.engine,
        keep=args.keep,
    )
    summary = asyncio.run(run_demo(options))
    print(json.dumps(summary))
    return 0


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    parser = argparse.ArgumentParser(prog="tierkit", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="write and read a real file through the I/O core")
    demo.add_argument("--dir", default=".tierkit-demo", help="where the demo file goes")
    demo.add_argument("--size-mib", type=int, default=256)
    demo.add_argument("--duration-s", type=float, default=2.0)
    demo.add_argument("--engine", default=None, help="auto | uring | thread")
    demo.add_argument("--keep", action="store_true", help="keep the demo file")
    demo.set_defaults(func=_demo)
    engines = sub.add_parser("engines", help="which I/O engines can run here, and why not")
    engines.set_defaults(func=_engines)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
