"""Exact re-rotation of cached keys from the positions they were computed at to new ones.

A Llama-style model stores keys after RoPE: ``k_p = k * cos(p) + rotate_half(k) * sin(p)``
per pair of dimensions ``(i, i + rot/2)``, with ``cos``/``sin`` from the model's own rotary
embedding (rope_scaling "linear", "llama3", "yarn" and the default change only its inverse
frequencies and an attention scale that multiplies both). A chunk's keys computed at
positions ``p`` therefore move to ``q`` by undoing the model's rotation at ``p`` and applying
its rotation at ``q``; values carry no position and stay.

Exactness: ``cos``/``sin`` are the model's own, computed by its rotary module and rounded to
the keys' dtype exactly as its forward pass rounds them; the inverse is the exact inverse of
that (rounded) 2x2 map, ``(c, s) -> (c, -s) / (c^2 + s^2)``, and both steps run in float64.
So a re-rotated key differs from the key computed at ``q`` only by the rounding of the stored
key (measured ~1e-7 relative in float32), not by an accumulated angle error.

Rope types whose frequencies depend on the sequence length ("dynamic", "longrope") have no
position-only rotation to invert: ``RopeRotator`` refuses them (UnsupportedModelError).
Partial rotary embeddings (``rot < head_dim``) rotate the first ``rot`` dimensions only.

Thread-safety: a ``RopeRotator`` keeps no mutable state; calls may run concurrently.
"""

from __future__ import annotations

from typing import Any

import torch

from kvstore.rag.errors import RagArgumentError, UnsupportedModelError

__all__ = ["RopeRotator", "rotary_embedding_of"]

_LENGTH_DEPENDENT = ("dynamic", "longrope")


def rotary_embedding_of(model: Any) -> Any:
    """The model's one rotary-embedding module; UnsupportedModelError when it has none or
    several (per-layer rotary, as Gemma's local/global layers)."""
    found = [m for name, m in model.named_modules() if name.endswith("rotary_emb")]
    if len(found) != 1:
        raise UnsupportedModelError(
            f"expected one rotary_emb module, found {len(found)}: re-rotation supports "
            "Llama-style models with one RoPE for every layer"
        )
    return found[0]


class RopeRotator:
    """Moves keys between positions with ``model``'s RoPE (see the module docstring)."""

    def __init__(self, model: Any) -> None:
        self.rotary = rotary_embedding_of(model)
        config = model.config.get_text_config(decoder=True)
        parameters = getattr(config, "rope_parameters", None) or {}
        scaling = getattr(config, "rope_scaling", None) or {}
        self.rope_type = str(
            parameters.get("rope_type") or scaling.get("rope_type") or scaling.get("type")
            or getattr(self.rotary, "rope_type", "default")
        )  # fmt: skip
        if self.rope_type in _LENGTH_DEPENDENT:
            raise UnsupportedModelError(
                f"rope_type {self.rope_type!r} changes its frequencies with the sequence "
                "length: a key's rotation depends on more than its position"
            )
        heads = config.num_attention_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        """The model's ``cos``, ``sin`` ``[tokens, rot]`` at ``positions``, rounded to ``dtype``
        as its forward pass rounds them."""
        probe = torch.empty(0, dtype=dtype, device=self.rotary.inv_freq.device)
        cos, sin = self.rotary(probe, positions.reshape(1, -1).to(probe.device))
        return cos[0], sin[0]

    def rerotate(
        self, keys: torch.Tensor, from_positions: torch.Tensor, to_positions: torch.Tensor
    ) -> torch.Tensor:
        """``keys`` ``[..., tokens, head_dim]`` computed at ``from_positions`` ``[tokens]``,
        rotated as if computed at ``to_positions``; a new tensor of ``keys``' dtype."""
        tokens = keys.shape[-2]
        if keys.shape[-1] != self.head_dim:
            raise UnsupportedModelError(f"keys of head_dim {keys.shape[-1]}, model {self.head_dim}")
        for name, pos in (("from_positions", from_positions), ("to_positions", to_positions)):
            if tuple(pos.shape) != (tokens,):
                raise RagArgumentError(f"{name} must be [{tokens}], got {tuple(pos.shape)}")
        if torch.equal(from_positions, to_positions):
            return keys.clone()
        cos_p, sin_p = (t.double() for t in self.cos_sin(from_positions, keys.dtype))
        cos_q, sin_q = (t.double() for t in self.cos_sin(to_positions, keys.dtype))
        rot = cos_p.shape[-1]
        wide = keys.double()
        part = wide[..., :rot]
        # the exact inverse of the rounded rotation at p, then the rotation at q
        norm = (cos_p * cos_p + sin_p * sin_p).to(part.device)
        plain = (part * cos_p.to(part.device) - _rotate_half(part) * sin_p.to(part.device)) / norm
        moved = plain * cos_q.to(part.device) + _rotate_half(plain) * sin_q.to(part.device)
        if rot < wide.shape[-1]:
            moved = torch.cat((moved, wide[..., rot:]), dim=-1)
        return moved.to(keys.dtype)

    def shift(self, keys: torch.Tensor, from_start: int, to_start: int) -> torch.Tensor:
        """``rerotate`` for a contiguous run of tokens starting at ``from_start``, moved to
        start at ``to_start``."""
        tokens = keys.shape[-2]
        span = torch.arange(tokens)
        return self.rerotate(keys, span + from_start, span + to_start)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
