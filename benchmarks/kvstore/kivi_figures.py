"""KIVI figures of the KV-cache benchmark: bytes saved on a 7B-like block, logit error on the
tiny model.

* ``kivi4_bytes_ratio``: ``KiviCodec(bits=4).encoded_bytes(FP_7B) / FP_7B.block_bytes`` (the
  codec's defaults: a 32-token full-precision residual, groups of 32), checked against the
  length of a real ``encode`` of a random normal block of that shape.
* ``kivi4_max_abs_logit_err``: ``kvstore.hf.kivi_logit_error`` on the tiny local Llama
  (``kvstore.testing.tiny_llama.make_tiny_llama``, random weights, float32): the largest
  |logit difference| over the uncached tail of a prompt when its cached prefix went through
  the codec, against exact recomputation. The prompt: 1,025 random token ids (seed 0), so two
  512-token blocks are restored, the codec configured as for the ratio.

Either figure is None, with the reason, when its piece is not importable.

Thread-safety: plain functions; the model runs on the calling thread.
"""

from __future__ import annotations

import tempfile
from typing import Any

import torch

from benchmarks.kvstore.throughput import FP_7B

__all__ = ["kivi_figures"]

_PROMPT_TOKENS = 1025
_BLOCK_TOKENS = 512


def kivi_figures() -> dict[str, Any]:
    figures: dict[str, Any] = {"kivi4_bytes_ratio": None, "kivi4_max_abs_logit_err": None}
    try:
        from kvstore.kivi import KiviCodec
    except ImportError as exc:
        figures["kivi_error"] = f"kvstore.kivi not importable: {exc}"
        return figures
    codec = KiviCodec(bits=4)
    encoded_bytes = codec.encoded_bytes(FP_7B)
    generator = torch.Generator().manual_seed(0)
    block = torch.randn(FP_7B.block_shape, generator=generator).to(FP_7B.torch_dtype)
    actual = codec.encode(block)
    figures["kivi4_bytes_ratio"] = round(encoded_bytes / FP_7B.block_bytes, 4)
    figures["kivi4_encoded_bytes"] = encoded_bytes
    figures["kivi4_encode_len_matches"] = int(actual.numel() * actual.element_size()) == (
        encoded_bytes
    )
    figures["kivi4_codec"] = repr(codec)
    figures["kivi2_bytes_ratio"] = round(
        KiviCodec(bits=2).encoded_bytes(FP_7B) / FP_7B.block_bytes, 4
    )
    try:
        from transformers import LlamaForCausalLM

        from kvstore.hf import kivi_logit_error
        from kvstore.testing.tiny_llama import make_tiny_llama
    except ImportError as exc:
        figures["kivi_logit_error_reason"] = f"not importable: {exc}"
        return figures
    with tempfile.TemporaryDirectory(prefix="kvbench-tiny-llama-") as directory:
        make_tiny_llama(directory)
        model = LlamaForCausalLM.from_pretrained(directory).eval()
    vocab = int(model.config.vocab_size)
    generator.manual_seed(0)
    input_ids = torch.randint(3, vocab, (1, _PROMPT_TOKENS), generator=generator)
    error = kivi_logit_error(model, input_ids, codec, block_tokens=_BLOCK_TOKENS)
    with torch.no_grad():
        logits = model(input_ids=input_ids).logits
    figures["kivi4_max_abs_logit_err"] = round(float(error), 6)
    figures["tiny_model_logit_abs_max"] = round(float(logits.abs().max()), 4)
    figures["kivi_logit_probe"] = (
        f"tiny llama (2 layers, float32, random weights), {_PROMPT_TOKENS}-token prompt, "
        f"{(_PROMPT_TOKENS - 1) // _BLOCK_TOKENS} blocks of {_BLOCK_TOKENS} tokens through "
        f"{codec!r}"
    )
    return figures
