"""Per-token context statistics stored with a chunk when it is first computed, and the layer-1
K/V projection both they and the check use.

"alone deviation" (the "attention" rule's score): when a missed chunk is computed inside a
prompt, each of its tokens also runs layer 0 a second time with the other segments masked
out (it sees the prompt's shared lead, ``context_from``: the attention sink and the system
text, and its own chunk), and the squared distance between that token's layer-1 K in context
and alone is stored: how much its KV leans on the chunks that happened to precede it. That
is CacheBlend's check-layer deviation, measured once between two contexts when the chunk is
stored instead of at every reuse. Layer-0 K/V depend on a token and its position only, so
the alone pass reads the in-context layer-0 K/V as they are. Cost: one layer plus the K/V
projection per measured token, counted in ``tokens_computed``.

Measured here (benchmarks/RESULTS.md) it ranks the tokens the check would pick poorly (30%
of the check's top 5%; as check candidates, mean KL 1.43e-4 at fraction 0.05 on the
5,000-request replay, over the quality bound); the "learned" rule (kvstore.rag.assemble)
keeps the check's own deviations from a chunk's first checked reuse instead. These
statistics are measured only for the "attention" rule.

Stored in the chunk's header page as float16 bytes, base64 (``encode_scores``): a chunk of
up to ``MAX_SCORED_TOKENS`` tokens carries them; longer ones carry none, and the rule ranks
their tokens by position in the chunk instead (first tokens first).

Thread-safety: free functions and a per-call probe over tensors the caller owns.
"""

from __future__ import annotations

import base64
from typing import Any

import torch

from kvstore.rag.errors import UnsupportedModelError

__all__ = [
    "MAX_SCORED_TOKENS",
    "AloneProbe",
    "decode_scores",
    "encode_scores",
    "fresh_kv",
    "positional_scores",
]

MAX_SCORED_TOKENS = 1400  # float16 base64 of this many fits the header page beside the rest


def fresh_kv(layer: Any, hidden: torch.Tensor, cos_sin: tuple[torch.Tensor, ...]) -> Any:
    """The K (after RoPE) and V the layer would compute for ``hidden`` [1, t, hidden]."""
    attn = layer.self_attn
    normed = layer.input_layernorm(hidden)
    shape = (*normed.shape[:-1], -1, attn.head_dim)
    keys = attn.k_proj(normed).view(shape)
    if getattr(attn, "k_norm", None) is not None:  # Qwen3-style per-head norm
        keys = attn.k_norm(keys)
    keys = keys.transpose(1, 2)
    values = attn.v_proj(normed).view(shape).transpose(1, 2)
    cos, sin = (t.unsqueeze(1) for t in cos_sin)
    half = keys.shape[-1] // 2
    rot = cos.shape[-1]
    turned = (
        torch.cat((-keys[..., half:rot], keys[..., :half]), dim=-1) if rot == 2 * half else None
    )
    if turned is None:
        raise UnsupportedModelError("partial rotary embeddings are not supported by blend")
    return keys * cos + turned * sin, values


class _Frozen:
    """A layer's full K/V handed to the attention as they are (nothing written)."""

    def __init__(self, full: torch.Tensor) -> None:
        self.full = full

    def update(self, keys: torch.Tensor, values: torch.Tensor, layer: int, *_: Any) -> Any:
        return self.full[0], self.full[1]


class AloneProbe:
    """Measures the alone deviation (module docstring) of the tokens where ``own_start``
    ``[n]`` is >= 0 during a layer-by-layer prefill: call ``after`` after each of layers 0
    and 1 has run; ``scores`` ``[n]`` holds the result (0 elsewhere)."""

    def __init__(self, own_start: torch.Tensor, context_from: int, dtype: torch.dtype) -> None:
        self.own_start, self.context_from, self.dtype = own_start, context_from, dtype
        self.scores = torch.zeros(own_start.shape[0], dtype=torch.float32)
        self._where = own_start[:0]
        self._hidden: torch.Tensor | None = None

    def after(
        self,
        index: int,
        layer: Any,
        hidden_in: torch.Tensor,
        active: torch.Tensor,
        full: torch.Tensor,
        full_pe: tuple[torch.Tensor, ...],
    ) -> int:
        """After layer ``index`` ran ``active`` tokens (input ``hidden_in``); ``full`` is its
        [2, 1, kv_heads, n, head_dim] K/V. Returns the token-layers it ran (projections
        excluded: the caller counts those)."""
        if index == 0:
            starts = self.own_start.to(active.device)[active]
            rows = torch.nonzero(starts >= 0).flatten()
            self._where = active[rows]
            if not rows.numel():
                return 0
            mask = _alone_mask(self._where, starts[rows], self.context_from, full.shape[3],
                               self.dtype)  # fmt: skip
            self._hidden = layer(
                hidden_in[:, rows], attention_mask=mask, position_ids=self._where[None],
                past_key_values=_Frozen(full), use_cache=True,
                position_embeddings=tuple(t[:, self._where] for t in full_pe),
            )  # fmt: skip
            return int(rows.numel())
        if index == 1 and self._hidden is not None:
            pe = tuple(t[:, self._where] for t in full_pe)
            keys, _ = fresh_kv(layer, self._hidden, pe)
            deviation = (keys - full[0][:, :, self._where]).pow(2).sum((0, 1, 3))
            self.scores[self._where.cpu()] = deviation.float().cpu()
        return 0

    @property
    def measured(self) -> int:
        return int(self._where.numel())


def _alone_mask(
    queries: torch.Tensor, starts: torch.Tensor, context_from: int, n: int, dtype: torch.dtype
) -> torch.Tensor:
    """Additive [1, 1, q, n] mask: query i sees keys <= i before ``context_from`` or from its
    own segment's start on (the other segments masked out)."""
    keys = torch.arange(n, device=queries.device)[None]
    allowed = (keys <= queries[:, None]) & ((keys < context_from) | (keys >= starts[:, None]))
    mask = torch.zeros(allowed.shape, dtype=dtype, device=queries.device)
    return mask.masked_fill(~allowed, torch.finfo(dtype).min)[None, None]


def positional_scores(num_tokens: int) -> torch.Tensor:
    """Scores for a chunk stored without statistics: 1 at its first token falling to 0 at its
    end, scaled below any measured mass worth recomputing for (ties go to measured chunks)."""
    return 0.01 * (1.0 - torch.arange(num_tokens, dtype=torch.float32) / max(num_tokens, 1))


def encode_scores(scores: torch.Tensor | None) -> str | None:
    if scores is None or scores.numel() > MAX_SCORED_TOKENS:
        return None
    raw = scores.detach().to("cpu", torch.float16).contiguous().numpy().tobytes()
    return base64.b64encode(raw).decode("ascii")


def decode_scores(text: Any, num_tokens: int) -> torch.Tensor | None:
    """The scores of ``encode_scores``; None for a missing or malformed field."""
    if not isinstance(text, str):
        return None
    try:
        raw = base64.b64decode(text.encode("ascii"), validate=True)
    except ValueError:
        return None
    if len(raw) != 2 * num_tokens:
        return None
    return torch.frombuffer(bytearray(raw), dtype=torch.float16).float()
