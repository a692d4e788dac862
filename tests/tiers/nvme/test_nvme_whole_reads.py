"""get_many's compiled planner (tiers.nvme.plan_loop, tiers.nvme.whole_reads) and the catalog's
``rows`` mirror it reads: the planner against a plain Python model of "the common batch", the
tier against a dict model over random puts, deletes and destinations of every kind, and damage
planted in a batch read in place (the first key's error, as the general path raises it)."""

from __future__ import annotations

import asyncio
import itertools
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.tiers.nvme.helpers import flip_byte
from tiers.io.buffers import aligned_empty
from tiers.io.errors import CorruptionError, InvalidArgumentError
from tiers.nvme import whole_reads
from tiers.nvme.catalog import pack_row
from tiers.nvme.nvme_tier import NvmeTier
from tiers.nvme.plan_loop import NOT_COMMON, plan_whole
from tiers.nvme.space import FILE_STRIDE_BYTES
from tiers.testing.tier_contract import as_bytes

PAGE = 4096
_MAX = 1 << 30


def _data(size: int, seed: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()


def _model_plan(rows: list[tuple[int, ...]], dests: list[tuple[int, int]], bare_from: int) -> Any:
    """What plan_whole must return: the file index (and the rows) or NOT_COMMON."""
    file = rows[0][0]
    for (f, offset, size, _, version), (address, room) in zip(rows, dests, strict=True):
        if f != file or version < bare_from or not 0 < size <= _MAX or size % PAGE:
            return NOT_COMMON
        if offset < 0 or offset % PAGE or address % PAGE or room < size:
            return NOT_COMMON
    spans = sorted((address, row[2]) for row, (address, _) in zip(rows, dests, strict=True))
    if any(a + n > b for (a, n), (b, _) in itertools.pairwise(spans)):
        return NOT_COMMON
    return file


_row = st.tuples(
    st.sampled_from([0, 0, 0, 1]),  # file
    st.one_of(st.integers(0, 64).map(lambda p: p * PAGE), st.integers(-PAGE, 64 * PAGE)),
    st.one_of(st.integers(1, 4).map(lambda p: p * PAGE), st.integers(-1, 5 * PAGE)),  # size
    st.integers(0, 2**32 - 1),  # crc32
    st.integers(0, 9),  # version
)
_dest = st.tuples(
    st.one_of(st.integers(1, 40).map(lambda p: p * PAGE), st.integers(1, 40 * PAGE)),
    st.sampled_from([PAGE, 2 * PAGE, 4 * PAGE, PAGE - 1]),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_row, _dest), min_size=1, max_size=40), st.integers(0, 9))
def test_plan_whole_matches_a_model(pairs: list[Any], bare_from: int) -> None:
    rows = [row for row, _ in pairs]
    dests = [dest for _, dest in pairs]
    m = len(rows)
    flat = np.array(rows, np.int64).reshape(-1)
    offsets, lengths, crcs, pins = np.full((4, m), -7, np.int64)
    got = plan_whole(
        flat, np.array([a for a, _ in dests], np.int64), np.array([n for _, n in dests], np.int64),
        bare_from, PAGE, _MAX, FILE_STRIDE_BYTES, offsets, lengths, crcs, pins,
    )  # fmt: skip
    assert got == _model_plan(rows, dests, bare_from)
    if got != NOT_COMMON:
        assert offsets.tolist() == [r[1] for r in rows]
        assert lengths.tolist() == [r[2] for r in rows]
        assert crcs.tolist() == [r[3] for r in rows]
        assert pins.tolist() == [r[0] * FILE_STRIDE_BYTES + r[1] for r in rows]


def _destination(kind: str, size: int, pool: np.ndarray) -> Any:
    if kind == "aligned":
        return aligned_empty(max(size, 1))
    if kind == "unaligned":
        return np.zeros(size + 1, np.uint8)[1:]
    if kind == "shared":
        return pool[: max(size, 1)]  # every "shared" destination of a batch: the same bytes
    if kind == "bytearray":
        return bytearray(size)
    return None


