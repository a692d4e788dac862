"""After an engine closes, the process's next large write to a slow pipe arrives whole.

Closing an io_uring makes the kernel interrupt the closing thread's next blocking call some
milliseconds later (``tiers/io/uring/ring_exit.py``); a ``print`` of 1 MiB to a pipe the
reader had not drained then stopped at 65,536 bytes, exit status 0. Each case runs a child process
that closes an engine (directly, or through the tiered store or the vector index that own one) and
then prints 1 MiB to its stdout, which the parent drains slowly.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PAYLOAD_BYTES = 1 << 20

CHILD = textwrap.dedent(
    """
    import asyncio, sys
    import numpy as np
    from tiers import IORuntime, create_engine, aligned_empty

    kind, how, scratch = sys.argv[1], sys.argv[2], sys.argv[3]

    async def engine_only(do_io):
        engine = create_engine(kind)
        if do_io:
            path = scratch + "/data.bin"
            open(path, "wb").write(b"z" * 65536)
            file = await engine.open(path)
            buffer = aligned_empty(8 * 4096)
            await engine.read_batch(file, buffer, np.arange(8) * 4096, 4096)
            await engine.close_file(file)
        await engine.aclose()

    async def store():
        from tiers.store.config import open_store
        config = {"engine": kind, "tiers": [
            {"kind": "nvme", "path": scratch + "/nvme", "capacity": "64MiB", "create": True}]}
        store = await open_store(config)
        await store.put("k", b"v" * 10000)
        await store.aclose()

    async def index():
        from vectordb import IndexConfig, SpannIndex
        runtime = IORuntime(engine=kind)
        created = await SpannIndex.create(scratch + "/index", IndexConfig(dim=8), runtime=runtime)
        vectors = np.random.default_rng(0).normal(size=(200, 8)).astype(np.float32)
        await created.build(None, vectors)
        await created.search(vectors[:5], 3)
        await created.aclose()
        runtime.close()

    cases = {"idle": lambda: engine_only(False), "io": lambda: engine_only(True),
             "store": store, "index": index}
    asyncio.run(cases[how]())
    print("x" * (1 << 20))
    """
)


def _engine_kinds() -> list[str]:
    from tiers.io.uring.engine import UringEngine

    kinds = ["thread"]
    kinds.append("uring" if UringEngine.probe() is None else "uring-missing")
    return kinds


def _drain_slowly(process: subprocess.Popen[bytes]) -> bytes:
    """Read as a busy consumer would: late, and a little at a time."""
    assert process.stdout is not None
    time.sleep(0.3)  # let the child's first write fill the pipe and block
    chunks = []
    while chunk := os.read(process.stdout.fileno(), 16384):
        chunks.append(chunk)
        time.sleep(0.001)
    return b"".join(chunks)


@pytest.mark.parametrize("how", ["idle", "io", "store", "index"])
@pytest.mark.parametrize("kind", _engine_kinds())
def test_every_byte_reaches_a_slow_pipe_after_close(kind: str, how: str, tmp_path: Path) -> None:
    if kind == "uring-missing":
        pytest.skip("io_uring is not available here")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with subprocess.Popen(
        [sys.executable, "-c", CHILD, kind, how, str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    ) as process:
        out = _drain_slowly(process)
        assert process.stderr is not None
        err = process.stderr.read().decode()
        assert process.wait(timeout=60) == 0, err
    assert len(out) == PAYLOAD_BYTES + 1, f"{len(out)} of {PAYLOAD_BYTES + 1} bytes; {err}"
    assert out == b"x" * PAYLOAD_BYTES + b"\n"
