"""kvstore.rag.context_stats: the per-token statistics stored with a chunk.

- scores round-trip through the header page (float16) and survive a reopen; a chunk stored
  without any has none and is ranked by position; a damaged header is never used;
- the alone deviation is ~0 for a chunk that nothing but the shared lead precedes (alone and
  in context are the same computation) and positive for chunks after other chunks (planted
  fault: a mask that hides nothing makes every score 0).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from kvstore.rag.chunk_cache import ChunkCache
from kvstore.rag.context_stats import (
    MAX_SCORED_TOKENS,
    decode_scores,
    encode_scores,
    positional_scores,
)
from kvstore.rag.errors import ChunkShapeError
from tests.kvstore.rag.test_chunk_cache import FP, _chunk

pytest.importorskip("transformers", reason="kvstore.rag needs transformers")

from kvstore.rag import assemble
from tests.kvstore.rag.test_assemble import _open as _open_for
from tests.kvstore.rag.test_assemble import _segments, model  # noqa: F401


def test_scores_encode_and_decode() -> None:
    scores = torch.rand(37) * 5
    back = decode_scores(encode_scores(scores), 37)
    assert back is not None and torch.equal(back, scores.half().float())
    assert encode_scores(torch.rand(MAX_SCORED_TOKENS + 1)) is None
    assert decode_scores(encode_scores(scores), 36) is None  # wrong length
    assert decode_scores("not base64!", 37) is None and decode_scores(None, 37) is None
    ramp = positional_scores(4)
    assert ramp[0] > ramp[1] > ramp[3] >= 0


def test_scores_survive_a_reopen_and_a_bad_header_is_never_used(tmp_path: Path) -> None:
    async def main() -> None:
        cache = await ChunkCache.open(tmp_path, FP, disk_bytes=1 << 20)
        ids, kv = _chunk(0, 20)
        bare_ids, bare_kv = _chunk(1, 20)
        scores = torch.linspace(0, 3, 20)
        with pytest.raises(ChunkShapeError):
            await cache.put(ids, kv, position=3, scores=torch.zeros(19))
        await cache.put(ids, kv, position=3, scores=scores)
        await cache.put(bare_ids, bare_kv, position=3)
        info = cache.lookup(ids)
        assert info is not None and torch.equal(info.scores, scores.half().float())  # type: ignore[arg-type]
        await cache.aclose()
        cache = await ChunkCache.open(tmp_path, FP, disk_bytes=1 << 20)
        try:
            info, bare = cache.lookup(ids), cache.lookup(bare_ids)
            assert info is not None and bare is not None and not info.scores_known
            found, got = await cache.scores(info)
            assert found and got is not None and torch.equal(got, scores.half().float())
            assert await cache.scores(bare) == (True, None)
        finally:
            await cache.aclose()
        _damage_header(tmp_path)
        cache = await ChunkCache.open(tmp_path, FP, disk_bytes=1 << 20)
        try:
            info = cache.lookup(ids)
            assert info is not None
            assert await cache.scores(info) == (False, None)
            assert cache.lookup(ids) is None  # dropped: recomputed, never used
        finally:
            await cache.aclose()

    asyncio.run(main())


def _damage_header(directory: Path) -> None:
    """Flip the bytes of the first header's scores field wherever the files hold it."""
    hits = 0
    for root, _, names in os.walk(directory):
        for name in names:
            with open(os.path.join(root, name), "r+b") as f:
                data = f.read()
                at = data.find(b'"scores": "')
                if at >= 0:
                    f.seek(at + 12)
                    f.write(bytes(b ^ 0x55 for b in data[at + 12 : at + 20]))
                    hits += 1
    assert hits >= 1


def test_alone_deviation_is_zero_only_where_nothing_precedes(
    model: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    async def main() -> None:
        cache = await _open_for(model, tmp_path)
        try:
            segments = _segments([0, 1, 2])
            await assemble(model, cache, segments, rule="attention")
            first, *later = (cache.lookup(s.token_ids) for s in segments[1:4])
            assert first is not None and first.scores is not None
            typical = max(float(c.scores.mean()) for c in later if c and c.scores is not None)
            assert typical > 0
            assert float(first.scores.abs().max()) < 1e-4 * typical  # alone == in context
            for chunk in later:
                assert chunk is not None and chunk.scores is not None
                assert float((chunk.scores > 0).float().mean()) > 0.9
        finally:
            await cache.aclose()

    asyncio.run(main())
