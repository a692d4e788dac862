"""Selective recompute: a prefill over reused (re-rotated) KV that recomputes only the tokens
whose KV the new context changes most.

``blend_prefill`` runs a Llama-style model layer by layer over a prompt of ``n`` tokens where
some tokens' KV is reused (a chunk computed in another context) and the rest (the question,
new text, chunks not cached) are fresh. CacheBlend's rule (the default):

- layers below ``check_layer`` run every token (their output is what the check needs);
- at ``check_layer`` every reused token's K and V are projected afresh (two small matmuls,
  no attention) and the ``recompute_fraction`` of reused tokens whose K deviates most from
  the reused K (L2 over heads and dims) are selected; the others keep these fresh K and V;
- from ``check_layer`` on, only the selected and the fresh tokens run; the rest attend as
  keys and values only. The question and any new text are always computed.

The check costs every reused token one layer (the layers below it); on a shallow model that
is most of the budget (1/6 of all reused work on the 6-layer test model). Cheaper rules take
``priority`` scores up front (``assemble``'s "chunk-start": the first tokens of each reused
chunk, which had the least of their own chunk to attend to and so lean most on the context
that changed) and either recompute the top ones with no check, or ("hybrid") run the check
on the top ``candidates`` only; every layer, layer 0 included, then reuses the other tokens'
KV (layer 0's is exact: it depends on the token and its position alone).

``recompute_fraction`` 1.0 runs every token through every layer with the model's own mask:
the same operations as a full prefill, so the same KV and logits (tested). 0.0 is pure reuse
past the check layer.

Work is counted in token-layers (one token through one decoder layer); the K/V projection of
the check counts as its FLOP share of a layer. ``tokens_computed`` = token-layers / layers, so
a full prefill of ``n`` tokens computes ``n``.

Thread-safety: free functions; the model must tolerate concurrent inference (no_grad does).
Only Llama-style decoder layers (``input_layernorm``, ``self_attn.k_proj``/``v_proj``,
one rotary embedding) with full attention in every layer are supported.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from kvstore.rag.context_stats import AloneProbe, fresh_kv
from kvstore.rag.errors import RagArgumentError
from kvstore.rag.rope import RopeRotator

__all__ = ["BlendResult", "blend_prefill", "layer_flops"]


@dataclass
class BlendResult:
    logits: torch.Tensor  # [1, vocab]: the last prompt position's
    cache: Any  # DynamicCache holding every prompt token's KV
    tokens_computed: float  # token-layers / layers
    recomputed: torch.Tensor  # indices of the reused tokens selected for recompute
    context_attention: torch.Tensor | None = None  # [n]: the alone deviation (context_stats)
    deviation: torch.Tensor | None = None  # [n]: the check's K deviation, NaN where unchecked


class _ScatterKV:
    """Stands in for the cache inside a decoder layer: writes the running tokens' K/V at their
    indices of the layer's full K/V and hands the attention the full tensors."""

    def __init__(self, layers: list[torch.Tensor]) -> None:
        self.layers = layers  # per layer: [2, 1, kv_heads, n, head_dim]
        self.index: torch.Tensor | None = None  # the running tokens; None: all

    def update(self, keys: torch.Tensor, values: torch.Tensor, layer: int, *_: Any) -> Any:
        full = self.layers[layer]
        if self.index is None:
            full[0], full[1] = keys, values
        else:
            full[0][:, :, self.index] = keys
            full[1][:, :, self.index] = values
        return full[0], full[1]


def layer_flops(config: Any, context_tokens: int) -> tuple[float, float]:
    """(FLOPs of one token through one decoder layer at ``context_tokens`` of context, FLOPs
    of its K and V projections alone)."""
    hidden, heads = config.hidden_size, config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    kv = (getattr(config, "num_key_value_heads", None) or heads) * head_dim
    projections = 2 * hidden * (2 * heads * head_dim + 2 * kv)
    mlp = 2 * 3 * hidden * config.intermediate_size
    attention = 4 * heads * head_dim * context_tokens
    return float(projections + mlp + attention), float(4 * hidden * kv)


