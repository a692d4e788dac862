"""kvstore.hf: a prefix restored from a real KVBlockStore gives the logits of a full run.

Tolerances: the tiny Llama runs in float32; the restored run differs from the full run only
in how the attention over the same K/V is split into matmuls, so logits agree to float32
rounding: ``assert_close(rtol=1e-5, atol=1e-5)`` (measured max |diff| ~3e-6 on logits up to
~4). The restored K/V themselves are bit-identical to the full run's.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("transformers", reason="kvstore.hf needs transformers")

from kvstore.block_store import KVBlockStore
from kvstore.fingerprint import ModelFingerprint
from kvstore.hf import fingerprint_for, kivi_logit_error, prefill, prefill_sync
from kvstore.hf_cache import blocks_from_cache
from kvstore.kivi import KiviCodec
from kvstore.sync_store import SyncKVBlockStore
from kvstore.testing import make_tiny_llama

BLOCK_TOKENS = 32
DISK_BYTES = 16 << 20
TOL = {"rtol": 1e-5, "atol": 1e-5}


@pytest.fixture(scope="module")
def model(tiny_llama_dir: str) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_llama_dir).eval()


@pytest.fixture(scope="module")
def fingerprint(model: Any) -> ModelFingerprint:
    return fingerprint_for(model, BLOCK_TOKENS)


def _prompt(length: int, seed: int = 1) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(3, 1024, (1, length), generator=generator)


def _full(model: Any, input_ids: torch.Tensor) -> Any:
    with torch.no_grad():
        return model(input_ids=input_ids, use_cache=True)


async def _open(directory: Path, fingerprint: ModelFingerprint) -> KVBlockStore:
    return await KVBlockStore.open(directory, fingerprint, disk_bytes=DISK_BYTES)


def _check_against_full(model: Any, input_ids: torch.Tensor, result: Any) -> None:
    full = _full(model, input_ids)
    assert result.logits.shape[1] == input_ids.shape[1] - result.cached_tokens
    torch.testing.assert_close(result.logits, full.logits[:, result.cached_tokens :], **TOL)
    assert result.cache.get_seq_length() == input_ids.shape[1]
    for got, want in zip(result.cache.layers, full.past_key_values.layers, strict=True):
        torch.testing.assert_close(got.keys, want.keys, **TOL)
        torch.testing.assert_close(got.values, want.values, **TOL)


@pytest.mark.parametrize(
    ("length", "cached"),
    [(10, 0), (64, 63), (70, 64), (100, 96)],
    ids=["under-a-block", "exactly-2-blocks", "2-blocks-and-6", "whole-prompt-cached"],
)
def test_restored_prefix_gives_full_logits(
    model: Any, fingerprint: ModelFingerprint, tmp_path: Path, length: int, cached: int
) -> None:
    async def main() -> None:
        prompt = _prompt(100)
        store = await _open(tmp_path, fingerprint)
        try:
            first = await prefill(store, model, prompt)
            assert (first.cached_tokens, first.stored_blocks) == (0, 3)
            _check_against_full(model, prompt, first)
            again = await prefill(store, model, prompt[:, :length])
            assert again.cached_tokens == cached
            assert again.stored_blocks == 0
            _check_against_full(model, prompt[:, :length], again)
        finally:
            await store.aclose()

    asyncio.run(main())


def test_blocks_survive_a_reopen_and_prompts_share_the_first_block(
    model: Any, fingerprint: ModelFingerprint, tmp_path: Path
) -> None:
    prompt = _prompt(100)
    # shares only the first block with ``prompt``: its 2nd block differs
    other = torch.cat([prompt[:, :BLOCK_TOKENS], _prompt(60, seed=2)], dim=1)

    async def main() -> None:
        store = await _open(tmp_path, fingerprint)
        await prefill(store, model, prompt)
        await store.aclose()
        store = await _open(tmp_path, fingerprint)  # a new store on the same directory
        try:
            result = await prefill(store, model, prompt)
            assert (result.cached_tokens, result.stored_blocks) == (96, 0)
            _check_against_full(model, prompt, result)
            shared = await prefill(store, model, other)
            assert (shared.cached_tokens, shared.stored_blocks) == (32, 1)
            _check_against_full(model, other, shared)
        finally:
            await store.aclose()

    asyncio.run(main())


def test_greedy_decoding_from_the_restored_cache(
    model: Any, fingerprint: ModelFingerprint, tmp_path: Path
) -> None:
    prompt, new_tokens = _prompt(70), 8
    reference = model.generate(prompt, max_new_tokens=new_tokens, do_sample=False)
    with SyncKVBlockStore.open(tmp_path, fingerprint, disk_bytes=DISK_BYTES) as store:
        assert prefill_sync(store, model, prompt).stored_blocks == 2
        result = prefill_sync(store, model, prompt)
    assert result.cached_tokens == 64
    # generate: the first new token comes from prefill's logits; the cache covers the prompt
    first = result.logits[:, -1:].argmax(-1)
    generated = model.generate(
        torch.cat([prompt, first], dim=1),
        past_key_values=result.cache,
        max_new_tokens=new_tokens - 1,
        do_sample=False,
    )
    assert torch.equal(generated, reference)
    # a hand-written greedy loop over a second restore gives the same tokens
    with SyncKVBlockStore.open(tmp_path, fingerprint, disk_bytes=DISK_BYTES) as store:
        result = prefill_sync(store, model, prompt)
    cache, tokens = result.cache, [int(result.logits[0, -1].argmax())]
    with torch.no_grad():
        for _ in range(new_tokens - 1):
            step = model(input_ids=torch.tensor([tokens[-1:]]), past_key_values=cache)
            tokens.append(int(step.logits[0, -1].argmax()))
    assert tokens == reference[0, prompt.shape[1] :].tolist()


def _flip_block_bytes(directory: Path, block: torch.Tensor) -> None:
    """Flip bytes in the middle of ``block``'s raw bytes wherever the store's data files
    hold them (found by content: the test does not depend on the file layout)."""
    raw = block.numpy().tobytes()
    needle = raw[: len(raw) // 4]
    hits = 0
    for root, _, names in os.walk(directory):
        for name in names:
            path = os.path.join(root, name)
            with open(path, "r+b") as f:
                data = f.read()
                at = data.find(needle)
                if at >= 0:
                    f.seek(at + len(raw) // 2)
                    f.write(bytes(b ^ 0xFF for b in raw[len(raw) // 2 : len(raw) // 2 + 16]))
                    hits += 1
    assert hits == 1, f"the block's bytes were found in {hits} files"


def test_a_corrupted_block_is_recomputed(
    model: Any, fingerprint: ModelFingerprint, tmp_path: Path
) -> None:
    prompt = _prompt(100)
    blocks = blocks_from_cache(_full(model, prompt).past_key_values, 0, 3, fingerprint)

    async def main() -> None:
        store = await _open(tmp_path, fingerprint)
        await prefill(store, model, prompt)
        await store.aclose()
        _flip_block_bytes(tmp_path, blocks[1])
        store = await _open(tmp_path, fingerprint)
        try:
            result = await prefill(store, model, prompt)
            assert result.cached_tokens == BLOCK_TOKENS  # block 0 only: block 1 is damaged
            assert result.stored_blocks >= 1  # block 1 again
            assert store.stats()["corrupt_blocks"] == 1
            _check_against_full(model, prompt, result)
            healed = await prefill(store, model, prompt)
            assert healed.cached_tokens == 96
            _check_against_full(model, prompt, healed)
        finally:
            await store.aclose()

    asyncio.run(main())


def test_fingerprint_is_a_content_hash(
    model: Any, fingerprint: ModelFingerprint, tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM

    assert fingerprint.block_shape == (2, 2, BLOCK_TOKENS, 2, 32)
    assert fingerprint.dtype == "float32"
    same = make_tiny_llama(str(tmp_path / "same"), seed=0)
    other = make_tiny_llama(str(tmp_path / "other"), seed=1)
    for path, equal in ((same, True), (other, False)):
        loaded = AutoModelForCausalLM.from_pretrained(path)
        assert (fingerprint_for(loaded, BLOCK_TOKENS).model == fingerprint.model) is equal


def test_a_store_of_another_shape_is_refused(model: Any, tmp_path: Path) -> None:
    wrong = ModelFingerprint("other", "float32", 2, BLOCK_TOKENS, 4, 32)

    async def main() -> None:
        store = await _open(tmp_path, wrong)
        try:
            with pytest.raises(ValueError, match="do not fit"):
                await prefill(store, model, _prompt(40))
        finally:
            await store.aclose()

    asyncio.run(main())


class _ExactCodec:
    """A lossless codec: the error it yields is the harness's own (float32 rounding)."""

    def describe(self) -> dict[str, int]:
        return {"residual_tokens": 0}

    def encode_many(self, blocks: torch.Tensor) -> torch.Tensor:
        return blocks.clone()

    def decode_many(self, data: torch.Tensor, out: torch.Tensor) -> None:
        out.copy_(data)


