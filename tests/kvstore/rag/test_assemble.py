"""kvstore.rag.assemble and blend: a prompt of cached chunks prefilled with selective recompute.

- fraction 1.0 is a full prefill: KV and logits bit-identical to ``model(ids,
  logits_to_keep=1)`` (the same operations in the same order);
- chunks reused where and beside what they were computed give the full prefill's logits at
  fraction 0 (to float32 rounding: ``rtol=atol=1e-4``, measured ~1e-6);
- reuse at new positions computes fewer tokens, and more recompute moves the logits closer to
  the full prefill;
- a corrupt stored chunk is recomputed, never used; hits survive a restart.

The model is a random 3-layer Llama: exactness needs no trained weights.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("transformers", reason="kvstore.rag needs transformers")

from kvstore.hf_cache import fingerprint_for
from kvstore.rag import ChunkCache, Segment, assemble, blend_prefill, generate
from kvstore.rag.assemble import RULES
from kvstore.rag.errors import RagArgumentError
from tests.kvstore.rag.test_chunk_cache import flip_bytes_of

TOL = {"rtol": 1e-4, "atol": 1e-4}


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from transformers import AutoModelForCausalLM

    from kvstore.testing import make_tiny_llama

    directory = make_tiny_llama(str(tmp_path_factory.mktemp("llama3")), num_layers=3)
    return AutoModelForCausalLM.from_pretrained(directory).eval()


def _segments(order: list[int], seed: int = 0) -> list[Segment]:
    generator = torch.Generator().manual_seed(seed)
    system = Segment(tuple(torch.randint(3, 1000, (12,), generator=generator).tolist()))
    chunks = [
        Segment(tuple(torch.randint(3, 1000, (20 + 7 * i,), generator=generator).tolist()))
        for i in range(4)
    ]
    question = Segment(tuple(torch.randint(3, 1000, (9,), generator=generator).tolist()), False)
    return [system, *(chunks[i] for i in order), question]


def _full(model: Any, ids: torch.Tensor) -> Any:
    with torch.no_grad():
        return model(input_ids=ids, use_cache=True, logits_to_keep=1)


async def _open(model: Any, path: Path) -> ChunkCache:
    return await ChunkCache.open(path, fingerprint_for(model, 1), disk_bytes=8 << 20)


@pytest.mark.parametrize("rule", RULES)
def test_fraction_one_is_a_full_prefill(model: Any, tmp_path: Path, rule: str) -> None:
    async def main() -> None:
        cache = await _open(model, tmp_path)
        try:
            await assemble(model, cache, _segments([0, 1, 2, 3]))
            result = await assemble(
                model, cache, _segments([3, 1, 0]), recompute_fraction=1.0, rule=rule
            )
            full = _full(model, result.input_ids)
            assert torch.equal(result.logits, full.logits[:, -1])
            for ours, theirs in zip(result.cache.layers, full.past_key_values.layers, strict=True):
                assert torch.equal(ours.keys, theirs.keys)
                assert torch.equal(ours.values, theirs.values)
            assert result.tokens_computed == result.input_ids.shape[1]
        finally:
            await cache.aclose()

    asyncio.run(main())


def test_reuse_in_the_same_context_is_exact_at_fraction_zero(model: Any, tmp_path: Path) -> None:
    async def main() -> None:
        cache = await _open(model, tmp_path)
        try:
            first = await assemble(model, cache, _segments([0, 1, 2]))
            assert first.stored_chunks == 4 and first.reused_tokens == 0  # system + 3 chunks
            again = await assemble(model, cache, _segments([0, 1, 2]), recompute_fraction=0.0)
            n = again.input_ids.shape[1]
            assert again.reused_tokens == n - 9
            torch.testing.assert_close(again.logits, first.logits, **TOL)
            # stored after the same tokens at the same positions: exact, so only the
            # question runs (test_exact_reuse has the rest)
            assert again.tokens_computed == 9
        finally:
            await cache.aclose()

    asyncio.run(main())


def test_moved_chunks_recompute_brings_logits_closer(model: Any, tmp_path: Path) -> None:
    async def main() -> None:
        cache = await _open(model, tmp_path)
        try:
            for order in ([0, 1, 2, 3], [3, 2, 1, 0]):
                await assemble(model, cache, _segments(order))
            errors, computed = [], []
            for fraction in (0.0, 0.3, 1.0):
                result = await assemble(model, cache, _segments([2, 0, 3]),
                                        recompute_fraction=fraction)  # fmt: skip
                full = _full(model, result.input_ids).logits[:, -1]
                errors.append(float((result.logits - full).abs().max()))
                computed.append(result.tokens_computed)
            assert errors[0] > 1e-3  # reuse at new neighbours is not exact ...
            assert errors[2] == 0.0  # ... full recompute is
            assert computed[0] < computed[1] < computed[2]
        finally:
            await cache.aclose()

    asyncio.run(main())


def test_a_corrupt_chunk_is_recomputed_not_used(model: Any, tmp_path: Path) -> None:
    async def main() -> None:
        segments = _segments([1])
        cache = await _open(model, tmp_path)
        await assemble(model, cache, segments)
        info = cache.lookup(segments[1].token_ids)
        assert info is not None
        stored = await cache.load(info)
        await cache.aclose()
        flip_bytes_of(tmp_path, stored)  # type: ignore[arg-type]
        cache = await _open(model, tmp_path)  # a restart: hits come from disk
        try:
            result = await assemble(model, cache, segments, recompute_fraction=0.0)
            assert cache.stats()["corrupt"] == 1
            assert result.reused_tokens == len(segments[0].token_ids)  # the system text only
            assert result.stored_chunks == 1  # the damaged chunk, computed again
            full = _full(model, result.input_ids)
            torch.testing.assert_close(result.logits, full.logits[:, -1], **TOL)
            healed = await assemble(model, cache, segments, recompute_fraction=0.0)
            assert healed.reused_tokens == result.input_ids.shape[1] - 9
        finally:
            await cache.aclose()

    asyncio.run(main())


def test_generate_from_an_assembled_prompt(model: Any, tmp_path: Path) -> None:
    async def main() -> None:
        cache = await _open(model, tmp_path)
        try:
            await assemble(model, cache, _segments([0, 1]))
            result = await assemble(model, cache, _segments([1, 0]), recompute_fraction=1.0)
            ours = generate(model, result, max_new_tokens=8)
            plain = model.generate(result.input_ids, max_new_tokens=8, do_sample=False,
                                   attention_mask=torch.ones_like(result.input_ids))  # fmt: skip
            assert torch.equal(ours, plain)
        finally:
            await cache.aclose()

    asyncio.run(main())


def test_bad_prompts_are_errors(model: Any, tmp_path: Path) -> None:
    async def main() -> None:
        cache = await _open(model, tmp_path)
        try:
            with pytest.raises(RagArgumentError, match="last segment"):
                await assemble(model, cache, _segments([0])[:-1])
            with pytest.raises(RagArgumentError, match="rule"):
                await assemble(model, cache, _segments([0]), rule="lru")
        finally:
            await cache.aclose()
        ids = torch.arange(3, 13).unsqueeze(0)
        reused = torch.ones(10, dtype=torch.bool)
        with pytest.raises(RagArgumentError, match="last token"):
            blend_prefill(model, ids, reused, lambda layer: torch.zeros(0),
                          recompute_fraction=0.5)  # fmt: skip
        with pytest.raises(RagArgumentError, match="recompute_fraction"):
            blend_prefill(model, ids, reused, lambda layer: torch.zeros(0),
                          recompute_fraction=1.5)  # fmt: skip

    asyncio.run(main())


def test_reused_keys_are_rotated_to_their_new_offsets(model: Any, tmp_path: Path) -> None:
    """assemble at fraction 0 equals blend_prefill over the stored chunks' KV moved by hand
    (RopeRotator is tested against fresh computations in test_rope)."""
    from kvstore.rag import RopeRotator

    async def main() -> None:
        cache = await _open(model, tmp_path)
        try:
            await assemble(model, cache, _segments([0, 1, 2, 3]))
            segments = _segments([3, 0])
            result = await assemble(model, cache, segments, recompute_fraction=0.0)
            rotator, n = RopeRotator(model), result.input_ids.shape[1]
            layers = torch.zeros((3, 2, 2, n, 32))
            reused, offset = torch.zeros(n, dtype=torch.bool), 0
            for segment in segments[:-1]:
                info = cache.lookup(segment.token_ids)
                assert info is not None
                kv = await cache.load(info)
                assert kv is not None
                end = offset + info.num_tokens
                layers[:, 0, :, offset:end] = rotator.shift(kv[:, 0], info.position, offset)
                layers[:, 1, :, offset:end] = kv[:, 1]
                reused[offset:end] = True
                offset = end
            expected = blend_prefill(model, result.input_ids, reused, lambda layer: layers[layer],
                                     recompute_fraction=0.0)  # fmt: skip
            assert torch.equal(result.logits, expected.logits)
        finally:
            await cache.aclose()

    asyncio.run(main())


def computed_bound(n: int) -> float:
    """Work at fraction 0 on the 3-layer model: at most layer 0 for all, the check's
    projections (~10% of a layer) and the 9-token question through the other layers."""
    return (n + 0.15 * n + 2 * 9) / 3


def test_cheaper_rules_compute_less(model: Any, tmp_path: Path) -> None:
    """At one fraction: chunk-start (no check) < hybrid (check on candidates) < deviation
    (check on all) in work. (Which is closest to a full prefill is a property of a trained
    model, measured by benchmarks.rag.chunks; on random weights none is reliably closer.)"""

    async def main() -> None:
        cache = await _open(model, tmp_path)
        try:
            for order in ([0, 1, 2, 3], [3, 2, 1, 0]):
                await assemble(model, cache, _segments(order))
            segments = _segments([2, 0, 3])
            for rule in RULES:  # pure reuse: only the question and the layer-0 check run
                zero = await assemble(model, cache, segments, recompute_fraction=0.0, rule=rule)
                assert zero.tokens_computed < computed_bound(zero.input_ids.shape[1])
            computed = {}
            for rule in RULES:
                result = await assemble(model, cache, segments, recompute_fraction=0.3, rule=rule)
                computed[rule] = result.tokens_computed
            assert computed["chunk-start"] < computed["hybrid"] < computed["deviation"]
        finally:
            await cache.aclose()

    asyncio.run(main())


def test_a_failing_load_raises_instead_of_hanging(model: Any, tmp_path: Path) -> None:
    """A load that fails with an I/O error (planted on layer 2) reaches the caller; the
    forward pass waiting for that layer in its thread is released, not left waiting."""
    from tiers import StorageError

    async def main() -> None:
        cache = await _open(model, tmp_path)
        try:
            await assemble(model, cache, _segments([0, 1]))
            real = cache.load_layer

            async def failing(info: Any, layer: int) -> Any:
                if layer == 2:
                    raise StorageError(5, "planted: the device went away")
                return await real(info, layer)

            cache.load_layer = failing  # type: ignore[method-assign]
            with pytest.raises(StorageError, match="planted"):
                await asyncio.wait_for(assemble(model, cache, _segments([1, 0])), 60)
        finally:
            await cache.aclose()

    asyncio.run(main())
