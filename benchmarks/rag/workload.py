"""The RAG benchmark's requests: debian-minilm questions, their top-5 documents as chunks,
replayed in a Zipf-shuffled order.

- Questions: debian-minilm's own queries are held out of the data checkout, so ``questions``
  documents are drawn at random (seeded) and each is asked about by its own embedding and
  package name ("Question: what is <package>?"), the shape the test model was trained on.
- Retrieval: the exact top 5 by inner product over all 62,440 embeddings (brute force in
  numpy, one matmul: exact, and a few ms for a question batch; the SPANN index is not used
  here, where retrieval is not what is measured). The asked-about document is among them.
- Chunks: each retrieved document's text cut to ``DOC_BYTES`` bytes, as ``[doc] <text>\\n``,
  byte-level tokens; the system text is the model's training instruction.
- Replay: ``requests`` draws, each a question picked with Zipf(1.0) popularity over a
  shuffled ranking, its five chunks in a fresh random order: a chunk recurs at varying
  positions and beside varying neighbours.

Thread-safety: free functions building immutable values.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kvstore.testing.rag_model import BOS, DOC_BYTES, encode

__all__ = ["SYSTEM_TEXT", "RagRequest", "build_requests", "load_corpus"]

SYSTEM_TEXT = "Answer from the documents.\n"
TOP_K = 5


@dataclass(frozen=True)
class RagRequest:
    question_id: int
    system: tuple[int, ...]
    chunks: tuple[tuple[int, ...], ...]  # in this request's order
    question: tuple[int, ...]

    @property
    def num_tokens(self) -> int:
        return len(self.system) + sum(map(len, self.chunks)) + len(self.question)


def load_corpus(data_dir: Path) -> tuple[list[str], np.ndarray]:
    """(document texts, embeddings [n, 384]) of debian-minilm."""
    texts = []
    with open(data_dir / "docs.jsonl") as f:
        for line in f:
            texts.append(json.loads(line)["text"])
    embeddings = np.load(data_dir / "embeddings.npy", mmap_mode="r")
    return texts, np.asarray(embeddings, dtype=np.float32)


def top_k(embeddings: np.ndarray, queries: np.ndarray, k: int = TOP_K) -> np.ndarray:
    """Exact top ``k`` ids by inner product, best first, [queries, k]."""
    scores = queries @ embeddings.T
    best = np.argpartition(-scores, k, axis=1)[:, :k]
    order = np.argsort(-np.take_along_axis(scores, best, axis=1), axis=1)
    return np.take_along_axis(best, order, axis=1)


def build_requests(
    texts: list[str], embeddings: np.ndarray, *, questions: int, requests: int, seed: int = 0
) -> list[RagRequest]:
    """The replay; see the module docstring."""
    rng = random.Random(seed)
    asked = rng.sample(range(len(texts)), questions)
    retrieved = top_k(embeddings, embeddings[asked])
    system = (BOS, *encode(SYSTEM_TEXT))
    pool = []
    for doc_id, ids in zip(asked, retrieved, strict=True):
        chunks = tuple(tuple(encode(f"[doc] {texts[i][:DOC_BYTES]}\n")) for i in ids)
        name = texts[doc_id].split(":", 1)[0][:40]
        pool.append((chunks, tuple(encode(f"Question: what is {name}?\nAnswer: "))))
    ranking = list(range(questions))
    rng.shuffle(ranking)
    weights = [1.0 / (rank + 1) for rank in range(questions)]
    replay = []
    for question_id in rng.choices(ranking, weights=weights, k=requests):
        chunks, question = pool[question_id]
        order = list(chunks)
        rng.shuffle(order)
        replay.append(RagRequest(question_id, system, tuple(order), question))
    return replay
