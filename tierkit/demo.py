"""``tierkit demo``: the I/O core, the tiered store and the vector index on real files, measured.

Three parts, each announced as it starts and reported as a table: the I/O core writes and reads
one file (io_demo), a TieredStore serves a Zipf load over DRAM, CXL and NVMe (store_demo), and a
SPANN index is built, searched, updated and reopened (vectordb_demo). Everything goes in a fresh
directory under ``DemoOptions.directory``, removed at the end (on failure too) unless ``keep``;
the directory given is never removed itself unless the demo created it and left it empty.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from typing import Any

from tierkit.io_demo import run_io_demo
from tierkit.store_demo import run_store_demo
from tierkit.vectordb_demo import run_vectordb_demo
from tiers import create_engine

__all__ = ["DemoOptions", "run_demo"]

STEPS = 4  # I/O core write, I/O core reads, store, vector index


@dataclass(frozen=True, slots=True)
class DemoOptions:
    directory: str = ".tierkit-demo"
    size_mib: int = 256
    duration_s: float = 2.0
    engine: str | None = None  # None: TIERKIT_IO_ENGINE, else "auto"
    keep: bool = False
    queue_depth: int = 32


def _make_dirs(path: str) -> list[str]:
    """Create ``path`` and its missing parents; returns those it created, deepest first."""
    created, probe = [], os.path.abspath(path)
    while not os.path.exists(probe):
        created.append(probe)
        probe = os.path.dirname(probe)
    os.makedirs(path, exist_ok=True)
    return created


def _remove_if_empty(created: list[str]) -> None:
    for path in created:  # deepest first: stop at the first that holds something
        try:
            os.rmdir(path)
        except OSError:
            return


async def run_demo(options: DemoOptions) -> dict[str, Any]:
    """Runs the three parts in a fresh directory; returns the JSON summary's figures."""
    created = _make_dirs(options.directory)
    scratch = tempfile.mkdtemp(prefix="run-", dir=options.directory)
    print(f"files in {scratch} ({'kept' if options.keep else 'removed at the end'})")
    try:
        return await _run_parts(options, scratch)
    finally:
        if not options.keep:
            shutil.rmtree(scratch, ignore_errors=True)
            _remove_if_empty(created)


async def _run_parts(options: DemoOptions, scratch: str) -> dict[str, Any]:
    engine = create_engine(options.engine, queue_depth=options.queue_depth)
    async with engine:
        steps = (f"[1/{STEPS}]", f"[2/{STEPS}]")
        io = await run_io_demo(engine, scratch, options.size_mib, options.duration_s, steps)
    store = await run_store_demo(scratch, f"[3/{STEPS}]")
    vectors = await run_vectordb_demo(scratch, f"[4/{STEPS}]")
    return {**io, **store, **vectors}
