"""A tiny random-weight Llama checkpoint made locally, for tests and benchmarks of KV caching.

``make_tiny_llama`` writes a ``LlamaForCausalLM`` with ``save_pretrained``: nothing is
downloaded and no tokenizer is written (vLLM loads it with ``skip_tokenizer_init=True``).
The weights are drawn from one ``torch.Generator`` seeded with ``seed``, parameter by
parameter in name order, so a seed names the same checkpoint in any process and any
transformers version that keeps Llama's parameter names; transformers' own init is not used
because its order and distributions change between releases.

This module imports only the standard library, ``torch`` and ``transformers``: it also runs
in a separate vLLM virtual environment where tierkit is not installed.

Thread-safety: a free function; two calls must not write the same directory at once.
"""

from __future__ import annotations

import json
import os

import torch

__all__ = ["make_tiny_llama"]

# The weights' std: larger than Llama's 0.02 so that the logits of a 2-layer random model are
# peaked enough for greedy decoding to be stable against float rounding (a near-tie would make
# "same tokens with and without the cache" a coin toss).
_WEIGHT_STD = 0.08


def make_tiny_llama(
    directory: str,
    *,
    seed: int = 0,
    num_layers: int = 2,
    hidden_size: int = 128,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    vocab_size: int = 1024,
    max_position_embeddings: int = 2048,
    dtype: str = "float32",
) -> str:
    """Write a random Llama checkpoint (config.json + model.safetensors) to ``directory`` and
    return ``directory``. ``head_dim`` is ``hidden_size // num_heads``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    if hidden_size % num_heads or num_heads % num_kv_heads:
        raise ValueError(
            f"hidden_size {hidden_size} must divide by num_heads {num_heads}, "
            f"and num_heads by num_kv_heads {num_kv_heads}"
        )
    torch_dtype = getattr(torch, dtype)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        tie_word_embeddings=False,
        rms_norm_eps=1e-6,
    )
    model = LlamaForCausalLM(config).eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            if "norm" in name:
                param.fill_(1.0)  # RMSNorm gains: random ones would just rescale
            else:
                sample = torch.randn(param.shape, generator=generator, dtype=torch.float32)
                param.copy_(sample * _WEIGHT_STD)
    model = model.to(torch_dtype)
    model.config.dtype = dtype
    os.makedirs(directory, exist_ok=True)
    model.save_pretrained(directory)
    _add_legacy_dtype_key(os.path.join(directory, "config.json"), dtype)
    return directory


def _add_legacy_dtype_key(config_path: str, dtype: str) -> None:
    """transformers 5 writes ``dtype``; readers built on transformers 4 (and vLLM's config
    checks) look for ``torch_dtype``. Both keys name the same dtype."""
    with open(config_path) as f:
        config = json.load(f)
    config["torch_dtype"] = dtype
    with open(config_path, "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
        f.write("\n")
