"""Group quantisation and bit packing: the arithmetic under ``kvstore.kivi``.

``quantise_groups`` quantises one axis of a float tensor in groups of ``group`` consecutive
elements; when the axis length is not a multiple of ``group`` the last group is shorter and
has its own scale and zero (full groups and the ragged one are two broadcast views, so
nothing is padded or copied for it). Per group, asymmetric:

    zero  = min rounded DOWN to float16                   (zero <= every element)
    scale = (max - zero) / levels rounded UP to float16   (zero + levels * scale >= max)
    code  = floor((x - zero) / scale + 0.5)               (code 0 where scale == 0)
    x'    = zero + code * scale                           (float32)

with ``levels = 2**bits - 1``. Rounding the zero down and the scale up keeps every element
inside the representable range, so codes need no clamp and ``|x - x'| <= scale / 2`` (up to
float32 rounding) holds for the stored float16 pair, not only for exact ones. ``scale == 0``
only where every element equals ``zero``, so those groups are exact. A group whose min or
max is not finite in float16 (|x| > 65504, inf, nan) cannot be represented:
``InvalidArgumentError``.

``pack_codes`` packs codes of ``bits`` bits (2 or 4) along the last axis, ``8 // bits`` codes
per byte, code ``i`` at bit offset ``(i % per_byte) * bits`` of byte ``i // per_byte`` (little
end first); a short last byte is zero-padded. ``unpack_codes`` is its inverse.

``encode_layers`` / ``decode_layers`` apply these to a run of whole layers of one or more
blocks, reading or writing the seven byte sections that ``kvstore.kivi`` documents.

Thread-safety: pure functions of their inputs; no shared state.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from tiers import InvalidArgumentError

__all__ = [
    "decode_layers",
    "dequantise_groups",
    "encode_layers",
    "pack_codes",
    "packed_len",
    "quantise_groups",
    "unpack_codes",
]

_NEG_INF = float("-inf")
_POS_INF = float("inf")
_HALF_MAX = 65504.0  # the largest finite float16


def packed_len(count: int, bits: int) -> int:
    """Bytes holding ``count`` codes of ``bits`` bits."""
    per_byte = 8 // bits
    return -(-count // per_byte)


def _round_half(values: torch.Tensor, toward: float) -> torch.Tensor:
    """float32 -> float16 rounded toward -inf (``toward=-inf``) or +inf (``toward=+inf``)."""
    half = values.to(torch.float16)
    wrong = half.float() < values if toward > 0 else half.float() > values
    if bool(wrong.any()):
        stepped = torch.nextafter(half, torch.full_like(half, toward))
        half = torch.where(wrong, stepped, half)
    return half


def _parts(x: torch.Tensor, axis: int, group: int) -> list[tuple[torch.Tensor, int, int]]:
    """Views of ``x`` split along ``axis`` into ``(view, first_group, groups)``: the full
    groups as ``[..., groups, group, ...]`` and a ragged tail as ``[..., 1, rest, ...]``."""
    n = x.shape[axis]
    full = n // group
    parts = []
    if full:
        parts.append((x.narrow(axis, 0, full * group).unflatten(axis, (full, group)), 0, full))
    if n > full * group:
        parts.append((x.narrow(axis, full * group, n - full * group).unsqueeze(axis), full, 1))
    return parts


def _fold(x: torch.Tensor, dim: int, op: Callable[..., torch.Tensor]) -> torch.Tensor:
    """Reduce ``dim`` of ``x`` with ``op`` (``torch.minimum`` / ``maximum``) by halving it.

    Elementwise halves run 1.3x (inner axis) to 3.5x (outer axis) as fast as ``aminmax`` on
    these shapes; both propagate nan, which the range check then refuses."""
    while x.shape[dim] > 1:
        size = x.shape[dim]
        half = size // 2
        folded = op(x.narrow(dim, 0, half), x.narrow(dim, half, half))
        if size % 2:
            first = folded.narrow(dim, 0, 1)
            op(first, x.narrow(dim, size - 1, 1), out=first)
        x = folded
    return x.squeeze(dim)


def _group_stats(stats: torch.Tensor, axis: int, first: int, groups: int) -> torch.Tensor:
    """Per-group ``stats [..., ngroups, ...]`` shaped to broadcast against one part's view."""
    return stats.narrow(axis, first, groups).unsqueeze(axis + 1)


