"""kvstore.vllm.layout against vLLM's own CPU cache-write op, run by pytest INSIDE .venv-vllm.

Not collected by the main test run (no ``test_`` prefix): test_vllm_contracts.py runs it. For
each ISA vLLM's CPU attention picks (``vec`` for float32/float16, ``amx`` for bfloat16 where
the CPU has AMX), K and V written by ``cpu_attn_reshape_and_cache`` must come back from
``PagedLayout.gather`` in tierkit's ``[K/V, token, head, dim]`` order, and a scatter must
rebuild the paged blocks byte for byte.
"""

from __future__ import annotations

import pytest
import torch
from vllm import _custom_ops as ops
from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

from kvstore import ModelFingerprint
from kvstore.vllm.layout import PagedLayout, layer_order

TOKENS, HEADS = 32, 2


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("head_dim", [32, 64])
def test_gather_reads_what_vllm_wrote_and_scatter_writes_it_back(dtype: str, head_dim: int) -> None:
    fingerprint = ModelFingerprint(model="m", dtype=dtype, num_layers=1, block_tokens=TOKENS,
                                   num_kv_heads=HEADS, head_dim=head_dim)  # fmt: skip
    torch_dtype = fingerprint.torch_dtype
    layout = PagedLayout(fingerprint, cpu_isa=_get_attn_isa(torch_dtype, TOKENS, head_dim))
    paged = torch.zeros((8, HEADS, TOKENS, 2 * head_dim), dtype=torch_dtype)
    key_cache, value_cache = paged.view(8, HEADS, 2 * TOKENS, head_dim).chunk(2, dim=2)
    generator = torch.Generator().manual_seed(head_dim)
    key, value = (torch.randn((2 * TOKENS, HEADS, head_dim), generator=generator).to(torch_dtype)
                  for _ in range(2))  # fmt: skip
    slots = torch.arange(2 * TOKENS) + 3 * TOKENS  # blocks 3 and 4
    ops.cpu_attn_reshape_and_cache(key, value, key_cache, value_cache, slots, layout.cpu_isa)

    blocks = layout.gather(paged, torch.tensor([3, 4]))
    assert blocks.shape == (2, *fingerprint.layer_shape)
    assert torch.equal(blocks[:, 0].reshape(key.shape), key)
    assert torch.equal(blocks[:, 1].reshape(value.shape), value)

    rebuilt = torch.zeros_like(paged)
    layout.scatter(rebuilt, torch.tensor([6, 1]), blocks)
    assert torch.equal(rebuilt[6], paged[3]) and torch.equal(rebuilt[1], paged[4])
    assert not rebuilt[[0, 2, 3, 4, 5, 7]].any()


def test_layers_are_ordered_by_their_number() -> None:
    names = ["model.layers.10.self_attn.attn", "model.layers.2.self_attn.attn",
             "model.layers.0.self_attn.attn"]  # fmt: skip
    assert layer_order(names) == {names[2]: 0, names[1]: 1, names[0]: 2}