def test_kivi_logit_error(model: Any) -> None:
    prompt = _prompt(100)
    exact = kivi_logit_error(model, prompt, _ExactCodec())
    four = kivi_logit_error(model, prompt, KiviCodec(bits=4, residual_tokens=0))
    two = kivi_logit_error(model, prompt, KiviCodec(bits=2, residual_tokens=0))
    largest_logit = float(_full(model, prompt).logits.abs().max())
    assert exact < 1e-4
    # measured on this prompt: 4-bit 0.49, 2-bit 2.04, logits up to 4.0
    assert 1e-3 < four < 0.3 * largest_logit
    assert two > four
    with pytest.raises(ValueError, match="full precision"):
        kivi_logit_error(model, prompt, KiviCodec(bits=4))  # 32-token residual: no quantising


def test_a_kivi_compressed_store_costs_what_kivi_logit_error_says(
    model: Any, fingerprint: ModelFingerprint, tmp_path: Path
) -> None:
    prompt, codec = _prompt(100), KiviCodec(bits=4, residual_tokens=0)
    predicted = kivi_logit_error(model, prompt, codec)

    async def main() -> None:
        store = await KVBlockStore.open(
            tmp_path, fingerprint, disk_bytes=DISK_BYTES, compression=codec
        )
        try:
            await prefill(store, model, prompt)
            result = await prefill(store, model, prompt)
        finally:
            await store.aclose()
        assert result.cached_tokens == 96
        full = _full(model, prompt).logits[:, 96:]
        assert float((result.logits - full).abs().max()) == pytest.approx(predicted, rel=1e-4)

    asyncio.run(main())
