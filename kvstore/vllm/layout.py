"""How vLLM's paged KV cache maps onto tierkit blocks, and the model fingerprint vLLM implies.

tierkit stores a block as ``[layers, 2 (K, V), block_tokens, kv_heads, head_dim]``
(``ModelFingerprint.block_shape``). vLLM 0.32 hands a connector one paged tensor per
attention layer, a logical ``[num_blocks, kv_heads, block_size, 2 * head_dim]`` container
whose interior packing belongs to the attention kernel:

- CPU attention packs each block per ISA: with ``vec`` (float32, float16) K is stored
  transposed (``[head_dim, tokens]`` per head) and V is not; with ``amx`` (bfloat16) K and V
  are interleaved in pairs for the tile instructions. Rather than hard-code each, ``PagedLayout``
  calibrates: it writes probe values through vLLM's own ``cpu_attn_reshape_and_cache`` op
  (the op the model uses) into a one-block scratch cache and reads back where every element
  landed, giving a permutation from tierkit order to offsets inside a paged block. Gathers and
  scatters are then one advanced index per layer. Run here: ``amx`` (bfloat16) end to end,
  ``vec`` against the op (tests/kvstore/vllm/layout_contract.py).
- GPU backends (flash-attn, triton): ``content`` is one token's ``[K | V]``, so the view is
  ``[B, H, N, 2, D]`` by the layer's strides. UNTESTED: no GPU build of vLLM runs here; the
  mapping is read from vLLM 0.32's ``split(head_size, dim=-1)``.

Thread-safety: ``PagedLayout`` is immutable after construction; free functions.
"""

from __future__ import annotations

from typing import Any

import torch

from kvstore.fingerprint import ModelFingerprint

__all__ = ["PagedLayout", "cpu_attention_isa", "fingerprint_from_vllm", "layer_order"]


def fingerprint_from_vllm(
    vllm_config: Any, kv_cache_config: Any, extra_config: dict[str, Any]
) -> ModelFingerprint:
    """The fingerprint of the model vLLM serves: the KV cache spec of its (only) attention
    group gives dtype, heads and head size; ``extra_config["model_id"]`` overrides the model
    name (default: the model path and revision, so a changed checkpoint at the same path
    must be given a new ``model_id`` or a new store directory)."""
    groups = kv_cache_config.kv_cache_groups
    if len(groups) != 1:
        raise ValueError(
            f"the tierkit connector supports models with one KV cache group, got {len(groups)}"
        )
    spec = groups[0].kv_cache_spec
    if getattr(spec, "head_size_v", spec.head_size) != spec.head_size:
        raise ValueError("the tierkit connector needs equal K and V head sizes")
    model_config = vllm_config.model_config
    parallel = vllm_config.parallel_config
    name = extra_config.get("model_id") or f"{model_config.model}@{model_config.revision}"
    if parallel.world_size > 1:
        # each rank caches its own slice of the heads: its blocks are a different model's
        name = f"{name}/rank{parallel.rank}of{parallel.world_size}"
    return ModelFingerprint(
        model=str(name),
        dtype=str(spec.dtype).removeprefix("torch."),
        num_layers=len(groups[0].layer_names),
        block_tokens=int(spec.block_size),
        num_kv_heads=int(spec.num_kv_heads),
        head_dim=int(spec.head_size),
    )


def layer_order(layer_names: list[str]) -> dict[str, int]:
    """Each attention layer's index in a block: by the layer number in its name
    (``model.layers.7.self_attn.attn`` -> 7), ties and number-less names in given order."""

    def number(name: str) -> int:
        digits = [int(part) for part in name.split(".") if part.isdigit()]
        return digits[0] if digits else -1

    ordered = sorted(layer_names, key=number)  # stable: equal numbers keep their order
    return {name: index for index, name in enumerate(ordered)}


def cpu_attention_isa(vllm_config: Any, fingerprint: ModelFingerprint) -> str:
    """The ISA vLLM's CPU attention picks for this model (its builder's own choice)."""
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    return str(
        _get_attn_isa(
            vllm_config.model_config.dtype,
            fingerprint.block_tokens,
            fingerprint.head_dim,
            vllm_config.cache_config.cache_dtype,
        )
    )


