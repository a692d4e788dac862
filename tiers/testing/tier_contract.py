"""TierContract: the behaviour every Tier shares, as a test suite each tier's tests subclass.

    class TestDramTier(TierContract):
        async def make_tier(self, capacity_bytes: int, tmp_path: Path) -> Tier:
            return DramTier("dram", capacity_bytes)

The oracle is a plain dict of bytes. Each test drives its own event loop (tiers are loop-bound).
"""

from __future__ import annotations

import abc
import asyncio
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tiers.io.errors import CapacityError, InvalidArgumentError
from tiers.storage.tier import Tier

__all__ = ["TierContract", "as_bytes"]

T = TypeVar("T")
_PROPERTY = settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.differing_executors],
)


def as_bytes(buffer: Any) -> bytes:
    """Bytes of a tier result: numpy array or torch tensor (any device)."""
    if hasattr(buffer, "detach"):
        return buffer.detach().cpu().contiguous().view(-1).numpy().view(np.uint8).tobytes()
    return np.asarray(buffer).view(np.uint8).tobytes()


def _payload(size: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8)


class TierContract(abc.ABC):
    """Subclass and implement ``make_tier``."""

    @abc.abstractmethod
    async def make_tier(self, capacity_bytes: int, tmp_path: Path) -> Tier:
        """A new, empty tier of the kind under test (``tmp_path``: a fresh directory)."""

    def go(
        self, tmp_path: Path, body: Callable[[Tier], Awaitable[T]], capacity_bytes: int = 1 << 20
    ) -> T:
        # A fresh directory per tier: hypothesis runs many examples in one test function, all
        # with the same tmp_path, and a persistent tier must not reopen the last example's data.
        directory = Path(tempfile.mkdtemp(dir=tmp_path))

        async def main() -> T:
            tier = await self.make_tier(capacity_bytes, directory)
            try:
                return await body(tier)
            finally:
                await tier.aclose()

        return asyncio.run(main())

    def test_round_trip_and_missing_key(self, tmp_path: Path) -> None:
        data = _payload(10_000, 1)

        async def body(tier: Tier) -> None:
            assert await tier.get("absent") is None
            assert not await tier.contains("absent") and tier.size_of("absent") is None
            await tier.put("a", data)
            assert as_bytes(await tier.get("a")) == data.tobytes()
            assert await tier.contains("a") and tier.size_of("a") == 10_000
            assert tier.used_bytes == 10_000

        self.go(tmp_path, body)

    def test_into_and_byte_range(self, tmp_path: Path) -> None:
        data = _payload(50_000, 2)

        async def body(tier: Tier) -> None:
            await tier.put("k", data)
            out = np.zeros(60_000, np.uint8)
            assert (await tier.get("k", into=out)) is out
            assert out[:50_000].tobytes() == data.tobytes() and not out[50_000:].any()
            part = await tier.get("k", byte_range=(1234, 5000))
            assert as_bytes(part) == data[1234:6234].tobytes()
            small = np.zeros(100, np.uint8)
            await tier.get("k", into=small, byte_range=(49_900, 100))
            assert small.tobytes() == data[49_900:].tobytes()
            with pytest.raises(InvalidArgumentError):
                await tier.get("k", into=np.zeros(10, np.uint8))
            with pytest.raises(InvalidArgumentError):
                await tier.get("k", byte_range=(49_000, 2000))

        self.go(tmp_path, body)

    def test_accepts_bytes_and_torch_tensors(self, tmp_path: Path) -> None:
        torch = pytest.importorskip("torch")
        tensor = torch.arange(1000, dtype=torch.float32)

        async def body(tier: Tier) -> None:
            await tier.put("b", b"hello tiers")
            await tier.put("t", tensor)
            assert as_bytes(await tier.get("b")) == b"hello tiers"
            assert as_bytes(await tier.get("t")) == tensor.numpy().tobytes()
            into = torch.zeros(1000, dtype=torch.float32)
            await tier.get("t", into=into)
            assert torch.equal(into, tensor)

        self.go(tmp_path, body)

    def test_overwrite_delete_and_keys(self, tmp_path: Path) -> None:
        async def body(tier: Tier) -> None:
            await tier.put("x/1", b"a" * 100)
            await tier.put("x/2", b"b" * 200)
            await tier.put("y/1", b"c" * 300)
            await tier.put("x/1", b"d" * 50)  # overwrite shrinks the charge
            assert tier.used_bytes == 550
            assert as_bytes(await tier.get("x/1")) == b"d" * 50
            assert sorted(tier.keys("x/")) == ["x/1", "x/2"]
            assert await tier.delete("x/2") and not await tier.delete("x/2")
            assert tier.used_bytes == 350 and sorted(tier.keys()) == ["x/1", "y/1"]

        self.go(tmp_path, body)

    def test_delete_many(self, tmp_path: Path) -> None:
        async def body(tier: Tier) -> None:
            await tier.put_many({f"d/{i}": _payload(1000 + i, i) for i in range(5)})
            assert await tier.delete_many(["d/1", "absent", "d/3", "d/1"]) == 2
            assert sorted(tier.keys("d/")) == ["d/0", "d/2", "d/4"]
            assert tier.used_bytes == 1000 + 1002 + 1004
            assert await tier.get("d/3") is None and await tier.delete_many([]) == 0
            await tier.put("d/3", b"back")  # its space is free again
            assert as_bytes(await tier.get("d/3")) == b"back"

        self.go(tmp_path, body)

    def test_capacity_error_leaves_the_tier_unchanged(self, tmp_path: Path) -> None:
        async def body(tier: Tier) -> None:
            await tier.put("a", _payload(40_000, 3))
            with pytest.raises(CapacityError):
                await tier.put("b", _payload(30_000, 4))
            with pytest.raises(CapacityError):
                await tier.put("a", _payload(70_000, 5))
            assert tier.used_bytes == 40_000 and sorted(tier.keys()) == ["a"]
            assert as_bytes(await tier.get("a")) == _payload(40_000, 3).tobytes()
            await tier.delete("a")
            await tier.put("c", _payload(64_000, 6))  # the freed space is reused
            assert tier.used_bytes == 64_000

        self.go(tmp_path, body, capacity_bytes=64 * 1024)

    def test_bad_keys_and_values(self, tmp_path: Path) -> None:
        async def body(tier: Tier) -> None:
            for key in ("", "k" * 600, 5):
                with pytest.raises(InvalidArgumentError):
                    await tier.put(key, b"x")  # type: ignore[arg-type]
            with pytest.raises(InvalidArgumentError):
                await tier.put("k", object())

        self.go(tmp_path, body)

    def test_empty_object(self, tmp_path: Path) -> None:
        async def body(tier: Tier) -> None:
            await tier.put("e", b"")
            got = await tier.get("e")
            assert got is not None and as_bytes(got) == b""
            assert tier.size_of("e") == 0

        self.go(tmp_path, body)

    def test_concurrent_puts_and_gets(self, tmp_path: Path) -> None:
        payloads = {f"k{i}": _payload(3000 + i, i) for i in range(40)}

        async def body(tier: Tier) -> None:
            await asyncio.gather(*(tier.put(k, v) for k, v in payloads.items()))
            results = await asyncio.gather(*(tier.get(k) for k in payloads))
            for (_, value), got in zip(payloads.items(), results, strict=True):
                assert as_bytes(got) == value.tobytes()

        self.go(tmp_path, body)

    @_PROPERTY
    @given(
        st.lists(
            st.tuples(
                st.sampled_from(["put", "get", "delete"]),
                st.sampled_from([f"k{i}" for i in range(6)]),
                st.integers(0, 20_000),
            ),
            max_size=40,
        )
    )
    def test_matches_a_dict(self, tmp_path: Path, ops: list[tuple[str, str, int]]) -> None:
        capacity = 48 * 1024

        async def body(tier: Tier) -> None:
            model: dict[str, bytes] = {}
            for step, (op, key, size) in enumerate(ops):
                if op == "put":
                    value = _payload(size, step).tobytes()
                    used_after = sum(len(v) for k, v in model.items() if k != key) + size
                    try:
                        await tier.put(key, value)
                        model[key] = value
                    except CapacityError:
                        assert used_after > capacity * 0.5  # refused only when nearly full
                elif op == "get":
                    got = await tier.get(key)
                    assert (got is None) == (key not in model)
                    if got is not None:
                        assert as_bytes(got) == model[key]
                else:
                    assert await tier.delete(key) == (key in model)
                    model.pop(key, None)
                assert tier.used_bytes == sum(len(v) for v in model.values())
                assert set(tier.keys()) == set(model)

        self.go(tmp_path, body, capacity_bytes=capacity)

    def test_get_many_and_put_many(self, tmp_path: Path) -> None:
        values = {f"m{i}": _payload(1000 * i + 4096 * (i % 2), 100 + i) for i in range(6)}

        async def body(tier: Tier) -> None:
            await tier.put_many(values)
            assert tier.used_bytes == sum(v.nbytes for v in values.values())
            keys = ["m3", "absent", "m0", "m5", "m3"]
            got = await tier.get_many(keys)
            assert got[1] is None and len(got) == len(keys)
            for key, value in zip(keys, got, strict=True):
                if key in values:
                    assert as_bytes(value) == values[key].tobytes()
            outs = [np.zeros(10_000, np.uint8) for _ in keys]
            filled = await tier.get_many(keys, into=outs)
            assert filled[0] is outs[0] and filled[1] is None
            assert outs[3][: values["m5"].nbytes].tobytes() == values["m5"].tobytes()
            with pytest.raises(InvalidArgumentError):
                await tier.get_many(keys, into=outs[:2])
            with pytest.raises(InvalidArgumentError):  # a destination too small, before any I/O
                await tier.get_many(["m5"], into=[np.zeros(10, np.uint8)])
            await tier.put_many([("m0", b"first"), ("m0", b"second"), ("m9", b"")])
            assert as_bytes(await tier.get("m0")) == b"second"
            assert (await tier.get_many([])) == []

        self.go(tmp_path, body)

    def test_put_many_that_cannot_fit_changes_nothing(self, tmp_path: Path) -> None:
        async def body(tier: Tier) -> None:
            await tier.put("a", _payload(30_000, 1))
            with pytest.raises(CapacityError):
                await tier.put_many({"a": _payload(50_000, 2), "b": _payload(30_000, 3)})
            assert as_bytes(await tier.get("a")) == _payload(30_000, 1).tobytes()
            assert tier.size_of("b") is None and tier.used_bytes == 30_000

        self.go(tmp_path, body, capacity_bytes=64 * 1024)

    @_PROPERTY
    @given(
        st.lists(
            st.tuples(
                st.sampled_from(["put_many", "get_many", "delete"]),
                st.lists(
                    st.tuples(st.sampled_from([f"k{i}" for i in range(6)]), st.integers(0, 9000)),
                    max_size=5,
                ),
            ),
            max_size=25,
        )
    )
    def test_batches_match_a_dict(
        self, tmp_path: Path, ops: list[tuple[str, list[tuple[str, int]]]]
    ) -> None:
        async def body(tier: Tier) -> None:
            model: dict[str, bytes] = {}
            for step, (op, pairs) in enumerate(ops):
                keys = [key for key, _ in pairs]
                if op == "put_many":
                    items = [
                        (k, _payload(n, 1000 * step + i).tobytes())
                        for i, (k, n) in enumerate(pairs)
                    ]
                    await tier.put_many(items)
                    model.update(items)
                elif op == "get_many":
                    sizes = [max(1, len(model.get(k, b""))) for k in keys]
                    outs = [np.zeros(n, np.uint8) for n in sizes] if step % 2 else None
                    got = await tier.get_many(keys, into=outs)
                    assert len(got) == len(keys)
                    for key, value in zip(keys, got, strict=True):
                        assert (value is None) == (key not in model)
                        if value is not None:
                            assert as_bytes(value)[: len(model[key])] == model[key]
                else:
                    for key in keys:
                        assert await tier.delete(key) == (key in model)
                        model.pop(key, None)
                assert tier.used_bytes == sum(len(v) for v in model.values())
                assert set(tier.keys()) == set(model)

        self.go(tmp_path, body, capacity_bytes=1 << 20)
