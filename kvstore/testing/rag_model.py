"""A tiny byte-level Llama trained here on real text, for the RAG chunk-cache tests and benchmark.

No small causal LM with RoPE ships its weights inside a PyPI package we could find, and the
Hugging Face hub may be unreachable, so ``rag_model`` trains one: 6 layers, hidden 128, 4
query / 2 KV heads (grouped-query attention, as the big Llamas), a byte-level vocabulary
(ids 0..255 are bytes; ``BOS``, ``EOS``, ``PAD`` follow). Its training examples have the
shape of a RAG prompt (an instruction, several documents, a question about one of them and
that document as the answer), so attention across chunks is what it learns to use, and what
chunk reuse can get wrong.

The weights are cached outside git, in ``$TIERKIT_RAG_MODEL_DIR`` or
``~/.cache/tierkit/rag-llama-<hash of the recipe and corpus>``, and built on first use:
``python -m kvstore.testing.rag_model --corpus docs.jsonl --train-s 300`` (the benchmark's
model, on the Debian package descriptions) or ``rag_model(corpus_texts, train_s=15)`` on any
text (the tests', on text every checkout has).

Thread-safety: free functions; two processes building the same directory at once each
write a whole checkpoint to a temporary directory and rename it into place, so a reader
never sees half a checkpoint.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import random
import shutil
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import torch

__all__ = [
    "BOS",
    "DOC_BYTES",
    "EOS",
    "PAD",
    "VOCAB_SIZE",
    "debian_texts",
    "decode",
    "encode",
    "rag_model",
]

BOS, EOS, PAD = 256, 257, 258
VOCAB_SIZE = 264  # bytes, the three specials, and room to spare
DOC_BYTES = 100  # documents are cut to this: prompts stay within the trained positions
_RECIPE = {"layers": 6, "hidden": 128, "heads": 4, "kv_heads": 2, "seq_tokens": 640, "batch": 8}


def encode(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def decode(token_ids: Sequence[int]) -> str:
    return bytes(t for t in token_ids if t < 256).decode("utf-8", errors="replace")


def _example(texts: Sequence[str], rng: random.Random, seq_tokens: int) -> list[int]:
    """One RAG-shaped training sequence: instruction, documents, question, answer."""
    docs = [texts[rng.randrange(len(texts))][:DOC_BYTES] for _ in range(rng.randint(2, 5))]
    target = docs[rng.randrange(len(docs))]
    name = target.split(":", 1)[0][:40]
    parts = ["Answer from the documents.\n", *(f"[doc] {d}\n" for d in docs)]
    parts.append(f"Question: what is {name}?\nAnswer: {target}\n")
    ids = [BOS, *encode("".join(parts)), EOS]
    return (ids + [PAD] * seq_tokens)[:seq_tokens]


def _build(texts: Sequence[str], train_s: float, seed: int, directory: str) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    # one thread: on a shared 2-vCPU VM two OpenMP threads spin against the other
    # processes and a step takes 8x longer (measured: 10 s vs 1.3 s)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    rng = random.Random(seed)
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=_RECIPE["hidden"],
        intermediate_size=3 * _RECIPE["hidden"],
        num_hidden_layers=_RECIPE["layers"],
        num_attention_heads=_RECIPE["heads"],
        num_key_value_heads=_RECIPE["kv_heads"],
        max_position_embeddings=4096,
        bos_token_id=BOS,
        eos_token_id=EOS,
        pad_token_id=PAD,
        tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(config)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    seq_tokens, batch = _RECIPE["seq_tokens"], _RECIPE["batch"]
    started, step, loss_value = time.monotonic(), 0, float("nan")
    while time.monotonic() - started < train_s:
        # linear warm-up then decay by elapsed time: the budget is seconds, not steps
        progress = (time.monotonic() - started) / train_s
        for group in optimizer.param_groups:
            group["lr"] = 3e-3 * min(1.0, (step + 1) / 30) * max(0.05, 1.0 - progress)
        ids = torch.tensor([_example(texts, rng, seq_tokens) for _ in range(batch)])
        labels = ids.masked_fill(ids == PAD, -100)
        loss = model(input_ids=ids, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        step, loss_value = step + 1, float(loss.detach())
    torch.set_num_threads(threads)
    model.eval()
    model.save_pretrained(directory)
    with open(os.path.join(directory, "training.json"), "w") as f:
        json.dump({"steps": step, "loss": loss_value, "train_s": train_s, **_RECIPE}, f)


def default_directory(texts: Sequence[str], train_s: float, seed: int) -> str:
    digest = hashlib.sha256(json.dumps([_RECIPE, train_s, seed]).encode())
    for text in texts:
        digest.update(text.encode("utf-8", errors="replace"))
    root = os.environ.get("TIERKIT_RAG_MODEL_DIR") or os.path.expanduser("~/.cache/tierkit")
    return os.path.join(root, f"rag-llama-{digest.hexdigest()[:12]}")


def rag_model(
    texts: Sequence[str], *, train_s: float = 300.0, seed: int = 0, directory: str | None = None
) -> Any:
    """The tiny Llama trained for ``train_s`` seconds on ``texts`` (float32, eval mode),
    trained and cached on first use, loaded from the cache after."""
    from transformers import AutoModelForCausalLM

    if not texts:
        raise ValueError("rag_model needs some training text")
    directory = directory or default_directory(texts, train_s, seed)
    if not os.path.exists(os.path.join(directory, "training.json")):
        parent = os.path.dirname(os.path.abspath(directory))
        os.makedirs(parent, exist_ok=True)
        scratch = tempfile.mkdtemp(dir=parent, prefix=".building-")
        try:
            _build(texts, train_s, seed, scratch)
            # OSError: another process finished first, and its checkpoint is as good
            with contextlib.suppress(OSError):
                os.rename(scratch, directory)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()


def debian_texts(path: str, limit: int | None = None) -> list[str]:
    """The ``text`` field of each line of debian-minilm's ``docs.jsonl``."""
    texts = []
    with open(path) as f:
        for line in f:
            texts.append(json.loads(line)["text"])
            if limit is not None and len(texts) >= limit:
                break
    return texts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--corpus", required=True, help="debian-minilm docs.jsonl")
    parser.add_argument("--train-s", type=float, default=300.0)
    args = parser.parse_args()
    texts = debian_texts(args.corpus)
    directory = default_directory(texts, args.train_s, 0)
    rag_model(texts, train_s=args.train_s, directory=directory)
    with open(os.path.join(directory, "training.json")) as f:
        print(directory, f.read())


if __name__ == "__main__":
    main()
