"""NvmeTier.get of a whole bare record as the engine's own single read (tiers.nvme.single_reads):
concurrent gets against a dict model over random puts, deletes and destinations of every kind
(bare and header records, byte ranges, both engines), the path taken where it should be, damage
detected before any byte reaches the caller, and a cancelled get that leaves its buffer alone."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.tiers.nvme.helpers import flip_byte
from tiers.io import IORuntime
from tiers.io.buffers import aligned_empty
from tiers.io.errors import CorruptionError
from tiers.nvme import single_reads
from tiers.nvme.nvme_tier import NvmeTier
from tiers.testing.tier_contract import as_bytes

PAGE = 4096


def _data(size: int, seed: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()


def _destination(kind: str, size: int) -> Any:
    if kind == "aligned":
        return aligned_empty(max(size, 1))
    if kind == "unaligned":
        return np.zeros(size + 1, np.uint8)[1:]
    if kind == "bytearray":
        return bytearray(size)
    return None


_get = st.tuples(
    st.integers(0, 7),
    st.sampled_from(["aligned", "unaligned", "unaligned", "bytearray", "none"]),
    st.booleans(),  # a byte range (the gathered path) instead of the whole object
)
_op = st.one_of(
    st.tuples(st.just("put"), st.integers(0, 7), st.sampled_from([PAGE, 3 * PAGE, 5000, 1])),
    st.tuples(st.just("delete"), st.integers(0, 7), st.just(0)),
    st.tuples(st.just("gets"), st.lists(_get, min_size=1, max_size=10), st.just(0)),
)


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(_op, min_size=1, max_size=12), st.sampled_from(["uring", "thread"]))
def test_concurrent_gets_match_a_dict_model(ops: list[Any], engine: str) -> None:
    async def main(path: str) -> None:
        runtime = IORuntime(engine=engine)
        tier = await NvmeTier.open("n", 4 << 20, path, runtime=runtime, create=True)
        assert tier._singles_engine == (engine == "uring")
        model: dict[str, bytes] = {}
        for step, (op, arg, size) in enumerate(ops):
            if op == "put":
                model[f"k{arg}"] = _data(size, step)
                await tier.put(f"k{arg}", model[f"k{arg}"])
            elif op == "delete":
                assert await tier.delete(f"k{arg}") == (model.pop(f"k{arg}", None) is not None)
            else:
                calls = []
                for index, kind, ranged in arg:
                    key = f"k{index}"
                    size = len(model.get(key, b"x" * PAGE))
                    span = (1, size - 1) if ranged and size > 1 else None
                    into = _destination(kind, size)
                    calls.append((key, span, into))
                got = await asyncio.gather(
                    *(tier.get(key, into=into, byte_range=span) for key, span, into in calls)
                )
                for (key, span, into), value in zip(calls, got, strict=True):
                    if key not in model:
                        assert value is None
                        continue
                    want = model[key] if span is None else model[key][1:-1]
                    assert as_bytes(value)[: len(want)] == want
                    assert into is None or value is into
        stats = tier.stats()
        assert stats["corruptions"] == 0
        assert stats["gets"] == stats["hits"] + stats["misses"]
        await tier.aclose()
        runtime.close()

    with tempfile.TemporaryDirectory() as path:
        asyncio.run(main(path))


def test_bare_gets_take_the_single_path_and_others_the_gathered_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    served: list[int] = []
    inner = single_reads.read_bare

    async def spy(*args: Any) -> Any:
        served.append(args[3])  # size_bytes
        return await inner(*args)

    monkeypatch.setattr("tiers.nvme.reads.read_bare", spy)

    async def main() -> None:
        tier = await NvmeTier.open("n", 1 << 20, tmp_path, create=True)
        await tier.put_many({"page": _data(PAGE, 0), "two": _data(2 * PAGE, 1), "odd": _data(5, 2)})
        out = np.empty(2 * PAGE, np.uint8)
        assert as_bytes(await tier.get("two", into=out)) == _data(2 * PAGE, 1)
        assert as_bytes(await tier.get("page")) == _data(PAGE, 0)
        assert as_bytes(await tier.get("odd")) == _data(5, 2)  # a header record: gathered
        assert as_bytes(await tier.get("two", byte_range=(1, 2))) == _data(2 * PAGE, 1)[1:3]
        assert await tier.get("absent") is None
        assert served == [2 * PAGE, PAGE]
        await tier.aclose()

    asyncio.run(main())


def test_damage_is_raised_before_any_byte_reaches_the_caller(tmp_path: Path) -> None:
    async def main() -> None:
        tier = await NvmeTier.open("n", 1 << 20, tmp_path, create=True, direct=True)
        await tier.put_many({"a": _data(2 * PAGE, 0), "b": _data(PAGE, 1)})
        flip_byte(tier, "a", PAGE + 17)
        out = np.full(2 * PAGE, 7, np.uint8)
        with pytest.raises(CorruptionError, match="checksum"):
            await tier.get("a", into=out)
        assert (out == 7).all()  # the copy comes only after the check
        with pytest.raises(CorruptionError):
            await tier.get("a")
        assert as_bytes(await tier.get("b", into=out))[:PAGE] == _data(PAGE, 1)  # it goes on
        assert tier.stats()["corruptions"] == 2
        await tier.aclose()

    asyncio.run(main())


def test_a_cancelled_get_leaves_its_buffer_alone(tmp_path: Path) -> None:
    async def main() -> None:
        tier = await NvmeTier.open("n", 8 << 20, tmp_path, create=True, direct=True)
        values = {f"k{i}": _data(64 << 10, i) for i in range(16)}
        await tier.put_many(values)
        outs = [np.full(64 << 10, 9, np.uint8) for _ in values]
        tasks = [
            asyncio.ensure_future(tier.get(key, into=out))
            for key, out in zip(values, outs, strict=True)
        ]
        await asyncio.sleep(0)  # the reads are submitted, not yet landed
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.sleep(0.05)  # every read has landed by now
        for task, out in zip(tasks, outs, strict=True):
            if task.cancelled():
                assert (out == 9).all()
        for key, value in values.items():  # nothing stuck: pins released, buffers sound
            assert as_bytes(await tier.get(key)) == value
        assert tier.stats()["corruptions"] == 0
        await tier.aclose()

    asyncio.run(main())


def test_the_switch_sends_every_get_to_the_gathered_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TIERKIT_NVME_SINGLE_GETS", "0")  # read at start: for in-process A/Bs

    async def main() -> None:
        tier = await NvmeTier.open("n", 1 << 20, tmp_path, create=True)
        assert not tier._singles_engine
        await tier.put("page", _data(PAGE, 3))
        assert as_bytes(await tier.get("page")) == _data(PAGE, 3)
        await tier.aclose()

    asyncio.run(main())
