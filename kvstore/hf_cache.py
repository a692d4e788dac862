"""Between ``transformers.DynamicCache`` and KV blocks: the conversions ``kvstore.hf`` runs on.

- ``fingerprint_for``: the ``ModelFingerprint`` of a model's KV blocks, named by a content
  hash of its config and weights.
- ``cache_from_blocks``: stored blocks -> a ``DynamicCache`` ready for ``past_key_values``.
- ``blocks_from_cache``: a range of whole blocks of a computed cache -> blocks to store.

Layouts: a block is ``ModelFingerprint.block_shape``, ``[layers, 2 (K, V), block_tokens,
kv_heads, head_dim]``; a ``DynamicCache`` layer holds ``[1, kv_heads, tokens, head_dim]``.
Blocks keep the fingerprint's dtype and are cast to the model's on the way into a cache.
Only caches whose every layer is plain full attention keep the KV of every token (a
sliding-window or linear-attention layer does not), so only those convert.

Thread-safety: free functions; the returned tensors and caches are new objects.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any

import torch

from kvstore.fingerprint import ModelFingerprint

if TYPE_CHECKING:
    from transformers import DynamicCache

__all__ = ["blocks_from_cache", "cache_from_blocks", "fingerprint_for"]

# Config keys that name where or by what a checkpoint was loaded, not what it computes.
_VOLATILE_CONFIG_KEYS = ("_name_or_path", "transformers_version", "dtype", "torch_dtype")


def fingerprint_for(
    model: Any, block_tokens: int, dtype: str | None = None, *, name: str | None = None
) -> ModelFingerprint:
    """The fingerprint of ``model``'s KV blocks of ``block_tokens`` tokens.

    The model name is ``<model_type>-<16 hex of sha256 over the config (less its path,
    transformers version and dtype) and every state_dict tensor's name, dtype, shape and
    bytes>``: a content hash, so the same weights loaded from two paths share blocks and a
    fine-tune does not. Hashing reads every weight once (~1 s per GB); ``name`` skips it.
    ``dtype`` is the stored blocks' dtype, by default the model's."""
    config = model.config.get_text_config(decoder=True)
    if name is None:
        digest = hashlib.sha256()
        settings = {k: v for k, v in config.to_dict().items() if k not in _VOLATILE_CONFIG_KEYS}
        digest.update(repr(sorted(settings.items())).encode())
        for key, tensor in sorted(model.state_dict().items()):
            flat = tensor.detach().cpu().contiguous().reshape(-1)
            digest.update(f"{key}:{flat.dtype}:{tuple(tensor.shape)}".encode())
            digest.update(flat.view(torch.uint8).numpy().tobytes())
        name = f"{config.model_type}-{digest.hexdigest()[:16]}"
    num_heads = config.num_attention_heads
    return ModelFingerprint(
        model=name,
        dtype=dtype or str(model.dtype).removeprefix("torch."),
        num_layers=config.num_hidden_layers,
        block_tokens=block_tokens,
        num_kv_heads=getattr(config, "num_key_value_heads", None) or num_heads,
        head_dim=getattr(config, "head_dim", None) or config.hidden_size // num_heads,
    )


def cache_from_blocks(
    model: Any, blocks: torch.Tensor, num_tokens: int | None = None
) -> DynamicCache:
    """A ``DynamicCache`` of the first ``num_tokens`` (default all) tokens of ``blocks``,
    ``[num_blocks, layers, 2, block_tokens, kv_heads, head_dim]``, in the model's dtype."""
    from transformers import DynamicCache

    num_blocks, num_layers, _, block_tokens, kv_heads, head_dim = blocks.shape
    total_tokens = num_blocks * block_tokens
    num_tokens = total_tokens if num_tokens is None else num_tokens
    if not 0 <= num_tokens <= total_tokens:
        raise ValueError(f"num_tokens {num_tokens} outside the blocks' 0..{total_tokens}")
    cache = DynamicCache(config=model.config)
    if num_tokens == 0:
        return cache
    # -> [layers, 2, kv_heads, tokens, head_dim]: tokens of all blocks side by side
    kv = blocks.permute(1, 2, 4, 0, 3, 5).reshape(num_layers, 2, kv_heads, total_tokens, head_dim)
    kv = kv[:, :, :, :num_tokens].to(device=model.device, dtype=model.dtype)
    for layer in range(num_layers):
        # contiguous: the cache grows by torch.cat, and a strided view would stay strided
        keys = kv[layer, 0].unsqueeze(0).contiguous()
        values = kv[layer, 1].unsqueeze(0).contiguous()
        cache.update(keys, values, layer)
    return cache


def blocks_from_cache(
    cache: DynamicCache, first_block: int, num_blocks: int, fingerprint: ModelFingerprint
) -> torch.Tensor:
    """Blocks ``first_block .. first_block + num_blocks`` of ``cache`` as a CPU tensor
    ``[num_blocks, *fingerprint.block_shape]`` of the fingerprint's dtype."""
    block_tokens = fingerprint.block_tokens
    start, stop = first_block * block_tokens, (first_block + num_blocks) * block_tokens
    layers: list[Any] = list(cache.layers)  # DynamicLayer: .keys / .values [1, H, T, D]
    if len(layers) != fingerprint.num_layers or layers[0].keys.shape[-2] < stop:
        raise ValueError(f"the cache lacks blocks {first_block}..{first_block + num_blocks}")
    pairs = [torch.stack((la.keys[0, :, start:stop], la.values[0, :, start:stop])) for la in layers]
    kv = torch.stack(pairs)  # [layers, 2, kv_heads, tokens, head_dim]
    num_layers, _, kv_heads, _, head_dim = kv.shape
    kv = kv.reshape(num_layers, 2, kv_heads, num_blocks, block_tokens, head_dim)
    blocks = kv.permute(3, 0, 1, 4, 2, 5)  # [blocks, layers, 2, block_tokens, kv_heads, dim]
    return blocks.to(device="cpu", dtype=fingerprint.torch_dtype).contiguous()
