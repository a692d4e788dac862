"""Exact segments: a chunk stored after the same tokens at the same position is reused with
no check and no recompute, and only such chunks are marked so.

- blend_prefill never runs, checks or picks an ``exact`` token, and the fraction counts the
  other reused tokens only;
- a prompt assembled again in the order it was stored computes its question alone, at any
  fraction below 1 and with every rule, and gives the full prefill's logits;
- a moved prompt keeps its leading run exact (the system text and a first chunk that stays
  first) and treats the rest as moved;
- a chunk computed after an approximately reused one is stored without a context, so it is
  never taken for exact later.

The model is a random 3-layer Llama: exactness needs no trained weights.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("transformers", reason="kvstore.rag needs transformers")

from kvstore.rag import assemble, blend_prefill
from kvstore.rag.assemble import RULES
from kvstore.rag.errors import RagArgumentError
from tests.kvstore.rag.test_assemble import TOL, _full, _open, _segments, model  # noqa: F401


def test_blend_never_runs_exact_tokens(model: Any) -> None:  # noqa: F811
    ids = torch.randint(3, 1000, (1, 40), generator=torch.Generator().manual_seed(1))
    full = _full(model, ids)
    layers = full.past_key_values.layers
    stored = [torch.stack((layer.keys[0], layer.values[0])) for layer in layers]
    reused = torch.zeros(40, dtype=torch.bool)
    reused[:30] = True
    exact = torch.zeros(40, dtype=torch.bool)
    exact[:10] = True
    result = blend_prefill(model, ids, reused, lambda layer: stored[layer],
                           recompute_fraction=0.5, exact=exact)  # fmt: skip
    assert result.recomputed.numel() == 10  # half of the 20 non-exact reused tokens
    assert bool((result.recomputed >= 10).all())
    # layer 0 for the 30 tokens that run below the check, 20 projections, then 10 + 10
    assert result.tokens_computed < (30 + 20 * 0.2 + 2 * 20) / 3
    torch.testing.assert_close(result.logits, full.logits[:, -1], **TOL)  # all KV was exact
    everything = blend_prefill(model, ids, reused, lambda layer: stored[layer],
                               recompute_fraction=1.0, exact=exact)  # fmt: skip
    assert torch.equal(everything.logits, full.logits[:, -1])  # 1.0 runs every token
    with pytest.raises(RagArgumentError, match="exact"):
        blend_prefill(model, ids, exact, lambda layer: stored[layer],
                      recompute_fraction=0.5, exact=reused)  # fmt: skip


@pytest.mark.parametrize("rule", RULES)
def test_the_stored_order_computes_the_question_alone(
    model: Any,  # noqa: F811
    tmp_path: Path,
    rule: str,
) -> None:
    async def main() -> None:
        cache = await _open(model, tmp_path)
        try:
            first = await assemble(model, cache, _segments([0, 1, 2]))
            assert first.stored_chunks == 4 and first.reused_tokens == 0
            for fraction in (0.0, 0.5):
                again = await assemble(model, cache, _segments([0, 1, 2]),
                                       recompute_fraction=fraction, rule=rule)  # fmt: skip
                n = again.input_ids.shape[1]
                assert again.reused_tokens == again.exact_tokens == n - 9
                assert again.tokens_computed == 9  # the question through every layer
                full = _full(model, again.input_ids).logits[:, -1]
                torch.testing.assert_close(again.logits, full, **TOL)
        finally:
            await cache.aclose()

    asyncio.run(main())


def test_a_moved_prompt_keeps_its_leading_run_exact(model: Any, tmp_path: Path) -> None:  # noqa: F811
    async def main() -> None:
        cache = await _open(model, tmp_path)
        try:
            await assemble(model, cache, _segments([0, 1, 2]))
            segments = _segments([0, 2, 1])
            moved = await assemble(model, cache, segments, recompute_fraction=0.0)
            leading = len(segments[0].token_ids) + len(segments[1].token_ids)
            assert moved.exact_tokens == leading
            assert moved.reused_tokens == moved.input_ids.shape[1] - 9
            # no exact run: chunk 2 first, so only the system text is exact
            other = await assemble(model, cache, _segments([2, 0]), recompute_fraction=0.0)
            assert other.exact_tokens == len(segments[0].token_ids)
        finally:
            await cache.aclose()

    asyncio.run(main())


def test_chunks_after_approximate_reuse_are_stored_without_context(
    model: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    async def main() -> None:
        cache = await _open(model, tmp_path)
        try:
            await assemble(model, cache, _segments([0, 1]))
            segments = _segments([1, 3])  # chunk 1 moved (approximate), chunk 3 new after it
            await assemble(model, cache, segments, recompute_fraction=0.0)
            after = cache.lookup(segments[2].token_ids)
            assert after is not None and after.context is None
            first = cache.lookup(_segments([0])[1].token_ids)
            assert first is not None and first.context is not None
            again = await assemble(model, cache, segments, recompute_fraction=0.0)
            assert again.exact_tokens == len(segments[0].token_ids)  # the system text only
            # at fraction 1.0 every token is computed: what it stores is exact
            fresh = _segments([3, 2])
            await assemble(model, cache, fresh, recompute_fraction=1.0)
            stored = cache.lookup(fresh[2].token_ids)
            assert stored is not None and stored.context is not None
        finally:
            await cache.aclose()

    asyncio.run(main())