def quantise_groups(
    x: torch.Tensor, bits: int, group: int, axis: int, codes: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise ``x`` in groups of ``group`` along ``axis`` into ``codes`` (uint8, ``x``'s
    shape); returns float16 (scale, zero) shaped as ``x`` with ``axis`` of ``ceil(n / group)``.
    ``x`` is only read."""
    if x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        x = x.float()  # float8: no min/max or arithmetic kernels of its own
    levels = (1 << bits) - 1
    x_parts = _parts(x, axis, group)
    low = torch.cat([_fold(part, axis + 1, torch.minimum) for part, _, _ in x_parts], dim=axis)
    high = torch.cat([_fold(part, axis + 1, torch.maximum) for part, _, _ in x_parts], dim=axis)
    low, high = low.float(), high.float()
    # Comparisons with nan are false, so this also rejects nan; within +-65504 both the
    # rounded-down zero and the rounded-up scale (span / 3 at most) stay finite.
    if not bool(((low >= -_HALF_MAX) & (high <= _HALF_MAX)).all()):
        raise InvalidArgumentError(
            "KIVI: a group's values are not finite in float16 (|x| > 65504, inf or nan)"
        )
    zero = _round_half(low, _NEG_INF)
    scale = _round_half((high - zero.float()) / levels, _POS_INF)
    zero32, scale32 = zero.float(), scale.float()
    inverse = torch.where(scale32 > 0, scale32.reciprocal(), torch.zeros_like(scale32))
    # code = floor((x - zero) / scale + 0.5). zero <= x <= zero + levels * scale, so the sum
    # lies in [0.5, levels + 0.5] up to rounding and the float -> uint8 cast needs no clamp
    # (a negative float cast to uint8 is undefined). 16-bit inputs take one fused pass, bias +
    # x * inverse: a group spans at least one input ulp, so |zero| / scale <= levels * 2**11
    # and float32 rounding moves the sum by < 1/100. A float32 group can be narrow next to its
    # offset (|zero| / scale up to levels * 2**24), where the fused sum could round below 0;
    # subtracting first is exact there (Sterbenz), so float32 takes that path.
    fused = x.dtype != torch.float32
    bias = torch.addcmul(torch.full_like(zero32, 0.5), zero32, inverse, value=-1)
    for (part, first, groups), (code_part, _, _) in zip(
        x_parts, _parts(codes, axis, group), strict=True
    ):
        part_inverse = _group_stats(inverse, axis, first, groups)
        if fused:
            shifted = torch.addcmul(_group_stats(bias, axis, first, groups), part, part_inverse)
        else:
            shifted = part - _group_stats(zero32, axis, first, groups)
            shifted.mul_(part_inverse).add_(0.5)
        code_part.copy_(shifted)
    return scale, zero


def dequantise_groups(
    codes: torch.Tensor,
    scale: torch.Tensor,
    zero: torch.Tensor,
    group: int,
    axis: int,
    out: torch.Tensor,
) -> None:
    """Inverse of ``quantise_groups``: ``out`` (``codes``' shape, any float dtype, any
    strides) = zero + code * scale, computed in float32."""
    zero32, scale32 = zero.float(), scale.float()
    for (code_part, first, groups), (out_part, _, _) in zip(
        _parts(codes, axis, group), _parts(out, axis, group), strict=True
    ):
        torch.addcmul(
            _group_stats(zero32, axis, first, groups),
            code_part,
            _group_stats(scale32, axis, first, groups),
            out=out_part,
        )


def pack_codes(codes: torch.Tensor, bits: int, out: torch.Tensor) -> None:
    """uint8 codes ``[n, m]`` (each < 2**bits) -> ``out`` uint8 ``[n, packed_len(m, bits)]``."""
    per_byte = 8 // bits
    m = codes.shape[-1]
    short = -m % per_byte
    if short:
        codes = torch.cat([codes, codes.new_zeros(*codes.shape[:-1], short)], dim=-1)
    lanes = codes.reshape(*codes.shape[:-1], -1, per_byte)
    torch.bitwise_or(lanes[..., 0], lanes[..., 1] << bits, out=out)
    for lane in range(2, per_byte):
        out.bitwise_or_(lanes[..., lane] << (lane * bits))


def unpack_codes(packed: torch.Tensor, bits: int, count: int) -> torch.Tensor:
    """uint8 ``[..., packed_len(count, bits)]`` -> codes uint8 ``[..., count]``."""
    per_byte = 8 // bits
    shifts = torch.arange(0, 8, bits, dtype=torch.uint8, device=packed.device)
    mask = (1 << bits) - 1
    lanes = (packed.unsqueeze(-1) >> shifts).bitwise_and_(mask)
    return lanes.reshape(*packed.shape[:-1], packed.shape[-1] * per_byte)[..., :count]


def encode_layers(
    blocks: torch.Tensor,
    quant: int,
    bits: int,
    groups: tuple[int, int],
    sections: Sequence[torch.Tensor],
) -> None:
    """Encode ``blocks [m, l, 2, T, H, D]`` (its first ``quant`` tokens quantised with key
    and value group sizes ``groups``) into ``sections``, seven uint8 ``[m, bytes]`` views."""
    count = blocks.shape[0]
    if quant:
        codes = torch.empty(
            (count, blocks.shape[1], quant, *blocks.shape[4:]),
            dtype=torch.uint8,
            device=blocks.device,
        )
        # keys: groups along the token axis (2 of [m, l, Q, H, D]); values: along head_dim
        for kv, axis in ((0, 2), (1, 4)):
            scale, zero = quantise_groups(blocks[:, :, kv, :quant], bits, groups[kv], axis, codes)
            pack_codes(codes.reshape(count, -1), bits, sections[3 * kv])
            sections[3 * kv + 1].copy_(scale.reshape(count, -1).view(torch.uint8))
            sections[3 * kv + 2].copy_(zero.reshape(count, -1).view(torch.uint8))
    residual = blocks[:, :, :, quant:].contiguous().view(torch.uint8)
    sections[6].copy_(residual.reshape(count, -1))


def decode_layers(
    sections: Sequence[torch.Tensor],
    quant: int,
    bits: int,
    groups: tuple[int, int],
    residual_dtype: torch.dtype,
    out: torch.Tensor,
) -> None:
    """Inverse of ``encode_layers``: fill ``out [m, l, 2, T, H, D]`` from ``sections``."""
    count, layers, _, tokens, heads, head_dim = out.shape
    if quant:
        code_shape = [count, layers, quant, heads, head_dim]
        for kv, axis in ((0, 2), (1, 4)):
            packed, scale, zero = sections[3 * kv : 3 * kv + 3]
            codes = unpack_codes(packed, bits, layers * quant * heads * head_dim)
            stats_shape = list(code_shape)
            stats_shape[axis] = -(-code_shape[axis] // groups[kv])
            dequantise_groups(
                codes.reshape(code_shape),
                scale.view(torch.float16).reshape(stats_shape),
                zero.view(torch.float16).reshape(stats_shape),
                groups[kv],
                axis,
                out[:, :, kv, :quant],
            )
    if quant < tokens:
        residual = sections[6].view(residual_dtype)
        out[:, :, :, quant:].copy_(
            residual.reshape(count, layers, 2, tokens - quant, heads, head_dim)
        )
