"""The errors of kvstore.rag, under tiers.TierkitError so one ``except`` catches any tierkit
failure.

RagError               base of this package's errors
UnsupportedModelError  a model whose KV cannot be moved or reused exactly (its RoPE depends on
                       the sequence length, it has no rotary embedding, or a layer is not
                       plain full attention)
ChunkShapeError        a chunk's KV whose shape or dtype does not fit the cache's model
RagArgumentError       any other unusable argument (a prompt whose last segment is cached,
                       a recompute fraction outside [0, 1], positions of the wrong shape)

Thread-safety: plain exception classes.
"""

from __future__ import annotations

from tiers import InvalidArgumentError, TierkitError

__all__ = ["ChunkShapeError", "RagArgumentError", "RagError", "UnsupportedModelError"]


class RagError(TierkitError):
    """Something kvstore.rag cannot do with the given model or chunk."""


class UnsupportedModelError(RagError):
    """The model's KV cannot be re-rotated or reused exactly."""


class ChunkShapeError(RagError, InvalidArgumentError):
    """A chunk's KV tensor does not have the cache's layout, shape or dtype."""


class RagArgumentError(RagError, InvalidArgumentError):
    """An argument kvstore.rag cannot use (also a ValueError)."""
