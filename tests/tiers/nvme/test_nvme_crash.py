"""NvmeTier crash consistency: simulated power cuts at every kind of point in a run of puts and
deletes, and real ``kill -9`` of a writer process. After each crash the reopened tier must hold
exactly the acknowledged state (the in-flight operation of a killed process may land whole or
not at all), every object checksum-verified, and its free space rebuilt without overlap."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.tiers.nvme import nvme_crash_writer as writer
from tests.tiers.nvme.test_nvme import assert_space_consistent, lease
from tiers.io.errors import EngineClosedError
from tiers.io.threaded import ThreadEngine
from tiers.nvme.nvme_tier import NvmeTier
from tiers.testing.faulty_engine import PowerCutAt
from tiers.testing.tier_contract import as_bytes

CAPACITY_BYTES = 256 * 1024
EXTENT_FILE_BYTES = 128 * 1024
Chains = dict[str, list[tuple[str, int]]]  # key -> its operations, run one after another


def _chains(seed: int) -> Chains:
    rng = random.Random(seed)
    return {
        f"k{i}": [
            ("delete", 0) if rng.random() < 0.25 else ("put", rng.randrange(0, 40_000))
            for _ in range(5)
        ]
        for i in range(5)
    }


def _value(seed: int, key: str, index: int, size: int) -> bytes:
    return np.random.default_rng([seed, int(key[1:]), index]).bytes(size)


async def _run_with_cut(directory: Path, seed: int, cut_at: int) -> tuple[dict[str, bytes], int]:
    """Run the chains of ``seed`` concurrently until the power cut; returns the acknowledged
    state and the number of engine batches issued."""
    engine = PowerCutAt(ThreadEngine(4), cut_at, seed=seed)
    acked: dict[str, bytes] = {}
    try:
        tier = await NvmeTier.open(
            "nvme",
            CAPACITY_BYTES,
            directory,
            runtime=lease(engine),
            extent_file_bytes=EXTENT_FILE_BYTES,
            create=True,
        )
    except EngineClosedError:  # the cut came while an extent file was being grown
        return acked, engine.batches

    async def chain(key: str, ops: list[tuple[str, int]]) -> None:
        for index, (kind, size) in enumerate(ops):
            try:
                if kind == "put":
                    value = _value(seed, key, index, size)
                    await tier.put(key, value)
                    acked[key] = value
                else:
                    await tier.delete(key)
                    acked.pop(key, None)
            except EngineClosedError:
                continue  # not acknowledged: the machine is dark (deletes still commit)

    await asyncio.gather(*(chain(key, ops) for key, ops in _chains(seed).items()))
    await tier.aclose()
    await engine.aclose()
    return acked, engine.batches


async def _verify(directory: Path, expected: dict[str, bytes]) -> None:
    tier = await NvmeTier.open(
        "nvme",
        CAPACITY_BYTES,
        directory,
        extent_file_bytes=EXTENT_FILE_BYTES,
        create=True,
    )
    try:
        assert set(tier.keys()) == set(expected)
        for key, value in expected.items():
            assert as_bytes(await tier.get(key)) == value  # get verifies every checksum
        assert_space_consistent(tier)
        for i in range(4):  # the rebuilt free space must not hand out a live extent
            await tier.put(f"after{i}", _value(0, "k9", i, 20_000))
        for key, value in expected.items():
            assert as_bytes(await tier.get(key)) == value
    finally:
        await tier.aclose()


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_power_cut_at_many_points_keeps_every_acknowledged_operation(
    tmp_path: Path, seed: int
) -> None:
    async def main() -> None:
        _, total = await _run_with_cut(tmp_path / "dry", seed, cut_at=10**9)
        rng = random.Random(seed)
        points = sorted({1, 5, total, *rng.sample(range(2, total), min(8, total - 2))})
        for cut_at in points:
            directory = tmp_path / f"cut{cut_at}"
            acked, _ = await _run_with_cut(directory, seed, cut_at)
            await _verify(directory, acked)

    asyncio.run(main())


# ----------------------------------------------------------------- kill -9 of a real writer
def _run_and_kill(directory: Path, seed: int, acks_before_kill: int, delay_s: float) -> list[int]:
    """Start the writer, kill -9 it after ``acks_before_kill`` acknowledgements (and a delay);
    returns how many operations each worker had acknowledged."""
    script = Path(writer.__file__)
    process = subprocess.Popen(
        [sys.executable, str(script), str(directory), str(seed)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None and process.stderr is not None
    lines: list[str] = []
    try:
        assert process.stdout.readline() == "ready\n", process.stderr.read()
        while len(lines) < acks_before_kill:
            line = process.stdout.readline()
            assert line, f"writer died: {process.stderr.read()}"
            lines.append(line)
        time.sleep(delay_s)
    finally:
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
    lines.extend(process.stdout.readlines())  # printed before the kill: acknowledged too
    process.stdout.close()
    process.stderr.close()
    acked = [0] * writer.WORKERS
    for line in lines:
        worker, index = map(int, line.split())
        assert index == acked[worker]  # each worker acknowledges in order
        acked[worker] += 1
    return acked


def _apply(
    state: dict[str, bytes | None], seed: int, worker: int, index: int, op: writer.Op
) -> None:
    kind, key, size = op
    state[key] = writer.payload(seed, worker, index, size) if kind == "put" else None


def _allowed_states(
    seed: int, acked: list[int], before: dict[str, bytes | None]
) -> dict[str, list[bytes | None]]:
    """Per key: the acknowledged state, or the state after the one operation in flight."""
    allowed: dict[str, list[bytes | None]] = {}
    for worker in range(writer.WORKERS):
        state = {f"w{worker}/k{k}": before.get(f"w{worker}/k{k}") for k in range(4)}
        ops = writer.schedule(seed, worker)
        for index in range(acked[worker]):
            _apply(state, seed, worker, index, ops[index])
        for key, value in state.items():
            allowed[key] = [value]
        if acked[worker] < len(ops):  # the operation that may have been in flight
            index = acked[worker]
            _apply(state, seed, worker, index, ops[index])
            key = ops[index][1]
            allowed[key].append(state[key])
    return allowed


def test_kill_9_of_a_writer_loses_no_acknowledged_object(tmp_path: Path) -> None:
    directory = tmp_path / "tier"
    rng = random.Random(1234)
    observed: dict[str, bytes | None] = {}
    for round_ in range(3):  # each writer reopens what the last one left
        seed = 100 + round_
        acked = _run_and_kill(directory, seed, rng.randint(3, 40), rng.uniform(0, 0.03))
        allowed = _allowed_states(seed, acked, observed)

        async def check(allowed: dict[str, list[bytes | None]] = allowed) -> None:
            tier = await NvmeTier.open(
                "nvme",
                writer.CAPACITY_BYTES,
                directory,
                extent_file_bytes=writer.EXTENT_FILE_BYTES,
                create=True,
            )
            try:
                assert set(tier.keys()) <= set(allowed)
                for key, options in allowed.items():
                    got = await tier.get(key)
                    observed[key] = None if got is None else as_bytes(got)
                    assert observed[key] in options, key
                assert_space_consistent(tier)
            finally:
                await tier.aclose()

        asyncio.run(check())
