"""The byte-level format of a cached chunk: its key, its header page and its KV layout.

The one place a chunk object is written and read (kvstore.rag.chunk_cache stores them)::

    key    rag/<namespace: 16 hex>/<sha256 of the token ids: 64 hex>/<tokens>/<position>
           [/<context: 32 hex>] when the KV is exact for the tokens before it (see below)
    bytes  header: HEADER_BYTES (4096), JSON padded with spaces: magic, namespace,
           num_tokens, position, context, per-layer key and value RMS (float32 statistics a reuse
           rule or a reader can check without the KV), scores (per-token context attention,
           float16 base64, or null: kvstore.rag.context_stats)
           KV: [layers, 2 (K, V), kv_heads, tokens, head_dim] in the fingerprint's dtype, C
           order, so layer l is the byte range HEADER_BYTES + l * layer_bytes, layer_bytes
           then the object is zero-padded to a 4 KiB page (the NVMe record is then bare:
           its size on disk is what the tier charges)

``chunk_hash`` is sha256 over the token ids (8 bytes each, little-endian, after a domain
tag): the same tokens have the same name in every process. ``context_hash`` names the
tokens before a chunk (the first 16 bytes of their ``chunk_hash``): a chunk stored with one
was computed after exactly those tokens, with no approximation before it, so its KV is what a
full prefill gives wherever the same tokens precede it at the same position (the system text
at position 0, most often) and needs no recompute there.

Thread-safety: free functions over immutable inputs; results are new tensors or views of
the caller's buffer.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

import torch

from kvstore.fingerprint import ModelFingerprint
from kvstore.rag.context_stats import encode_scores

__all__ = [
    "HEADER_BYTES",
    "chunk_hash",
    "chunk_key",
    "context_hash",
    "context_hashes",
    "encode_chunk",
    "header_ok",
    "kv_view",
    "layer_bytes",
    "parse_chunk_key",
    "read_header",
]

HEADER_BYTES = 4096
_PAGE_BYTES = 4096
_MAGIC = "tierkit-rag-chunk-1"


def chunk_hash(token_ids: Sequence[int]) -> bytes:
    digest = hashlib.sha256(b"tierkit-rag")
    for token in token_ids:
        digest.update(int(token).to_bytes(8, "little", signed=True))
    return digest.digest()


def context_hash(token_ids: Sequence[int]) -> bytes:
    return chunk_hash(token_ids)[:16]


def context_hashes(segments: Sequence[Sequence[int]]) -> list[bytes]:
    """``context_hash`` of the tokens before each segment of a prompt (one pass)."""
    digest, out = hashlib.sha256(b"tierkit-rag"), []
    for segment in segments:
        out.append(digest.copy().digest()[:16])
        for token in segment:
            digest.update(int(token).to_bytes(8, "little", signed=True))
    return out


def chunk_key(
    namespace: str, digest: bytes, num_tokens: int, position: int, context: bytes | None = None
) -> str:
    key = f"rag/{namespace}/{digest.hex()}/{num_tokens}/{position}"
    return key if context is None else f"{key}/{context.hex()}"


def parse_chunk_key(key: str) -> tuple[bytes, int, int, bytes | None] | None:
    """(hash, tokens, position, context or None) of a chunk key; None for a key that is
    not one."""
    parts = key.split("/")
    if len(parts) not in (5, 6) or parts[0] != "rag":
        return None
    try:
        context = bytes.fromhex(parts[5]) if len(parts) == 6 else None
        return bytes.fromhex(parts[2]), int(parts[3]), int(parts[4]), context
    except ValueError:
        return None


def layer_bytes(fingerprint: ModelFingerprint, num_tokens: int) -> int:
    itemsize = torch.empty((), dtype=fingerprint.torch_dtype).element_size()
    return 2 * fingerprint.num_kv_heads * num_tokens * fingerprint.head_dim * itemsize


def kv_view(
    fingerprint: ModelFingerprint, raw: torch.Tensor, num_tokens: int, layers: int | None
) -> torch.Tensor:
    """``raw`` uint8 bytes (from the first layer's) as ``[layers, 2, kv_heads, tokens,
    head_dim]``; ``layers`` None: all the model's."""
    layers = fingerprint.num_layers if layers is None else layers
    used = layers * layer_bytes(fingerprint, num_tokens)
    shape = (layers, 2, fingerprint.num_kv_heads, num_tokens, fingerprint.head_dim)
    return raw[:used].view(fingerprint.torch_dtype).view(shape)


def encode_chunk(
    kv: torch.Tensor,
    namespace: str,
    position: int,
    context: bytes | None = None,
    scores: torch.Tensor | None = None,
) -> torch.Tensor:
    """The object's bytes (uint8, a multiple of 4 KiB) for ``kv`` computed at ``position``
    (after the tokens named by ``context``, when exact), with its per-token ``scores``."""
    kv = kv.detach().to("cpu").contiguous()
    wide = kv.float()
    header = {
        "magic": _MAGIC,
        "namespace": namespace,
        "num_tokens": kv.shape[3],
        "position": position,
        "context": None if context is None else context.hex(),
        "key_rms": [round(float(x), 6) for x in wide[:, 0].pow(2).mean((1, 2, 3)).sqrt()],
        "value_rms": [round(float(x), 6) for x in wide[:, 1].pow(2).mean((1, 2, 3)).sqrt()],
        "scores": encode_scores(scores),
    }
    text = json.dumps(header).encode()
    if len(text) > HEADER_BYTES:  # a long chunk of a deep model: its scores do not fit
        header["scores"] = None
        text = json.dumps(header).encode()
    text = text.ljust(HEADER_BYTES, b" ")
    body = kv.reshape(-1).view(torch.uint8)
    size = -(-(HEADER_BYTES + body.numel()) // _PAGE_BYTES) * _PAGE_BYTES
    payload = torch.zeros(size, dtype=torch.uint8)
    payload[:HEADER_BYTES] = torch.frombuffer(bytearray(text), dtype=torch.uint8)
    payload[HEADER_BYTES : HEADER_BYTES + body.numel()] = body
    return payload


def header_ok(
    raw: torch.Tensor, namespace: str, num_tokens: int, position: int, context: bytes | None
) -> bool:
    """Whether the header page ``raw`` names this chunk (a misfiled or damaged object does
    not)."""
    return read_header(raw, namespace, num_tokens, position, context) is not None


def read_header(
    raw: torch.Tensor, namespace: str, num_tokens: int, position: int, context: bytes | None
) -> dict[str, Any] | None:
    """The header page ``raw`` as a dict when it names this chunk; None otherwise."""
    try:
        header = json.loads(raw.numpy().tobytes().decode())
    except (UnicodeDecodeError, ValueError):
        return None
    if not isinstance(header, dict):
        return None
    ok = bool(
        header.get("magic") == _MAGIC and header.get("namespace") == namespace
        and header.get("num_tokens") == num_tokens and header.get("position") == position
        and header.get("context") == (None if context is None else context.hex())
    )  # fmt: skip
    return header if ok else None
