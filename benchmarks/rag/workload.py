"""The RAG benchmark's requests: the debian-minilm queries, their top-5 documents retrieved
through our vector index as chunks, replayed in a Zipf-shuffled order.

- Questions: debian-minilm's 500 queries (``queries.npy``: packages held out of the base set,
  ``queries.jsonl``: their names), each asked by its embedding and package name ("Question:
  what is <package>?", the shape the test model was trained on). ``--questions`` takes the
  first ones; all by default. A data copy without queries (the tests' miniature corpus) asks
  about documents drawn at random (seeded) instead, and says so.
- Retrieval: top 5 through ``vectordb.SpannIndex`` (cosine, default build and search
  parameters) built over all the documents in a scratch directory; recall@5 against the
  data's exact ground truth is reported.
- Chunks: each retrieved document's text cut to ``DOC_BYTES`` bytes, as ``[doc] <text>\\n``,
  byte-level tokens; the system text is the model's training instruction.
- Replay: ``requests`` draws, each a question picked with Zipf(1.0) popularity over a
  shuffled ranking, its five chunks in a fresh random order: a chunk recurs at varying
  positions and beside varying neighbours.

Thread-safety: free functions building immutable values (``retrieve`` is a coroutine).
"""

from __future__ import annotations

import json
import random
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kvstore.testing.rag_model import BOS, DOC_BYTES, encode

__all__ = [
    "SYSTEM_TEXT",
    "Questions",
    "RagRequest",
    "build_requests",
    "cold_tokens",
    "load_corpus",
    "load_questions",
    "retrieve",
]

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


@dataclass(frozen=True)
class Questions:
    names: list[str]  # the package asked about
    embeddings: np.ndarray  # [questions, dim]
    truth: np.ndarray | None  # exact top-k ids [questions, >= k], when the data has them
    source: str  # where they came from, for the report


def load_corpus(data_dir: Path) -> tuple[list[str], np.ndarray]:
    """(document texts, embeddings [n, 384]) of debian-minilm."""
    texts = []
    with open(data_dir / "docs.jsonl") as f:
        for line in f:
            texts.append(json.loads(line)["text"])
    embeddings = np.load(data_dir / "embeddings.npy", mmap_mode="r")
    return texts, np.asarray(embeddings, dtype=np.float32)


def load_questions(
    data_dir: Path, texts: list[str], embeddings: np.ndarray, limit: int | None, seed: int = 0
) -> Questions:
    """The data's queries (the first ``limit``; None: all), or, without them, ``limit``
    (default 100) documents drawn at random asked about by their own embedding."""
    if (data_dir / "queries.npy").exists() and (data_dir / "queries.jsonl").exists():
        with open(data_dir / "queries.jsonl") as f:
            names = [json.loads(line)["package"] for line in f]
        vectors = np.asarray(np.load(data_dir / "queries.npy"), dtype=np.float32)
        truth_path = data_dir / "gt_ids.npy"
        truth = np.load(truth_path) if truth_path.exists() else None
        count = len(names) if limit is None else min(limit, len(names))
        return Questions(
            names[:count], vectors[:count], None if truth is None else truth[:count],
            f"the data's queries ({count} of {len(names)})",
        )  # fmt: skip
    count = min(limit or 100, len(texts))
    asked = random.Random(seed).sample(range(len(texts)), count)
    names = [texts[i].split(":", 1)[0] for i in asked]
    return Questions(names, embeddings[asked], None, f"{count} documents (no queries in the data)")


async def retrieve(
    embeddings: np.ndarray, queries: np.ndarray, directory: Path, k: int = TOP_K
) -> np.ndarray:
    """Top ``k`` document ids per query [queries, k], best first, through a SPANN index
    built over ``embeddings`` in ``directory`` (removed after)."""
    from vectordb import IndexConfig, SpannIndex

    shutil.rmtree(directory, ignore_errors=True)
    config = IndexConfig(dim=embeddings.shape[1], metric="cosine")
    index = await SpannIndex.create(directory, config)
    try:
        await index.build(np.arange(len(embeddings), dtype=np.int64), embeddings)
        ids, _ = await index.search(queries, k=k)
    finally:
        await index.aclose()
        shutil.rmtree(directory, ignore_errors=True)
    return np.asarray(ids)


def build_requests(
    texts: list[str],
    questions: Questions,
    retrieved: np.ndarray,
    *,
    requests: int,
    seed: int = 0,
) -> list[RagRequest]:
    """The replay; see the module docstring."""
    rng = random.Random(seed)
    system = (BOS, *encode(SYSTEM_TEXT))
    pool = []
    for name, ids in zip(questions.names, retrieved, strict=True):
        chunks = tuple(tuple(encode(f"[doc] {texts[i][:DOC_BYTES]}\n")) for i in ids if i >= 0)
        pool.append((chunks, tuple(encode(f"Question: what is {name[:40]}?\nAnswer: "))))
    ranking = list(range(len(pool)))
    rng.shuffle(ranking)
    weights = [1.0 / (rank + 1) for rank in range(len(pool))]
    replay = []
    for question_id in rng.choices(ranking, weights=weights, k=requests):
        chunks, question = pool[question_id]
        order = list(chunks)
        rng.shuffle(order)
        replay.append(RagRequest(question_id, system, tuple(order), question))
    return replay


def cold_tokens(requests: list[RagRequest]) -> list[int]:
    """Per request, the tokens any chunk cache with room for everything must compute: the
    question and each chunk (the system text too) at its first sight. Their sum over a
    replay, divided by prefix caching's tokens, is the floor of ``recompute_vs_prefix_caching``
    on it."""
    seen: set[tuple[int, ...]] = set()
    out = []
    for request in requests:
        fresh = len(request.question)
        for segment in (request.system, *request.chunks):
            if segment not in seen:
                seen.add(segment)
                fresh += len(segment)
        out.append(fresh)
    return out
