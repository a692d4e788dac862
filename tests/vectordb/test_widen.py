"""widen_float16 (torch's kernel when installed, numpy's otherwise) against numpy's conversion,
over every float16 bit pattern but inf/NaN and across the per-call step; PostingRead.vectors
of float16 lists equal the stored vectors widened by numpy."""

from __future__ import annotations

from contextlib import aclosing
from pathlib import Path

import numpy as np
import pytest

import vectordb.widen as widen
from tiers.io.engine import FileHandle, IOEngine
from tiers.io.factory import create_engine
from vectordb.posting_store import PostingItem, PostingStore


@pytest.mark.parametrize("use_torch", [True, False])
def test_every_finite_float16_widens_exactly(
    monkeypatch: pytest.MonkeyPatch, use_torch: bool
) -> None:
    if not use_torch:
        monkeypatch.setattr(widen, "_torch_checked", True)
        monkeypatch.setattr(widen, "_torch", None)
    elif widen._torch_module() is None:
        pytest.skip("torch is not installed")
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    finite = np.tile(bits[np.isfinite(bits)], 2)  # > one step of 32,768 values
    got = widen.widen_float16(finite)
    np.testing.assert_array_equal(got.view(np.uint32), finite.astype(np.float32).view(np.uint32))
    again = widen.widen_float16(finite[:10])
    assert again.base is got.base or again.base is got  # the scratch is reused


def test_float16_lists_come_back_widened(tmp_path: Path) -> None:
    import asyncio

    from tests.vectordb.test_posting_store import _open

    rng = np.random.default_rng(7)
    sizes = [5, 0, 33, 1, 12]
    written = {pid: rng.normal(size=(n, 10)).astype(np.float16) for pid, n in enumerate(sizes)}

    async def body(engine: IOEngine, file: FileHandle) -> None:
        store = PostingStore(engine, file, 10, "float16", 0)
        items = []
        for pid, vectors in written.items():
            ids = np.arange(len(vectors), dtype=np.int64) + 100 * pid
            items.append(PostingItem(pid, ids, np.ones(len(vectors), np.uint32), vectors))
        await store.write(items)
        read = store.begin_read(np.arange(len(sizes), dtype=np.int64), 2)
        async with aclosing(read.groups()) as groups:
            async for first, stop in groups:
                for offset, span in read.spans(first, stop):
                    assert span.values.dtype == np.float32
                    for i in range(len(span.counts)):
                        rows = span.first[i] + np.arange(span.counts[i])[:, None] * span.stride
                        vectors = span.values[rows + np.arange(span.dim)]
                        want = written[first + offset + i].astype(np.float32)
                        np.testing.assert_array_equal(vectors, want)

    async def main() -> None:
        engine = create_engine()
        try:
            await body(engine, await _open(engine, str(tmp_path / "p.dat")))
        finally:
            await engine.aclose()

    asyncio.run(main())