_op = st.one_of(
    st.tuples(st.just("put"), st.integers(0, 7), st.sampled_from([PAGE, 2 * PAGE, 5000, 1])),
    st.tuples(st.just("delete"), st.integers(0, 7), st.just(0)),
    st.tuples(
        st.just("get"),
        st.lists(
            st.tuples(
                st.integers(0, 9),
                st.sampled_from(["aligned", "aligned", "unaligned", "shared", "bytearray", "none"]),
            ),
            min_size=1,
            max_size=12,
        ),
        st.just(0),
    ),
)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(_op, min_size=1, max_size=14))
def test_get_many_matches_a_dict_model(ops: list[Any]) -> None:
    async def main(path: str) -> None:
        tier = await NvmeTier.open("n", 4 << 20, path, create=True)
        model: dict[str, bytes] = {}
        pool = aligned_empty(4 * PAGE)
        for step, (op, arg, size) in enumerate(ops):
            if op == "put":
                model[f"k{arg}"] = _data(size, step)
                await tier.put(f"k{arg}", model[f"k{arg}"])
            elif op == "delete":
                assert await tier.delete(f"k{arg}") == (model.pop(f"k{arg}", None) is not None)
            else:
                keys = [f"k{i}" for i, _ in arg]
                into = [
                    _destination(kind, len(model.get(key, b"x" * PAGE)), pool)
                    for key, (_, kind) in zip(keys, arg, strict=True)
                ]
                got = await tier.get_many(keys, into=into)
                for key, value, out, (_, kind) in zip(keys, got, into, arg, strict=True):
                    if key not in model:
                        assert value is None
                    elif kind != "shared":
                        assert as_bytes(value)[: len(model[key])] == model[key]
                        assert out is None or value is out
                shared = [key for key, (_, kind) in zip(keys, arg, strict=True) if kind == "shared"]
                present = [key for key in shared if key in model]
                if present:  # copied in key order: the last one's bytes are what remains
                    last = model[present[-1]]
                    assert pool[: len(last)].tobytes() == last
            catalog = tier._catalog
            assert catalog is not None
            want = {k: pack_row(e) for k, e in catalog.entries.items() if not e.chunks}
            assert catalog.rows == want
        await tier.aclose()
        reopened = await NvmeTier.open("n", 4 << 20, path)
        assert reopened._catalog is not None and reopened._catalog.rows == catalog.rows
        await reopened.aclose()

    with tempfile.TemporaryDirectory() as path:
        asyncio.run(main(path))


def test_a_staged_destination_sharing_bytes_with_one_read_in_place(tmp_path: Path) -> None:
    """Found by the model above: a header record's destination overlapping a bare record's
    (read in place) was copied over it before the bare one was checked: a false CorruptionError.
    Now any overlap stages the whole batch, copied in key order."""

    async def main() -> None:
        tier = await NvmeTier.open("n", 1 << 20, tmp_path, create=True)
        await tier.put_many({"page": _data(PAGE, 0), "odd": _data(5000, 1)})
        pool = aligned_empty(2 * PAGE)
        for keys, into, last in (
            (["odd", "page"], [pool[:5000], pool[:PAGE]], _data(PAGE, 0)),
            (["page", "odd"], [pool[:PAGE], pool[:5000]], _data(5000, 1)),
            (["odd", "page"], [bytearray(5000), pool[:PAGE]], _data(PAGE, 0)),
        ):
            await tier.get_many(keys, into=into)
            assert pool[: len(last)].tobytes() == last
        assert tier.stats()["corruptions"] == 0
        await tier.aclose()

    asyncio.run(main())


def test_the_common_batch_takes_the_compiled_planner(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    served: list[bool] = []
    inner = whole_reads.read_whole

    async def spy(*args: Any) -> Any:
        got = await inner(*args)
        served.append(got is not None)
        return got

    monkeypatch.setattr("tiers.nvme.many_reads.read_whole", spy)

    async def main() -> None:
        tier = await NvmeTier.open("n", 1 << 20, tmp_path, create=True)
        values = {f"k{i}": _data(PAGE * (1 + i % 2), i) for i in range(6)}
        await tier.put_many(values)
        into = [aligned_empty(len(v)) for v in values.values()]
        got = await tier.get_many(values, into=into)
        assert [as_bytes(v) for v in got] == list(values.values())
        wide = aligned_empty(PAGE, dtype=np.float64)
        await tier.get_many(["k0", "k2"], into=[wide, aligned_empty(PAGE)])  # any dtype
        assert wide.tobytes() == values["k0"]
        shared = aligned_empty(PAGE)  # overlapping: the general planner copies in key order
        await tier.get_many(["k0", "k2"], into=[shared, shared])
        assert shared.tobytes() == values["k2"]
        read_only = aligned_empty(PAGE)
        read_only.flags.writeable = False  # the general planner raises the typed error
        with pytest.raises(InvalidArgumentError):
            await tier.get_many(["k0"], into=[read_only])
        assert served == [True, True, False, False]
        assert tier.stats()["hits"] == 10
        await tier.aclose()

    asyncio.run(main())


@pytest.mark.parametrize("bad", [[1], [1, 4]])
def test_damage_in_a_common_batch_raises_for_the_first_key(tmp_path: Path, bad: list[int]) -> None:
    async def main() -> None:
        tier = await NvmeTier.open("n", 1 << 20, tmp_path, create=True)
        values = {f"k{i}": _data(PAGE, i) for i in range(6)}
        await tier.put_many(values)
        for i in bad:
            flip_byte(tier, f"k{i}", 100 + i)
        into = [aligned_empty(PAGE) for _ in values]
        with pytest.raises(CorruptionError, match="checksum") as caught:
            await tier.get_many(values, into=into)
        located = tier.locate(f"k{bad[0]}")
        assert located is not None and caught.value.offset_bytes == located[1]
        assert tier.stats()["corruptions"] == 1
        got = await tier.get_many(["k0", "k2"], into=into[:2])  # other keys still read
        assert [as_bytes(v) for v in got] == [values["k0"], values["k2"]]
        await tier.aclose()

    asyncio.run(main())
