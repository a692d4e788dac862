"""Request traces for the KV-cache benchmark: the Mooncake conversation trace, or a synthetic one.

A trace is a list of requests; a request is its prompt's chain of block ids, one per 512-token
block, parent first. In the Mooncake trace (``hash_ids``) an id names a block *and its whole
prefix*: equal ids mean equal prefixes, so the ids of all requests form a forest (checked by
``check_prefix_forest``). The synthetic trace keeps that property: conversations whose turns
extend their own earlier prompt, picked with Zipf popularity, under one shared system-prompt
block, so the benchmark still runs where ``../shared`` is absent (a user's clone).

Thread-safety: pure functions over immutable inputs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmarks.common.paths import SHARED_DATA

__all__ = [
    "MOONCAKE_CONVERSATION",
    "Trace",
    "block_key",
    "check_prefix_forest",
    "load_mooncake",
    "load_trace",
    "synthetic_trace",
]

MOONCAKE_CONVERSATION = SHARED_DATA / "mooncake-traces" / "conversation_trace.jsonl"
Request = list[int]


@dataclass(frozen=True)
class Trace:
    name: str
    requests: list[Request]
    source: str  # the file read, or how it was generated

    @property
    def accesses(self) -> int:
        return sum(len(chain) for chain in self.requests)

    @property
    def unique_blocks(self) -> int:
        return len({block for chain in self.requests for block in chain})

    def summary(self) -> dict[str, object]:
        return {
            "name": self.name,
            "source": self.source,
            "requests": len(self.requests),
            "block_accesses": self.accesses,
            "unique_blocks": self.unique_blocks,
        }


def block_key(block_id: int) -> bytes:
    """The store key of a trace block id: 8 big-endian bytes (an engine's hash stand-in)."""
    return block_id.to_bytes(8, "big")


def load_mooncake(path: Path = MOONCAKE_CONVERSATION, limit: int | None = None) -> Trace:
    """The requests of a Mooncake trace file (``hash_ids`` of each line), in file order."""
    requests: list[Request] = []
    with path.open() as lines:
        for line in lines:
            if line.strip():
                requests.append([int(h) for h in json.loads(line)["hash_ids"]])
            if limit is not None and len(requests) >= limit:
                break
    return Trace("mooncake-conversation", requests, str(path))


def synthetic_trace(
    requests: int = 12_000, conversations: int = 2_000, zipf_a: float = 1.2, seed: int = 17
) -> Trace:
    """Zipf-popular conversation slots under one shared system block (id 0): each turn's
    prompt is the slot's previous prompt plus 1-4 new blocks; a first turn has 2-12 blocks; a
    conversation ends after 2-12 turns or 64 blocks, and its slot starts a new one."""
    rng = np.random.default_rng(seed)
    picks = rng.zipf(zipf_a, size=requests * 2)
    picks = picks[picks <= conversations][:requests] - 1
    prompts: dict[int, list[int]] = {}
    turns_left: dict[int, int] = {}
    next_id = 1
    out: list[Request] = []
    for slot in picks.tolist():
        chain = prompts.get(slot)
        if chain is None or turns_left[slot] <= 0 or len(chain) >= 64:
            chain, grow = [0], int(rng.integers(2, 13))
            turns_left[slot] = int(rng.integers(2, 13))
        else:
            chain, grow = list(chain), int(rng.integers(1, 5))
        chain.extend(range(next_id, next_id + grow))
        next_id += grow
        turns_left[slot] -= 1
        prompts[slot] = chain
        out.append(chain)
    source = f"zipf a={zipf_a}, {conversations} conversation slots, seed {seed}"
    return Trace("synthetic-zipf-prefix", out, source)


def load_trace(path: Path = MOONCAKE_CONVERSATION, limit: int | None = None) -> Trace:
    """The Mooncake trace where it is present; otherwise, said on stderr, the synthetic one."""
    if path.is_file():
        return load_mooncake(path, limit)
    import sys

    print(
        f"kvstore bench: {path} is missing (a clone without ../shared); "
        "using a synthetic Zipf-prefix trace instead",
        file=sys.stderr,
        flush=True,
    )
    trace = synthetic_trace()
    if limit is not None:
        trace = Trace(trace.name, trace.requests[:limit], trace.source)
    return trace


def check_prefix_forest(requests: list[Request]) -> int:
    """How many block ids appear under two different parents (0 for a prefix-hash trace)."""
    parent_of: dict[int, int | None] = {}
    conflicts = 0
    for chain in requests:
        parent: int | None = None
        for block in chain:
            if parent_of.setdefault(block, parent) != parent:
                conflicts += 1
            parent = block
    return conflicts
