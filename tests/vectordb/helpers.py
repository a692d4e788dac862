"""Shared pieces of the vectordb tests: clustered data, a brute-force oracle, recall, and
runs cut short by a power cut or a kill."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np

from tiers.io import IORuntime, ThreadEngine
from tiers.io.errors import EngineClosedError
from tiers.testing.faulty_engine import PowerCutAt
from vectordb import SpannIndex
from vectordb.metric import Metric, pairwise_distances, prepare, to_scores


def clustered(n: int, dim: int, seed: int, clusters: int = 20) -> np.ndarray:
    """Gaussian blobs: the shape real embeddings have, at a size tests can afford."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(clusters, dim)).astype(np.float32) * 4
    labels = rng.integers(clusters, size=n)
    return (centres[labels] + rng.normal(size=(n, dim))).astype(np.float32)


def brute_force(
    metric: Metric, ids: np.ndarray, vectors: np.ndarray, queries: np.ndarray, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """Exact (ids, scores) of the k nearest, as SpannIndex.search reports them."""
    dist = pairwise_distances(metric, prepare(metric, queries), prepare(metric, vectors))
    order = np.argsort(dist, axis=1, kind="stable")[:, :k]
    return ids[order], to_scores(metric, np.take_along_axis(dist, order, axis=1))


def recall(found: np.ndarray, truth: np.ndarray) -> float:
    k = truth.shape[1]
    hits = [
        len(set(f[f >= 0].tolist()) & set(t.tolist())) for f, t in zip(found, truth, strict=True)
    ]
    return float(np.mean(hits)) / k


def run_and_kill(
    writer: Path, directory: Path, seed: int, acks_before_kill: int, delay_s: float
) -> int:
    """Run a crash-writer script (it prints ``ready``, then a line per acknowledged update),
    ``kill -9`` it after ``acks_before_kill`` lines and ``delay_s``; returns the updates it
    acknowledged (lines printed before the kill count too)."""
    process = subprocess.Popen(
        [sys.executable, str(writer), str(directory), str(seed)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None and process.stderr is not None
    acked = 0
    try:
        assert process.stdout.readline() == "ready\n", process.stderr.read()
        while acked < acks_before_kill:
            line = process.stdout.readline()
            assert line, f"writer died: {process.stderr.read()}"
            acked += 1
        time.sleep(delay_s)
    finally:
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
    acked += len(process.stdout.readlines())  # printed before the kill: acknowledged too
    process.stdout.close()
    process.stderr.close()
    return acked


async def run_until_power_cut(
    directory: Path,
    ops: Sequence[Any],
    run_op: Callable[[SpannIndex, Any], Awaitable[object]],
    cut_at: int,
    *,
    seed: int = 0,
    keep: Literal["none", "random"] = "random",
) -> tuple[int, list[int]]:
    """Opens the index at ``directory`` over an engine that loses power before its
    ``cut_at``-th batch and runs ``ops`` in order through ``run_op``: (how many calls were
    acknowledged, the engine's batch count when each call began, then its final count)."""
    engine = PowerCutAt(ThreadEngine(4), cut_at, seed=seed, keep=keep)
    acked, starts = 0, list[int]()
    try:
        index = await SpannIndex.open(directory, runtime=IORuntime(engine=lambda *_: engine))
    except EngineClosedError:
        return acked, [engine.batches]
    try:
        for op in ops:
            starts.append(engine.batches)
            await run_op(index, op)
            acked += 1
    except EngineClosedError:
        pass
    finally:
        await index.aclose()
        await engine.aclose()
    return acked, [*starts, engine.batches]


def flip_byte(path: Path, offset: int, mask: int = 0x10) -> None:
    """XOR one byte of ``path`` at ``offset`` with ``mask``: planted on-disk damage."""
    with open(path, "r+b") as stream:
        stream.seek(offset)
        byte = stream.read(1)
        stream.seek(offset)
        stream.write(bytes([byte[0] ^ mask]))
