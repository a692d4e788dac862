"""kvstore.kivi_pack's arithmetic, through KiviCodec: every group against a plain float64
reference quantiser (error <= scale / 2, the same codes away from rounding ties), grouping
axes, bit widths, dtypes and values float16 cannot hold."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstore.kivi import KiviCodec
from kvstore.kivi_pack import pack_codes, packed_len, unpack_codes
from tiers import InvalidArgumentError


def _half_down(value: float) -> float:
    half = np.float16(value)
    if float(half) > value:
        half = np.nextafter(half, np.float16(-np.inf))
    return float(half)


def _half_up(value: float) -> float:
    half = np.float16(value)
    if float(half) < value:
        half = np.nextafter(half, np.float16(np.inf))
    return float(half)


def _reference_group(x: torch.Tensor, bits: int) -> tuple[torch.Tensor, float, torch.Tensor]:
    """Quantise then dequantise one group (float64) by the spec; returns (x', scale, how far
    each element's (x - zero) / scale lies from a rounding tie, in steps)."""
    levels = 2**bits - 1
    zero = _half_down(float(x.min()))
    scale = _half_up((float(x.max()) - zero) / levels)
    if scale == 0:
        return torch.full_like(x, zero), 0.0, torch.ones_like(x)
    steps = (x - zero) / scale
    codes = torch.floor(steps + 0.5).clamp(0, levels)
    return zero + codes * scale, scale, (steps - torch.floor(steps) - 0.5).abs()


def _reference(
    block: torch.Tensor, bits: int, residual: int, group: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dequantised block, per-element scale, distance from a tie) in float64, one group at a
    time: keys per channel over ``group`` tokens, values per token over ``min(group, D)``
    head-dim elements."""
    x = block.double()
    layers, _, tokens, heads, head_dim = x.shape
    quant = tokens - min(residual, tokens)
    restored, scales, ties = x.clone(), torch.zeros_like(x), torch.ones_like(x)
    value_group = min(group, head_dim)
    cells: list[tuple[int | slice, ...]] = []
    for layer in range(layers):
        for start in range(0, quant, group):
            for head in range(heads):
                for dim in range(head_dim):
                    cells.append((layer, 0, slice(start, min(start + group, quant)), head, dim))
        for token in range(quant):
            for head in range(heads):
                for start in range(0, head_dim, value_group):
                    cells.append((layer, 1, token, head, slice(start, start + value_group)))
    for cell in cells:
        restored[cell], scales[cell], ties[cell] = _reference_group(x[cell], bits)
    return restored, scales, ties


def _block(shape: tuple[int, ...], dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=generator).to(dtype)


def _round_trip(codec: KiviCodec, block: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    out = torch.empty(block.shape, dtype=dtype)
    codec.decode(codec.encode(block), out)
    return out


def _assert_within_half_step(
    block: torch.Tensor, bits: int, residual: int, group: int, decoded: torch.Tensor
) -> None:
    reference, scales, ties = _reference(block, bits, residual, group)
    error = (decoded.double() - block.double()).abs()
    # float32 arithmetic and the out dtype's own rounding come on top of scale / 2
    out_ulp = block.double().abs() * torch.finfo(decoded.dtype).eps
    assert bool((error <= scales * (0.5 + 1e-3) + out_ulp + 1e-7).all()), float(
        (error - scales / 2).max()
    )
    # the reference's codes, except where float32 rounding may tip a near tie either way
    differs = (decoded.double() - reference).abs() > scales * 1e-2 + out_ulp
    assert not bool((differs & (ties > 0.02)).any())


@pytest.mark.parametrize("bits", [2, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_round_trip_error_is_within_half_a_step_of_the_reference(
    bits: int, dtype: torch.dtype
) -> None:
    block = _block((2, 2, 45, 2, 24), dtype) * 3  # 40 tokens quantised: one ragged key group
    codec = KiviCodec(bits, residual_tokens=5, group_tokens=16)  # 24 = 16 + a ragged 8
    _assert_within_half_step(block, bits, 5, 16, _round_trip(codec, block, torch.float32))


@settings(max_examples=25, deadline=None)
@given(
    bits=st.sampled_from([2, 4]),
    layers=st.integers(1, 2),
    tokens=st.integers(1, 40),
    heads=st.integers(1, 2),
    head_dim=st.integers(1, 12),
    residual=st.integers(0, 45),
    group=st.integers(1, 20),
    magnitude=st.sampled_from([1e-3, 1.0, 300.0]),
    offset=st.sampled_from([0.0, 7.0, -1000.0]),
    seed=st.integers(0, 2**16),
)
def test_property_matches_the_reference_quantiser(
    bits: int,
    layers: int,
    tokens: int,
    heads: int,
    head_dim: int,
    residual: int,
    group: int,
    magnitude: float,
    offset: float,
    seed: int,
) -> None:
    block = _block((layers, 2, tokens, heads, head_dim), torch.float32, seed) * magnitude
    block += offset
    codec = KiviCodec(bits, residual, group)
    decoded = _round_trip(codec, block, torch.float32)
    _assert_within_half_step(block, bits, residual, group, decoded)
    quant = tokens - min(residual, tokens)
    assert torch.equal(decoded[:, :, quant:], block[:, :, quant:])


@pytest.mark.parametrize("bits", [2, 4])
def test_narrow_float32_groups_far_from_zero(bits: int) -> None:
    # a range of 1e-6 at 1.0: a handful of float32 ulps per step; every group's min is 1.0
    block = 1 + _block((1, 2, 40, 2, 16), torch.float32).abs() * 1e-6
    block[:, :, ::2] = 1.0
    decoded = _round_trip(KiviCodec(bits, 0, 16), block, torch.float32)
    _assert_within_half_step(block, bits, 0, 16, decoded)


def test_float8_blocks_round_trip() -> None:
    block = _block((1, 2, 40, 2, 16), torch.float32).to(torch.float8_e4m3fn)
    decoded = _round_trip(KiviCodec(4, 8, 16), block, torch.float32)
    assert torch.equal(decoded[:, :, 32:], block[:, :, 32:].float())
    _assert_within_half_step(block.float(), 4, 8, 16, decoded)


def test_constant_groups_are_exact() -> None:
    block = torch.full((1, 2, 64, 2, 32), 0.3, dtype=torch.bfloat16)
    block[:, :, :32] = 0
    assert torch.equal(_round_trip(KiviCodec(2, 0, 32), block, torch.bfloat16), block)


def _max_error(codec: KiviCodec, block: torch.Tensor) -> float:
    return float((_round_trip(codec, block, torch.float32) - block.float()).abs().max())


def _outlier_keys(seed: int = 1) -> torch.Tensor:
    block = _block((2, 2, 64, 2, 32), torch.float32, seed)
    block[:, 0, :, :, 3] *= 50  # KIVI's observation: a few key channels are large
    return block


@pytest.mark.parametrize("structured", [False, True])
def test_two_bits_err_more_than_four(structured: bool) -> None:
    block = _outlier_keys() if structured else _block((2, 2, 64, 2, 32), torch.bfloat16)
    assert _max_error(KiviCodec(2, 0, 32), block) > 2 * _max_error(KiviCodec(4, 0, 32), block)


def test_keys_are_grouped_per_channel_and_values_per_token() -> None:
    block = _outlier_keys()
    block[:, 1, 10] *= 50  # one large value token
    decoded = _round_trip(KiviCodec(4, 0, 32), block, torch.float32)
    error = (decoded - block).abs()
    # the outliers widen only their own channel's (keys) or token's (values) range
    normal_keys = torch.ones(32, dtype=torch.bool)
    normal_keys[3] = False
    assert float(error[:, 0, :, :, normal_keys].max()) < 0.5
    assert float(error[:, 1, torch.arange(64) != 10].max()) < 0.5
    assert float(error[:, 0, :, :, 3].max()) > 1.0


@pytest.mark.parametrize("source", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("target", [torch.bfloat16, torch.float32])
def test_decode_into_bf16_and_fp32(source: torch.dtype, target: torch.dtype) -> None:
    block = _block((2, 2, 48, 2, 16), source)
    codec = KiviCodec(4, 16, 16)
    decoded = _round_trip(codec, block, target)
    assert decoded.dtype == target
    _assert_within_half_step(block, 4, 16, 16, decoded)
    assert torch.equal(decoded[:, :, 32:], block[:, :, 32:].to(target))


@pytest.mark.parametrize("value", [math.inf, math.nan, 70000.0])
def test_values_beyond_float16_are_refused(value: float) -> None:
    block = torch.zeros(1, 2, 40, 2, 16)
    block[0, 1, 3, 1, 5] = value
    with pytest.raises(InvalidArgumentError):
        KiviCodec(4, 8).encode(block)


@pytest.mark.parametrize(
    ("bits", "codes", "packed"),
    [(4, [1, 2, 3], [0x21, 0x03]), (2, [1, 2, 3, 0, 1], [0x39, 0x01])],
)
def test_pack_puts_code_i_at_bit_i_mod_per_byte_times_bits(
    bits: int, codes: list[int], packed: list[int]
) -> None:
    source = torch.tensor([codes], dtype=torch.uint8)
    out = torch.empty(1, packed_len(len(codes), bits), dtype=torch.uint8)
    pack_codes(source, bits, out)
    assert out[0].tolist() == packed
    assert torch.equal(unpack_codes(out, bits, len(codes)), source)
