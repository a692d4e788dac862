"""KiviCodec: KIVI-style 2/4-bit quantisation of one KV block (arXiv 2402.02750), off by default.

A block is ``[L, 2, T, H, D]`` (layers, K/V, tokens, kv heads, head dim; see
``kvstore.fingerprint``). Its first ``Q = T - min(residual_tokens, T)`` tokens are quantised;
the last ``T - Q`` stay in the block's own dtype, bit-exact (KIVI's full-precision residual).
With ``residual_tokens >= T`` nothing is quantised (the encoding is header + raw bytes).

* Keys, per channel: each of the ``H * D`` channels is quantised in groups of ``G =
  group_tokens`` consecutive tokens (KIVI: keys have outlier channels, so a channel shares
  one range). Values, per token: each token of each head is quantised in groups of ``Gv =
  min(G, D)`` consecutive head-dim elements. A last group shorter than its size (``Q % G`` or
  ``D % Gv`` left over) is a ragged group with its own scale and zero.
* Asymmetric per group, rules in ``kvstore.kivi_pack``: zero = min rounded down, scale =
  (max - zero) / (2**bits - 1) rounded up, both **float16**. Codes are computed against the
  stored (rounded) pair, so the error is <= scale / 2 either way; what the format's precision
  costs is range: the rounded-down zero sits up to one ulp below the min, 2**-10 * |min| in
  float16 but 2**-7 * |min| in bfloat16, which widens the step of a narrow group with a large
  offset (a biased channel) by up to 8x more. K/V activations sit far inside float16's
  +-65504; a block beyond it (or with inf / nan outside the residual) is refused with
  ``InvalidArgumentError``. Decoding into a 16-bit ``out`` adds that dtype's rounding.

Encoded bytes (one spec for ``encode`` and ``decode``; little-endian; every section starts at
an offset rounded up to a multiple of 8, zero padding between; the total is a multiple of 8):

====  ==========================================================================================
 0    header, 24 bytes: ``b"KIVI"``, u8 version (1), u8 bits, u8 dtype code (0 float32,
      1 float16, 2 bfloat16, 3 float8_e4m3fn), u8 0, then u16 L, T, H, D, G, ``T - Q``,
      then 4 zero bytes. ``decode`` rejects data whose header differs from what ``out`` and
      the codec imply.
 1    key codes: ``[L, Q, H, D]`` C order (the block's own order), packed ``8 // bits``
      codes per byte, code ``i`` at bit ``(i % (8 // bits)) * bits`` of byte
      ``i // (8 // bits)``; the last byte's unused bits are 0.
 2    key scales, float16 ``[L, ceil(Q / G), H, D]``: group ``g`` of channel ``(h, d)``
      covers tokens ``g * G`` up to ``min((g + 1) * G, Q)``.
 3    key zeros, float16, same shape.
 4    value codes: ``[L, Q, H, D]`` C order, packed as the key codes.
 5    value scales, float16 ``[L, Q, H, ceil(D / Gv)]``: group ``g`` of token ``t``, head
      ``h`` covers head-dim elements ``g * Gv`` up to ``min((g + 1) * Gv, D)``.
 6    value zeros, float16, same shape.
 7    residual: the raw bytes of ``block[:, :, Q:]`` (``[L, 2, T - Q, H, D]``, C order) in
      the block's dtype.
====  ==========================================================================================

Bytes ratio vs the raw block (header and padding aside): per quantised element ``bits / 8``
plus ``4 / G`` bytes of scale + zero, against ``itemsize`` raw. A 7B-like bfloat16 block (L=32,
T=512, H=8, D=128) with the defaults (R=32, G=32) encodes to 0.355x at 4 bits and 0.238x
at 2 bits (0.3125x and 0.1875x of the quantised part, the rest is the 32-token residual).
With 32-token blocks and the default residual nothing is quantised (1.0x): use
``residual_tokens=0`` there.

Thread-safety: a codec is immutable after construction; ``encode``/``decode`` allocate their
own buffers, so one codec may serve many threads (each ``decode`` writes only its ``out``).
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from kvstore.fingerprint import ModelFingerprint
from kvstore.kivi_pack import decode_layers, encode_layers, packed_len
from tiers import InvalidArgumentError

__all__ = ["KiviCodec"]

_MAGIC = b"KIVI"
_VERSION = 1
_HEADER_BYTES = 24
_DTYPE_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2, torch.float8_e4m3fn: 3}
_CODE_DTYPES = {code: dtype for dtype, code in _DTYPE_CODES.items()}
_U16_MAX = 0xFFFF
_CHUNK_ELEMENTS = 1 << 20  # per run of layers or blocks; see _chunks


def _align8(offset: int) -> int:
    return -(-offset // 8) * 8


@dataclass(frozen=True)
class _Layout:
    """Offsets and sizes (bytes) of one encoded block's sections."""

    shape: tuple[int, int, int, int, int]
    dtype: torch.dtype
    bits: int
    group_tokens: int
    quant_tokens: int  # Q
    value_group: int  # Gv
    sections: tuple[tuple[int, int], ...]  # (offset, size) of sections 1..7
    total_bytes: int
    header: bytes

    @property
    def groups(self) -> tuple[int, int]:
        """Group sizes of keys (tokens) and values (head-dim elements)."""
        return (self.group_tokens, self.value_group)