def _mask(model: Any, queries: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """Additive [1, 1, q, n] mask: query at position i sees keys 0..i."""
    keys = torch.arange(num_tokens, device=queries.device)
    allowed = keys.unsqueeze(0) <= queries.unsqueeze(1)
    mask = torch.zeros(allowed.shape, dtype=model.dtype, device=queries.device)
    return mask.masked_fill(~allowed, torch.finfo(model.dtype).min)[None, None]


def blend_prefill(
    model: Any,
    input_ids: torch.Tensor,
    reused: torch.Tensor,
    layer_kv: Callable[[int], torch.Tensor],
    *,
    recompute_fraction: float,
    check_layer: int = 1,
    priority: torch.Tensor | None = None,
    candidates: float | None = None,
    exact: torch.Tensor | None = None,
    own_start: torch.Tensor | None = None,
    context_from: int = 1,
) -> BlendResult:
    """Prefill ``input_ids`` ``[1, n]`` reusing the KV of the tokens where ``reused`` ``[n]``
    (bool) is True: ``layer_kv(l)`` gives layer l's ``[2, kv_heads, n, head_dim]`` with those
    tokens' K (already rotated to their positions) and V filled in (the rest is ignored).
    Asked for in layer order, once each, so a caller can stream layers in.

    With ``priority`` ``[n]`` (higher: recompute first) the tokens are chosen by it before
    the first layer and no check runs: every layer from 0 reuses the unchosen tokens' KV.
    With ``priority`` and ``candidates`` (a fraction of the reused tokens, >= the recompute
    fraction) the check runs on the top ``candidates`` by priority only: they alone run the
    layers below it, and the deviation picks the recomputed ones among them.

    ``exact`` ``[n]`` (bool, within ``reused``) marks reused tokens whose KV is already what a
    full prefill of this prompt computes (stored after the same tokens at the same
    positions): they never run, are never checked or chosen, and the fraction counts the
    other reused tokens only; their KV is asked of ``layer_kv`` for every layer. Below
    fraction 1.0 only: 1.0 runs every token.

    ``own_start`` ``[n]`` (long) asks for the context statistics of the computed tokens where
    it is >= 0 (the first position of the token's own segment): ``context_attention`` then
    holds each one's alone deviation (``kvstore.rag.context_stats``: its layer-1 K in this
    prompt against its K with keys in ``[context_from, own_start)`` masked out; 0
    elsewhere); the measuring is counted in ``tokens_computed``. ``deviation`` holds the
    check's K deviation of every token it checked (NaN elsewhere)."""
    from transformers import DynamicCache
    from transformers.masking_utils import create_causal_mask

    if not 0.0 <= recompute_fraction <= 1.0:
        raise RagArgumentError(f"recompute_fraction {recompute_fraction} outside [0, 1]")
    base, config = model.model, model.config.get_text_config(decoder=True)
    num_layers, n = config.num_hidden_layers, input_ids.shape[1]
    if not 0 <= check_layer < num_layers:
        raise RagArgumentError(f"check_layer {check_layer} of a {num_layers}-layer model")
    device = model.device
    reused = reused.to(device)
    if exact is None or recompute_fraction >= 1.0:
        exact = torch.zeros_like(reused)
    exact = exact.to(device)
    if bool((exact & ~reused).any()):
        raise RagArgumentError("exact tokens must be reused tokens")
    if recompute_fraction >= 1.0:
        reused = torch.zeros_like(reused)  # every token through every layer: a full prefill
    reused_idx = torch.nonzero(reused & ~exact).flatten()  # the ones the rule may recompute
    fresh_idx = torch.nonzero(~reused).flatten()
    if reused_idx.numel() == 0:
        check_layer = num_layers  # nothing to check: the non-exact tokens run every layer
    positions = torch.arange(n, device=device).unsqueeze(0)
    per_token, projection = layer_flops(config, n // 2)
    RopeRotator(model)  # refuses a length-dependent RoPE before any work
    if bool(reused[-1]):
        raise RagArgumentError("the prompt's last token must be fresh (the question), not reused")
    with torch.no_grad():
        hidden = base.embed_tokens(input_ids.to(device))
        full_pe = base.rotary_emb(hidden, position_ids=positions)
        full_mask = create_causal_mask(
            config=config, inputs_embeds=hidden, attention_mask=None,
            past_key_values=None, position_ids=positions,
        )  # fmt: skip
        shapes = (
            2,
            1,
            config.num_key_value_heads,
            n,
            hidden.shape[-1] // config.num_attention_heads,
        )
        kv = _ScatterKV([])
        token_layers = 0.0
        active = torch.nonzero(~exact).flatten()
        pe, mask = full_pe, full_mask
        reuse_from = check_layer
        if active.numel() < n:  # the exact tokens' KV is read at every layer, never computed
            hidden = hidden[:, active]
            pe, mask = _take(full_pe, active), _mask(model, active, n)
            reuse_from = 0
        count = round(recompute_fraction * reused_idx.numel())
        pool: torch.Tensor | None = reused_idx
        selected = reused_idx[:0]
        if priority is not None and check_layer < num_layers:  # chosen before any layer
            scores = priority.to(device)[reused_idx]
            if candidates is None:  # by priority alone: no check
                selected, pool = _top(reused_idx, scores, count), None
                active = torch.cat((selected, fresh_idx)).sort().values
            else:  # the check looks at the candidates only
                wanted = max(count, round(candidates * reused_idx.numel()))
                pool = _top(reused_idx, scores, wanted)
                active = torch.cat((pool, fresh_idx)).sort().values
                pool = pool if pool.numel() else None  # nothing to check
            hidden = base.embed_tokens(input_ids.to(device))[:, active]
            pe, mask = _take(full_pe, active), _mask(model, active, n)
            reuse_from = 0
        checked = torch.full((n,), float("nan"), device=device)
        probe = None
        if own_start is not None and num_layers > 1:
            probe = AloneProbe(own_start, context_from, model.dtype)
        for index, layer in enumerate(base.layers[:num_layers]):
            full = torch.empty(shapes, dtype=model.dtype, device=device)
            if index >= reuse_from:
                stored = layer_kv(index).to(device=device, dtype=model.dtype)
                full[:, 0] = stored
            if index == check_layer and pool is not None:  # project the pool; pick the worst
                rows = torch.searchsorted(active, pool)
                keys, values = fresh_kv(layer, hidden[:, rows], _take(full_pe, pool))
                deviation = (keys - full[0][:, :, pool]).pow(2).sum((0, 1, 3))
                checked[pool] = deviation.float()
                selected = _top(pool, deviation, count)
                full[0][:, :, pool], full[1][:, :, pool] = keys, values
                token_layers += pool.numel() * projection / per_token
                running = torch.cat((selected, fresh_idx)).sort().values
                hidden = hidden[:, torch.searchsorted(active, running)]
                active = running
                pe, mask = _take(full_pe, active), _mask(model, active, n)
            kv.layers.append(full)
            kv.index = None if active.numel() == n else active
            hidden_in, active_in = hidden, active
            hidden = layer(
                hidden, attention_mask=mask, position_ids=positions[:, active],
                past_key_values=kv, use_cache=True, position_embeddings=pe,
            )  # fmt: skip
            token_layers += active.numel()
            if probe is not None and index <= 1:
                token_layers += probe.after(index, layer, hidden_in, active_in, full, full_pe)
                if index == 1:
                    token_layers += probe.measured * projection / per_token
        last = base.norm(hidden[:, -1:])
        logits = model.lm_head(last)[:, -1]
        cache = DynamicCache(config=model.config)
        for index, full in enumerate(kv.layers):
            cache.update(full[0].contiguous(), full[1].contiguous(), index)
    stats = probe.scores if probe is not None else None
    return BlendResult(logits, cache, token_layers / num_layers, selected, stats, checked.cpu())


def _top(candidates: torch.Tensor, scores: torch.Tensor, count: int) -> torch.Tensor:
    """The ``count`` ``candidates`` with the highest ``scores``, in position order."""
    return candidates[torch.topk(scores, count).indices.sort().values]


def _take(pe: tuple[torch.Tensor, ...], index: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return tuple(t[:, index] for t in pe)
