"""ModelFingerprint and block hashes: the names a KV block is stored under.

A block is one ``block_tokens``-token slice of a sequence's KV cache for every layer. Its key
is the engine's block hash (bytes) inside a namespace made from the model's fingerprint, so
one model never loads another's blocks: a block whose shape, dtype or layout differs would
load as garbage, not as an error.

Hashes must be stable across processes and restarts (LMCache's "builtin" hash, Python's
``hash()``, was the top cause of "0 hit tokens" reports). ``chain_hashes`` is sha256 over the
parent's hash and the block's token ids, so equal prefixes give equal chains in any process.

Block layout (``block_shape``): ``[num_layers, 2 (K, V), block_tokens, num_kv_heads,
head_dim]``, C order, so one block's all-layer KV is one contiguous object and one layer of a
block is one contiguous byte range (``layer_bytes`` at ``layer * layer_bytes``).

Thread-safety: immutable values; free functions.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch

from tiers import InvalidArgumentError

__all__ = ["ModelFingerprint", "chain_hashes"]

_DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float8_e4m3fn": torch.float8_e4m3fn,
}


@dataclass(frozen=True)
class ModelFingerprint:
    """What makes two models' KV blocks interchangeable."""

    model: str  # a name or content hash of the weights
    dtype: str  # a key of _DTYPES ("bfloat16", ...)
    num_layers: int
    block_tokens: int
    num_kv_heads: int
    head_dim: int
    kv_layout: str = "LKTHD"  # layer, K/V, token, head, dim: the order of block_shape

    def __post_init__(self) -> None:
        if self.dtype not in _DTYPES:
            raise InvalidArgumentError(f"dtype {self.dtype!r}: expected one of {sorted(_DTYPES)}")
        for name in ("num_layers", "block_tokens", "num_kv_heads", "head_dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise InvalidArgumentError(f"{name} must be a positive int, got {value!r}")
        if not self.model:
            raise InvalidArgumentError("model must be a non-empty name")

    @property
    def torch_dtype(self) -> torch.dtype:
        return _DTYPES[self.dtype]

    @property
    def block_shape(self) -> tuple[int, int, int, int, int]:
        return (self.num_layers, 2, self.block_tokens, self.num_kv_heads, self.head_dim)

    @property
    def layer_shape(self) -> tuple[int, int, int, int]:
        return self.block_shape[1:]

    @property
    def layer_bytes(self) -> int:
        itemsize = torch.empty((), dtype=self.torch_dtype).element_size()
        return 2 * self.block_tokens * self.num_kv_heads * self.head_dim * itemsize

    @property
    def block_bytes(self) -> int:
        return self.num_layers * self.layer_bytes

    def digest(self) -> str:
        """16 hex chars of sha256 over the canonical JSON of every field."""
        canonical = json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def chain_hashes(
    token_ids: Sequence[int], block_tokens: int, *, seed: bytes = b"tierkit"
) -> list[bytes]:
    """sha256 block hashes of every full block of ``token_ids``, each over its parent's hash
    and its own tokens (a partial last block has no hash: it is never cached)."""
    if block_tokens <= 0:
        raise InvalidArgumentError(f"block_tokens must be positive, got {block_tokens}")
    hashes: list[bytes] = []
    parent = hashlib.sha256(seed).digest()
    for start in range(0, len(token_ids) - block_tokens + 1, block_tokens):
        digest = hashlib.sha256(parent)
        for token in token_ids[start : start + block_tokens]:
            digest.update(int(token).to_bytes(8, "little", signed=True))
        parent = digest.digest()
        hashes.append(parent)
    return hashes