class PagedLayout:
    """Moves whole blocks of one layer between a paged KV tensor and tierkit's layout."""

    def __init__(self, fingerprint: ModelFingerprint, *, cpu_isa: str | None) -> None:
        self.fingerprint = fingerprint
        self.cpu_isa = cpu_isa
        # offsets[i]: where element i of a [2, N, H, D] block-layer lives in a paged block
        self._offsets = _calibrate(fingerprint, cpu_isa) if cpu_isa else None

    def _check(self, paged: torch.Tensor) -> None:
        fp = self.fingerprint
        want = (fp.num_kv_heads, fp.block_tokens, 2 * fp.head_dim)
        if paged.dim() != 4 or tuple(paged.shape[1:]) != want:
            raise ValueError(f"paged KV layer {tuple(paged.shape)}: expected [blocks, *{want}]")

    def gather(self, paged: torch.Tensor, block_ids: torch.Tensor) -> torch.Tensor:
        """Blocks ``block_ids`` of ``paged`` as ``[n, 2, N, H, D]`` (a new CPU tensor)."""
        self._check(paged)
        shape = (len(block_ids), *self.fingerprint.layer_shape)
        ids = block_ids.to(paged.device)
        if self._offsets is None:
            return _gpu_view(paged, self.fingerprint)[ids].cpu()
        rows = paged.view(paged.shape[0], -1)[ids[:, None], self._offsets[None, :]]
        return rows.view(shape).cpu()

    def scatter(self, paged: torch.Tensor, block_ids: torch.Tensor, blocks: torch.Tensor) -> None:
        """Write ``blocks`` (``[n, 2, N, H, D]``) into blocks ``block_ids`` of ``paged``."""
        self._check(paged)
        ids = block_ids.to(paged.device)
        data = blocks.to(device=paged.device, dtype=paged.dtype)
        if self._offsets is None:
            _gpu_view(paged, self.fingerprint)[ids] = data
            return
        flat = paged.view(paged.shape[0], -1)
        flat[ids[:, None], self._offsets[None, :]] = data.reshape(len(ids), -1)


def _gpu_view(paged: torch.Tensor, fingerprint: ModelFingerprint) -> torch.Tensor:
    # [B, H, N, (K|V) D] -> [B, 2, N, H, D]; unflatten keeps any stride order
    return paged.unflatten(-1, (2, fingerprint.head_dim)).permute(0, 3, 2, 1, 4)


def _calibrate(fingerprint: ModelFingerprint, isa: str) -> torch.Tensor:
    """Where vLLM's CPU cache-write op puts each K and V element of one block, found by
    writing base-256 digits of every element's index (exact in any 16-bit float)."""
    from vllm import _custom_ops as ops

    tokens, heads, dim = fingerprint.block_tokens, fingerprint.num_kv_heads, fingerprint.head_dim
    dtype = fingerprint.torch_dtype
    if dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"the tierkit connector does not support a {dtype} KV cache on CPU")
    count = tokens * heads * dim  # elements of K (or V) in one block
    index = torch.arange(count)
    offsets = torch.full((2 * count,), -1, dtype=torch.long)
    for half in (0, 1):
        logical = torch.zeros(2 * count, dtype=torch.long)
        mine = torch.zeros(2 * count, dtype=torch.bool)
        digit_weight = 1
        while digit_weight < count or digit_weight == 1:
            digits = ((index // digit_weight) % 256).view(tokens, heads, dim).to(dtype)
            filler = torch.full((tokens, heads, dim), -1.0, dtype=dtype)
            cache = torch.zeros((1, heads, tokens, 2 * dim), dtype=dtype)
            key_cache, value_cache = cache.view(1, heads, 2 * tokens, dim).chunk(2, dim=2)
            key, value = (digits, filler) if half == 0 else (filler, digits)
            ops.cpu_attn_reshape_and_cache(
                key, value, key_cache, value_cache, torch.arange(tokens), isa
            )
            written = cache.flatten().float()
            mine = written >= 0
            logical[mine] += written[mine].long() * digit_weight
            digit_weight *= 256
        positions = mine.nonzero().squeeze(1)
        offsets[half * count + logical[positions]] = positions
    if not torch.equal(offsets.sort().values, torch.arange(2 * count)):
        raise ValueError(f"vLLM's CPU KV packing for isa {isa!r} is not a permutation")
    return offsets
