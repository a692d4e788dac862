"""kvstore.rag: the RAG chunk cache. Retrieved chunks' KV reused at any position, with only
the tokens that matter recomputed.

ChunkCache       chunks' KV on the tiered store (DRAM over NVMe: checksummed, restart-safe),
                 keyed by token content in the model fingerprint's namespace, evicted by
                 value (reuses x recompute cost / bytes)
RopeRotator      exact re-rotation of cached keys to new positions (Llama RoPE and its
                 linear / llama3 / yarn scalings)
blend_prefill    selective recompute of a fraction of the reused tokens, chosen by CacheBlend's
                 check-layer K deviation; ``assemble``'s rules choose what is checked: the
                 tokens whose deviation a chunk's first checked reuse found largest
                 ("learned", the default; "learned-refresh"), all ("deviation"),
                 positional or stored candidates ("hybrid", "attention"), or no check
                 ("chunk-start")
context_stats    per-token statistics measured when a chunk is first computed
assemble         system text + cached chunks + question -> a transformers DynamicCache,
                 each chunk's layers streamed in while the layers below compute;
generate         decode on from it with ``model.generate``

chunk_format has the byte-level object format. Errors: RagError (a tiers.TierkitError),
UnsupportedModelError, ChunkShapeError, RagArgumentError.
"""

from kvstore.rag.assemble import AssembledPrompt, Segment, assemble, generate
from kvstore.rag.blend import BlendResult, blend_prefill
from kvstore.rag.chunk_cache import ChunkCache, ChunkInfo, chunk_hash
from kvstore.rag.errors import ChunkShapeError, RagArgumentError, RagError, UnsupportedModelError
from kvstore.rag.rope import RopeRotator

__all__ = [
    "AssembledPrompt",
    "BlendResult",
    "ChunkCache",
    "ChunkInfo",
    "ChunkShapeError",
    "RagArgumentError",
    "RagError",
    "RopeRotator",
    "Segment",
    "UnsupportedModelError",
    "assemble",
    "blend_prefill",
    "chunk_hash",
    "generate",
]
