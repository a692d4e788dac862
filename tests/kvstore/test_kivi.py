"""KiviCodec: error bounds against a plain reference quantiser, the residual window, sizes,
the batch helpers and refusals of bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstore import kivi
from kvstore.fingerprint import ModelFingerprint
from kvstore.kivi import KiviCodec
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


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("residual", [0, 7, 40])
def test_residual_window_is_bit_exact(dtype: torch.dtype, residual: int) -> None:
    block = _block((2, 2, 40, 2, 16), dtype)
    decoded = _round_trip(KiviCodec(4, residual, 8), block, dtype)
    quant = 40 - min(residual, 40)
    raw = block[:, :, quant:].view(torch.uint8)
    assert torch.equal(decoded[:, :, quant:].view(torch.uint8), raw)
    if residual >= 40:  # nothing quantised: the whole block round-trips
        assert torch.equal(decoded, block)
    else:
        assert not torch.equal(decoded[:, :, :quant], block[:, :, :quant])


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


@pytest.mark.parametrize(
    ("layers", "tokens", "heads", "head_dim", "dtype"),
    [(2, 32, 2, 32, "bfloat16"), (3, 50, 3, 20, "float32"), (1, 7, 1, 5, "float16")],
)
@pytest.mark.parametrize("bits", [2, 4])
@pytest.mark.parametrize("residual", [0, 5, 64])
def test_encoded_bytes_is_the_size_encode_makes(
    layers: int, tokens: int, heads: int, head_dim: int, dtype: str, bits: int, residual: int
) -> None:
    fingerprint = ModelFingerprint("m", dtype, layers, tokens, heads, head_dim)
    codec = KiviCodec(bits, residual, 16)
    encoded = codec.encode(torch.zeros(fingerprint.block_shape, dtype=fingerprint.torch_dtype))
    assert encoded.dtype == torch.uint8 and encoded.dim() == 1
    assert encoded.numel() == codec.encoded_bytes(fingerprint)
    assert encoded.numel() % 8 == 0


@pytest.mark.parametrize(("bits", "ratio"), [(4, 0.3555), (2, 0.2383)])
def test_bytes_ratio_of_a_7b_like_block_is_the_documented_one(bits: int, ratio: float) -> None:
    fingerprint = ModelFingerprint("7b", "bfloat16", 32, 512, 8, 128)
    codec = KiviCodec(bits)  # defaults: 32 residual tokens, groups of 32
    # per quantised element bits/8 + 4/32 bytes of scale and zero; 32 of 512 tokens raw
    quantised = 480 * (bits / 8 + 4 / 32) / 2
    expected = (quantised + 32) / 512
    measured = codec.encoded_bytes(fingerprint) / fingerprint.block_bytes
    assert measured == pytest.approx(expected, abs=1e-4)
    assert measured == pytest.approx(ratio, abs=1e-4)
    small = ModelFingerprint("tiny", "bfloat16", 2, 32, 2, 32)  # residual covers the block
    assert codec.encoded_bytes(small) == small.block_bytes + 24


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


def test_decode_fills_a_strided_out() -> None:
    block = _block((1, 2, 40, 2, 16), torch.bfloat16)
    codec = KiviCodec(2, 8, 16)
    whole = torch.zeros(3, 1, 2, 40, 2, 16, dtype=torch.float32)
    codec.decode(codec.encode(block), whole[1])
    direct = _round_trip(codec, block, torch.float32)
    assert torch.equal(whole[1], direct) and not whole[0].any() and not whole[2].any()


@pytest.mark.parametrize("row_bytes_padding", [0, 3, 4096])
def test_decode_reads_rows_of_a_padded_buffer(row_bytes_padding: int) -> None:
    blocks = _block((3, 2, 2, 40, 2, 16), torch.bfloat16)
    codec = KiviCodec(4, 8, 16)
    encoded = codec.encode_many(blocks)
    staging = torch.zeros(3, encoded.shape[1] + row_bytes_padding, dtype=torch.uint8)
    staging[:, : encoded.shape[1]] = encoded  # as a store reads page-padded objects
    expected = torch.empty(blocks.shape, dtype=torch.float32)
    codec.decode_many(encoded, expected)
    decoded = torch.empty(blocks.shape, dtype=torch.float32)
    codec.decode_many(staging[:, : encoded.shape[1]], decoded)
    assert torch.equal(decoded, expected)


@pytest.mark.parametrize("bits", [2, 4])
def test_batch_helpers_equal_the_single_block_path(bits: int) -> None:
    blocks = _block((5, 2, 2, 40, 2, 24), torch.bfloat16)
    codec = KiviCodec(bits, 8, 16)
    encoded = codec.encode_many(blocks)
    assert encoded.shape == (5, encoded.shape[1])
    for index in range(5):
        assert torch.equal(encoded[index], codec.encode(blocks[index]))
    out = torch.empty(blocks.shape, dtype=torch.float32)
    codec.decode_many(encoded, out)
    for index in range(5):
        single = torch.empty(blocks.shape[1:], dtype=torch.float32)
        codec.decode(encoded[index], single)
        assert torch.equal(out[index], single)
    codec.decode_many(encoded[:0], out[:0])  # an empty batch is a no-op


def test_describe_names_the_parameters() -> None:
    assert KiviCodec(2, 16, 64).describe() == {"bits": 2, "residual_tokens": 16, "group_tokens": 64}


@pytest.mark.parametrize(
    "kwargs",
    [
        {"bits": 3},
        {"bits": 8},
        {"bits": True},
        {"residual_tokens": -1},
        {"group_tokens": 0},
        {"group_tokens": 1.5},
    ],
)
def test_bad_parameters_are_refused(kwargs: dict[str, object]) -> None:
    with pytest.raises(InvalidArgumentError):
        KiviCodec(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "block",
    [
        torch.zeros(2, 40, 2, 16),  # no K/V axis
        torch.zeros(1, 3, 40, 2, 16),  # K/V axis of 3
        torch.zeros(1, 2, 40, 2, 16, dtype=torch.int32),
        torch.zeros(1, 2, 0, 2, 16),
    ],
)
def test_bad_blocks_are_refused(block: torch.Tensor) -> None:
    with pytest.raises(InvalidArgumentError):
        KiviCodec().encode(block)


@pytest.mark.parametrize("value", [math.inf, math.nan, 70000.0])
def test_values_beyond_float16_are_refused(value: float) -> None:
    block = torch.zeros(1, 2, 40, 2, 16)
    block[0, 1, 3, 1, 5] = value
    with pytest.raises(InvalidArgumentError):
        KiviCodec(4, 8).encode(block)


def test_bad_data_is_refused() -> None:
    codec = KiviCodec(4, 8, 16)
    block = _block((1, 2, 40, 2, 16), torch.bfloat16)
    encoded = codec.encode(block)
    out = torch.empty(block.shape)
    with pytest.raises(InvalidArgumentError):  # short
        codec.decode(encoded[:-8], out)
    with pytest.raises(InvalidArgumentError):  # not bytes
        codec.decode(encoded.to(torch.int32), out)
    with pytest.raises(InvalidArgumentError):  # another geometry with the same byte count
        codec.decode(encoded, torch.empty(1, 2, 40, 16, 2))
    with pytest.raises(InvalidArgumentError):  # another codec's bytes
        KiviCodec(4, 8, 8).decode(encoded, out)
    with pytest.raises(InvalidArgumentError):  # a corrupted header
        damaged = encoded.clone()
        damaged[0] ^= 1
        codec.decode(damaged, out)
    with pytest.raises(InvalidArgumentError):  # rows and blocks disagree
        codec.decode_many(encoded.unsqueeze(0), torch.empty(2, *block.shape))
    with pytest.raises(InvalidArgumentError):  # an integer out
        codec.decode(encoded, torch.empty(block.shape, dtype=torch.int32))


@pytest.mark.parametrize(
    ("shape", "bits", "chunk_elements"),
    [
        ((3, 4, 2, 40, 2, 24), 4, 2000),  # runs of 1 layer (a layer is 3840 elements)
        ((3, 4, 2, 39, 2, 4), 2, 2000),  # runs of 3 + 1 layers
        ((6, 4, 2, 41, 1, 3), 4, 2000),  # runs of 2 whole blocks
        ((3, 4, 2, 41, 1, 3), 4, 300),  # a layer's codes end mid-byte: whole blocks, not layers
    ],
)
def test_runs_of_layers_or_blocks_equal_one_pass(
    monkeypatch: pytest.MonkeyPatch, shape: tuple[int, ...], bits: int, chunk_elements: int
) -> None:
    blocks = _block(shape, torch.bfloat16)
    codec = KiviCodec(bits, 8, 16)
    whole = codec.encode_many(blocks)
    decoded_whole = torch.empty(shape, dtype=torch.float32)
    codec.decode_many(whole, decoded_whole)
    monkeypatch.setattr(kivi, "_CHUNK_ELEMENTS", chunk_elements)
    assert torch.equal(codec.encode_many(blocks), whole)
    decoded = torch.empty(shape, dtype=torch.float32)
    codec.decode_many(whole, decoded)
    assert torch.equal(decoded, decoded_whole)


def test_padding_between_sections_is_zero() -> None:
    codec = KiviCodec(4, 8, 16)
    shape = (1, 2, 41, 1, 3)  # 33 x 3 quantised codes: 50 bytes, then 6 of padding
    layout = codec._layout_for(shape, torch.float32)
    gaps = [(o + n, kivi._align8(o + n)) for o, n in layout.sections]
    assert any(start < stop for start, stop in gaps)
    for _ in range(3):  # fresh buffers each time, so garbage would show
        encoded = codec.encode(_block(shape, torch.float32) + 100)
        for start, stop in gaps:
            assert not encoded[start:stop].any()