@functools.lru_cache(maxsize=64)
def _layout(
    shape: tuple[int, int, int, int, int], dtype: torch.dtype, bits: int, residual: int, group: int
) -> _Layout:
    layers, _, tokens, heads, head_dim = shape
    quant = tokens - min(residual, tokens)
    value_group = min(group, head_dim)
    channels = layers * heads * head_dim
    itemsize = torch.empty((), dtype=dtype).element_size()
    sizes = [
        packed_len(channels * quant, bits),
        2 * channels * -(-quant // group),
        2 * channels * -(-quant // group),
        packed_len(channels * quant, bits),
        2 * layers * quant * heads * -(-head_dim // value_group),
        2 * layers * quant * heads * -(-head_dim // value_group),
        2 * channels * (tokens - quant) * itemsize,
    ]
    sections = []
    offset = _HEADER_BYTES
    for size in sizes:
        sections.append((offset, size))
        offset = _align8(offset + size)
    fields = (layers, tokens, heads, head_dim, group, tokens - quant)
    header = struct.pack("<4sBBBB6H4x", _MAGIC, _VERSION, bits, _DTYPE_CODES[dtype], 0, *fields)
    return _Layout(shape, dtype, bits, group, quant, value_group, tuple(sections), offset, header)


def _chunks(layout: _Layout, count: int) -> Iterator[tuple[slice, slice, list[tuple[int, int]]]]:
    """(block rows, layers, byte span of each section) of runs of about ``_CHUNK_ELEMENTS``.

    Every section is layer-major, so a run of layers is one byte span per section, provided
    a layer's packed codes end on a byte. Runs that fit in cache make the several elementwise
    passes of a quantisation read cache, not memory: a 32-layer block coded whole ran at
    about half the rate per byte of a 2-layer one.
    """
    layers, _, tokens, heads, head_dim = layout.shape
    layer_elements = 2 * tokens * heads * head_dim
    aligned = layout.quant_tokens * heads * head_dim % (8 // layout.bits) == 0
    if layers > 1 and aligned and layers * layer_elements > _CHUNK_ELEMENTS:
        step = max(1, _CHUNK_ELEMENTS // layer_elements)
        for row in range(count):
            for first in range(0, layers, step):
                last = min(first + step, layers)
                spans = [
                    (offset + first * size // layers, offset + last * size // layers)
                    for offset, size in layout.sections
                ]
                yield slice(row, row + 1), slice(first, last), spans
        return
    step = max(1, _CHUNK_ELEMENTS // (layers * layer_elements))
    spans = [(offset, offset + size) for offset, size in layout.sections]
    for row in range(0, count, step):
        yield slice(row, min(row + step, count)), slice(0, layers), spans


class KiviCodec:
    """Encode / decode KV blocks as KIVI-quantised bytes; see the module docstring."""

    def __init__(self, bits: int = 4, residual_tokens: int = 32, group_tokens: int = 32) -> None:
        if bits not in (2, 4) or isinstance(bits, bool):
            raise InvalidArgumentError(f"KIVI bits must be 2 or 4, got {bits!r}")
        if not isinstance(residual_tokens, int) or not 0 <= residual_tokens <= _U16_MAX:
            raise InvalidArgumentError(
                f"residual_tokens must be in [0, 65535], got {residual_tokens!r}"
            )
        if not isinstance(group_tokens, int) or not 0 < group_tokens <= _U16_MAX:
            raise InvalidArgumentError(f"group_tokens must be in [1, 65535], got {group_tokens!r}")
        self._bits = bits
        self._residual_tokens = residual_tokens
        self._group_tokens = group_tokens

    def describe(self) -> dict[str, int]:
        return {
            "bits": self._bits,
            "residual_tokens": self._residual_tokens,
            "group_tokens": self._group_tokens,
        }

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={value}" for name, value in self.describe().items())
        return f"KiviCodec({fields})"

    def encoded_bytes(self, fingerprint: ModelFingerprint) -> int:
        """The fixed size of one encoded block of ``fingerprint``'s shape and dtype."""
        return self._layout_for(fingerprint.block_shape, fingerprint.torch_dtype).total_bytes

    def encode(self, block: torch.Tensor) -> torch.Tensor:
        """``block [L, 2, T, H, D]`` -> 1-D uint8 of ``encoded_bytes``."""
        if block.dim() != 5:
            raise InvalidArgumentError(
                f"KIVI encode wants [L, 2, T, H, D], got {tuple(block.shape)}"
            )
        return self.encode_many(block.unsqueeze(0))[0]

    def decode(self, data: torch.Tensor, out: torch.Tensor) -> None:
        """Fill ``out [L, 2, T, H, D]`` (any float dtype) from ``encode``'s bytes."""
        if data.dim() != 1 or out.dim() != 5:
            raise InvalidArgumentError(
                f"KIVI decode wants 1-D data and a [L, 2, T, H, D] out, got {tuple(data.shape)} "
                f"and {tuple(out.shape)}"
            )
        self.decode_many(data.unsqueeze(0), out.unsqueeze(0))

    def encode_many(self, blocks: torch.Tensor) -> torch.Tensor:
        """``blocks [n, L, 2, T, H, D]`` -> uint8 ``[n, encoded_bytes]``."""
        if blocks.dim() != 6:
            raise InvalidArgumentError(
                f"KIVI wants [n, L, 2, T, H, D] blocks, got {tuple(blocks.shape)}"
            )
        layout = self._layout_for(tuple(blocks.shape[1:]), blocks.dtype)
        count = blocks.shape[0]
        encoded = torch.empty(count, layout.total_bytes, dtype=torch.uint8, device=blocks.device)
        for offset, size in layout.sections:  # the padding after each section is zero
            encoded[:, offset + size : _align8(offset + size)] = 0
        encoded[:, :_HEADER_BYTES] = torch.frombuffer(bytearray(layout.header), dtype=torch.uint8)
        for rows, layers, spans in _chunks(layout, count):
            sections = [encoded[rows, start:stop] for start, stop in spans]
            encode_layers(
                blocks[rows, layers], layout.quant_tokens, self._bits, layout.groups, sections
            )
        return encoded

    def decode_many(self, data: torch.Tensor, out: torch.Tensor) -> None:
        """Fill ``out [n, L, 2, T, H, D]`` from ``data [n, encoded_bytes]``."""
        if data.dim() != 2 or data.dtype != torch.uint8 or out.dim() != 6:
            raise InvalidArgumentError(
                f"KIVI decode wants uint8 data [n, bytes] and out [n, L, 2, T, H, D], got "
                f"{data.dtype} {tuple(data.shape)} and {tuple(out.shape)}"
            )
        if not out.is_floating_point() or data.shape[0] != out.shape[0]:
            raise InvalidArgumentError(
                f"KIVI decode: out must be float with one block per data row, got {out.dtype} "
                f"{tuple(out.shape)} for {data.shape[0]} rows"
            )
        count = data.shape[0]
        if count == 0:
            return
        if data.shape[1] < _HEADER_BYTES:
            raise InvalidArgumentError(f"KIVI data row of {data.shape[1]} bytes has no header")
        dtype = _CODE_DTYPES.get(int(data[0, 6]))
        if dtype is None:
            raise InvalidArgumentError(f"KIVI data has an unknown dtype code {int(data[0, 6])}")
        layout = self._layout_for(tuple(out.shape[1:]), dtype)
        if data.shape[1] != layout.total_bytes:
            raise InvalidArgumentError(
                f"KIVI data rows are {data.shape[1]} bytes; {tuple(out.shape[1:])} {dtype} "
                f"encodes to {layout.total_bytes}"
            )
        if data.stride(-1) != 1 or data.stride(0) % 8:  # sections are read as float16 views
            data = data.contiguous()
        expected = torch.frombuffer(bytearray(layout.header), dtype=torch.uint8).to(data.device)
        if not bool((data[:, :_HEADER_BYTES] == expected).all()):
            raise InvalidArgumentError(
                f"KIVI header does not match {self!r} and out {tuple(out.shape[1:])}"
            )
        for rows, layers, spans in _chunks(layout, count):
            sections = [data[rows, start:stop] for start, stop in spans]
            decode_layers(
                sections, layout.quant_tokens, self._bits, layout.groups, dtype, out[rows, layers]
            )

    def _layout_for(self, shape: tuple[int, ...], dtype: torch.dtype) -> _Layout:
        if len(shape) != 5 or shape[1] != 2:
            raise InvalidArgumentError(f"KIVI block shape must be [L, 2, T, H, D], got {shape}")
        if any(size <= 0 or size > _U16_MAX for size in shape):
            raise InvalidArgumentError(f"KIVI block dims must be in [1, 65535], got {shape}")
        if dtype not in _DTYPE_CODES:
            raise InvalidArgumentError(
                f"KIVI cannot encode {dtype}; expected one of {list(_DTYPE_CODES)}"
            )
        layers, kv, tokens, heads, head_dim = shape
        return _layout(
            (layers, kv, tokens, heads, head_dim),
            dtype,
            self._bits,
            self._residual_tokens,
            self._group_tokens,
        )
