"""KiviCodec: the encoded layout's sizes and padding, the residual window, the batch helpers
and runs of layers, and refusals of bad input (the arithmetic: test_kivi_pack.py)."""

from __future__ import annotations

import pytest
import torch

from kvstore import kivi
from kvstore.fingerprint import ModelFingerprint
from kvstore.kivi import KiviCodec
from tiers import InvalidArgumentError


def _block(shape: tuple[int, ...], dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=generator).to(dtype)


def _round_trip(codec: KiviCodec, block: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    out = torch.empty(block.shape, dtype=dtype)
    codec.decode(codec.encode(block), out)
    return out


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
