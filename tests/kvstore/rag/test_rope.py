"""kvstore.rag.rope: a chunk's keys computed alone at position p and re-rotated to q equal the
keys of the same chunk computed alone at q.

Tolerance: float32, ``rtol=1e-5, atol=1e-5`` on keys of magnitude ~1-5; the re-rotation runs
in float64 from the model's own rounded cos/sin, so what is left is the forward pass's own
float32 rounding of each key (measured max |diff| ~1e-6). Values carry no position and must
be bit-identical.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

pytest.importorskip("transformers", reason="kvstore.rag needs transformers")

from kvstore.rag.errors import RagArgumentError, UnsupportedModelError
from kvstore.rag.rope import RopeRotator

TOL = {"rtol": 1e-5, "atol": 1e-5}


def _llama(**overrides: Any) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    settings: dict[str, Any] = {
        "vocab_size": 300,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 8192,
    }
    settings.update(overrides)
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**settings)).eval()


def _alone(model: Any, ids: torch.Tensor, start: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    positions = torch.arange(start, start + ids.shape[1]).unsqueeze(0)
    with torch.no_grad():
        out = model(input_ids=ids, position_ids=positions, use_cache=True)
    return [(layer.keys[0], layer.values[0]) for layer in out.past_key_values.layers]


ROPE_VARIANTS = [
    {},
    {"rope_parameters": {"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0}},
    {
        "rope_parameters": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 1024,
            "rope_theta": 500000.0,
        }
    },
    {
        "rope_parameters": {
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 2048,
            "rope_theta": 10000.0,
        }
    },
]


@pytest.mark.parametrize("variant", ROPE_VARIANTS, ids=["default", "linear", "llama3", "yarn"])
@pytest.mark.parametrize(("p", "q"), [(0, 37), (500, 3), (17, 6000)])
def test_rerotated_chunk_equals_chunk_computed_at_q(variant: dict, p: int, q: int) -> None:
    model = _llama(**variant)
    rotator = RopeRotator(model)
    ids = torch.randint(0, 300, (1, 24), generator=torch.Generator().manual_seed(p + q))
    at_p, at_q = _alone(model, ids, p), _alone(model, ids, q)
    for layer, ((keys_p, values_p), (keys_q, values_q)) in enumerate(zip(at_p, at_q, strict=True)):
        moved = rotator.shift(keys_p, p, q)
        torch.testing.assert_close(moved, keys_q, **TOL)
        torch.testing.assert_close(values_p, values_q, **TOL)
        if layer == 0:  # no attention below: a value depends on its token alone
            assert torch.equal(values_p, values_q)
        # the test could fail: keys left at p are far from keys at q
        assert (keys_p - keys_q).abs().max() > 1e-2


def test_scattered_positions_and_a_round_trip() -> None:
    model = _llama()
    rotator = RopeRotator(model)
    keys = torch.randn(2, 10, 16)
    there = torch.tensor([5, 9, 100, 101, 102, 7, 3000, 4, 4, 0])
    back = rotator.rerotate(
        rotator.rerotate(keys, torch.arange(10), there), there, torch.arange(10)
    )
    torch.testing.assert_close(back, keys, rtol=1e-6, atol=1e-6)


def test_length_dependent_rope_is_refused() -> None:
    model = _llama(rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4})
    with pytest.raises(UnsupportedModelError, match="dynamic"):
        RopeRotator(model)


def test_bad_shapes_are_errors() -> None:
    rotator = RopeRotator(_llama())
    with pytest.raises(UnsupportedModelError):
        rotator.shift(torch.randn(2, 4, 8), 0, 1)  # head_dim 16, not 8
    with pytest.raises(RagArgumentError, match="to_positions"):
        rotator.rerotate(torch.randn(2, 4, 16), torch.arange(4), torch.arange(3))
