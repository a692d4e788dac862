"""The RAG chunk-cache benchmark: no cache vs prefix caching vs the chunk cache at several
recompute fractions, on the debian-minilm queries with their top-5 documents as chunks.

    python -m benchmarks.rag.chunks [--quick] [--rounds R] [--fractions 0,0.15,0.3]

Workload: benchmarks.rag.workload (all 500 queries by default, top 5 through our SPANN
index, a Zipf-shuffled replay of ``--requests``); configurations and measures:
benchmarks.rag.runners; summaries: benchmarks.rag.report. The model is the tiny byte-level
Llama of ``kvstore.testing.rag_model`` trained on the Debian descriptions (built on first
use, ~15 min, then cached outside git). Each round takes every request through every
configuration in turn (rotating order, each on its own fresh store:
``runners.replay_together``), so they share the machine's moments; the first round has the
sweep's configurations too, later rounds only the headline's (no cache, prefix caching, the
chunk cache at the default rule and fraction). Token counts come from real runs of every
request (no cache: every ``--no-cache-every``-th request runs, its tokens are the prompt's);
quality is compared on ``--quality-requests`` evenly spaced requests; with one round the
TTFT spread is over the replay's quarters. The model runs on one thread: on this shared
2-vCPU VM two OpenMP threads spin against other processes.

Modes: the full mode (the headline) replays 5,000 requests in one round (12-16 min here):
long enough that the cold misses (``floor_vs_prefix_caching``, printed beside the key) are
a small part, and the key is still over the whole replay, cold misses included. ``--quick``
replays 120 requests of the first 100 queries in 2 rounds (~2 min): its key is dominated by
cold misses (floor ~0.52) and misses the target; it is for iteration, not the headline.

The last line is one JSON object: ``recompute_vs_prefix_caching`` (prefill tokens computed
over the whole replay, chunk cache at the default / prefix caching; target <= 0.4: the
headline, as the issue asks, cold misses included), ``recompute_vs_prefix_caching_steady``
(the replay's last quarter), ``floor_vs_prefix_caching`` (what any chunk cache must compute:
the cold misses and the questions), ``top1_agreement`` (target >= 0.98),
``ttft_vs_prefix_caching`` (median TTFT, chunk cache / prefix caching), the sweep's pick and
the by-length rows. Without the data checkout (../shared/data/debian-minilm) it says so and
prints ``{"skipped": ...}``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.common.measure import machine_string
from benchmarks.common.paths import OUT_DIR, SHARED_DATA
from benchmarks.common.scratch import remove_at_exit
from benchmarks.rag.report import PURE_REUSE, by_length, pick, print_table, row
from benchmarks.rag.runners import Reference, ReplayResult, reference, replay_together
from benchmarks.rag.workload import (
    build_requests,
    cold_tokens,
    load_corpus,
    load_questions,
    retrieve,
)
from kvstore.rag.assemble import DEFAULT_FRACTION, DEFAULT_RULE, RULES
from kvstore.testing.rag_model import rag_model

DATA_DIR = SHARED_DATA / "debian-minilm"
FULL_REQUESTS = 5000  # long enough that the cold misses are a small part (see by_length)
Config = tuple[str, float, str]


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a minute or two")
    parser.add_argument("--questions", type=int, default=None, help="default: all queries")
    parser.add_argument("--requests", type=int, default=None)
    parser.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="passes of the headline configurations (the first has the sweep)",
    )
    parser.add_argument("--quality-requests", type=int, default=None)
    parser.add_argument(
        "--no-cache-every",
        type=int,
        default=None,
        help="no cache runs every k-th request (its tokens are the prompt's)",
    )
    parser.add_argument("--fractions", default=None, help="the headline rule's, comma-separated")
    parser.add_argument("--default-fraction", type=float, default=DEFAULT_FRACTION)
    parser.add_argument("--rule", choices=RULES, default=DEFAULT_RULE, help="the headline's")
    parser.add_argument("--rules", default=None, help="comma-separated, to compare")
    parser.add_argument("--kl-share", type=float, default=0.5, help="the pick's KL bound")
    parser.add_argument("--model-train-s", type=float, default=900.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data-dir", type=Path, default=DATA_DIR, help="a debian-minilm copy")
    args = parser.parse_args(argv)
    quick = args.quick
    args.questions = args.questions or (100 if quick else None)
    args.requests = args.requests or (120 if quick else FULL_REQUESTS)
    args.rounds = args.rounds or (2 if quick else 1)
    args.quality_requests = args.quality_requests or (60 if quick else 300)
    args.no_cache_every = args.no_cache_every or (1 if quick else 8)
    default = "0,0.1,1" if quick else ""
    args.fractions = [float(f) for f in (args.fractions or default).split(",") if f]
    rules = args.rules or (
        "chunk-start,deviation,learned-refresh" if quick else "deviation,attention"
    )
    args.rules = [r for r in rules.split(",") if r]
    if args.rule not in args.rules:
        args.rules.append(args.rule)
    return args


def _configs(args: argparse.Namespace) -> tuple[list[Config], list[Config]]:
    """(the headline's, the sweep's others)."""
    default: Config = ("chunk", args.default_fraction, args.rule)
    headline = [("none", 0.0, ""), ("prefix", 0.0, ""), default]
    # the headline's rule at every fraction (1.0 is a full prefill inside assemble whatever
    # the rule: named "deviation"); the others at the default fraction, and pure reuse
    # ("chunk-start" at 0: the quality bound's base)
    sweep = [("chunk", f, args.rule if f < 1 else "deviation") for f in args.fractions]
    sweep += [("chunk", args.default_fraction, r) for r in args.rules]
    sweep.append(PURE_REUSE)
    return headline, [c for c in dict.fromkeys(sweep) if c != default]


async def _run(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(1)
    texts, embeddings = load_corpus(args.data_dir)
    questions = load_questions(args.data_dir, texts, embeddings, args.questions, args.seed)
    started = time.perf_counter()
    work_dir = remove_at_exit(OUT_DIR / "rag-chunks")
    retrieved = await retrieve(embeddings, questions.embeddings, work_dir / "index")
    recall = None
    if questions.truth is not None:
        hits = [
            len(set(got) & set(want[:5]))
            for got, want in zip(retrieved, questions.truth, strict=True)
        ]
        recall = float(np.mean(hits) / 5)
    print(f"questions: {questions.source}; top 5 through the SPANN index in "
          f"{time.perf_counter() - started:.1f} s, recall@5 {recall}")  # fmt: skip
    started = time.perf_counter()
    model = rag_model(texts, train_s=args.model_train_s)
    print(f"model ready in {time.perf_counter() - started:.1f} s "
          f"(built on first use, then cached)", file=sys.stderr)  # fmt: skip
    requests = build_requests(texts, questions, retrieved, requests=args.requests, seed=args.seed)
    step = max(1, len(requests) // max(1, args.quality_requests))
    references: list[Reference | None] = [
        reference(model, r) if i % step == 0 else None for i, r in enumerate(requests)
    ]
    total = sum(r.num_tokens for r in requests)
    distinct = {c for r in requests for c in r.chunks}
    sizes = [r.num_tokens for r in requests]
    print(
        f"{len(requests)} requests over {len({r.question_id for r in requests})} of "
        f"{len(questions.names)} questions, {total} prompt tokens, {len(distinct)} distinct "
        f"chunks, prompts of {min(sizes)}-{max(sizes)} tokens, quality on "
        f"{sum(r is not None for r in references)} requests"
    )
    headline, sweep = _configs(args)
    rounds: dict[Config, list[ReplayResult]] = {c: [] for c in headline + sweep}
    for number in range(args.rounds):
        configs = headline + (sweep if number == 0 else [])
        started = time.perf_counter()
        results = await replay_together(
            model, requests, references if number == 0 else [None] * len(requests), configs,
            work_dir, args.no_cache_every, _Progress(len(requests), started),
        )  # fmt: skip
        for config, result in zip(configs, results, strict=True):
            rounds[config].append(result)
            if number == 0:
                _progress(result)
        print(f"round {number + 1}/{args.rounds} done in {time.perf_counter() - started:.0f} s",
              file=sys.stderr)  # fmt: skip
    blocks = 4 if args.rounds == 1 else 0
    rows = {config: row(results, blocks) for config, results in rounds.items()}
    prefix, chunk = rows[headline[1]], rows[headline[2]]
    print_table(list(rows.values()), total, prefix["tokens"])
    cold = cold_tokens(requests)
    warm = [c == len(r.question) for c, r in zip(cold, requests, strict=True)]
    lengths = by_length(chunk["per_request"], prefix["per_request"], cold, warm)
    picked, bound = pick(rows, args.kl_share)
    for label, values in lengths.items():
        print(f"  {label:<10} ({values['requests']:>4} requests): chunk cache / prefix caching "
              f"{values['ratio']:.3f}, floor {values['floor']:.3f}")  # fmt: skip
    return {
        "recompute_vs_prefix_caching": round(chunk["tokens"] / prefix["tokens"], 4),
        "recompute_vs_prefix_caching_steady": lengths["quarter 4"]["ratio"],
        "recompute_vs_prefix_caching_warm": lengths["warm only"]["ratio"],
        "floor_vs_prefix_caching": round(sum(cold) / prefix["tokens"], 4),
        "top1_agreement": round(chunk["top1"], 4),
        "ttft_vs_prefix_caching": round(chunk["ttft_s"] / prefix["ttft_s"], 4),
        "kl_nats": round(chunk["kl"], 7),
        "default_fraction": args.default_fraction,
        "rule": args.rule,
        "sweep_pick": None if picked is None else f"{picked[2]} {picked[1]:g}",
        "sweep_kl_bound": round(bound, 7),
        "prefix_vs_no_cache": round(prefix["tokens"] / total, 4),
        "tokens": {
            "total": total,
            "prefix": prefix["tokens"],
            "chunk": round(chunk["tokens"], 1),
            "chunk_reused": chunk["reused_tokens"],
            "chunk_exact": chunk["exact_tokens"],
            "questions": sum(len(r.question) for r in requests),
            "cold": sum(cold),
        },
        "load_wait_ms_median": round(chunk["load_wait_ms"], 3),
        "load_wait_ms_p90": round(chunk["load_wait_p90_ms"], 3),
        "by_length": lengths,
        "by_config": {
            f"{rule} {f:g}": _summary(rows[(kind, f, rule)], prefix, cold, warm)
            for kind, f, rule in rows
            if kind == "chunk"
        },
        "ttft_ms": {
            "none": round(rows[headline[0]]["ttft_s"] * 1e3, 3),
            "prefix": round(prefix["ttft_s"] * 1e3, 3),
            "chunk": round(chunk["ttft_s"] * 1e3, 3),
        },
        "retrieval_recall_at_5": recall,
        "questions": len(questions.names),
        "requests": len(requests),
        "quality_requests": chunk["compared"],
        "rounds": args.rounds,
    }


def _summary(
    r: dict[str, Any], prefix: dict[str, Any], cold: list[int], warm: list[bool]
) -> dict[str, Any]:
    """One chunk-cache configuration of the sweep, against prefix caching."""
    lengths = by_length(r["per_request"], prefix["per_request"], cold, warm)
    return {
        "tokens_vs_prefix": round(r["tokens"] / prefix["tokens"], 4),
        "steady_vs_prefix": lengths["quarter 4"]["ratio"],
        "warm_vs_prefix": lengths["warm only"]["ratio"],
        "top1": round(r["top1"], 4),
        "kl": round(r["kl"], 7),
        "ttft_ms": round(r["ttft_s"] * 1e3, 3),
    }


class _Progress:
    """A line to stderr every tenth of the replay: a cut run still tells how far it got."""

    def __init__(self, total: int, started: float) -> None:
        self.total, self.started, self.step = total, started, max(1, total // 10)

    def __call__(self, done: int, results: list[ReplayResult]) -> None:
        if done % self.step == 0 or done == self.total:
            tokens = ", ".join(f"{r.name} {sum(r.tokens_computed):.0f}" for r in results[:3])
            print(f"  {done}/{self.total} requests, {time.perf_counter() - self.started:.0f} s: "
                  f"{tokens}", file=sys.stderr, flush=True)  # fmt: skip


def _progress(result: ReplayResult) -> None:
    quality = (f"top-1 {sum(result.top1) / len(result.top1):.4f}, "
               f"KL {sum(result.kl) / len(result.kl):.2e}") if result.top1 else ""  # fmt: skip
    print(f"  {result.name}: {sum(result.tokens_computed):.0f} tokens, TTFT median "
          f"{sorted(result.ttft_s)[len(result.ttft_s) // 2] * 1e3:.2f} ms, {quality}",
          file=sys.stderr, flush=True)  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    args = _parse(argv)
    print(f"machine: {machine_string()}; torch {torch.__version__}, one thread")
    if not (args.data_dir / "docs.jsonl").exists():
        reason = f"no debian-minilm data at {args.data_dir}: the benchmark needs the data checkout"
        print(reason)
        print(json.dumps({"skipped": reason}))
        return
    started = time.perf_counter()
    headline = asyncio.run(_run(args))
    headline["elapsed_s"] = round(time.perf_counter() - started, 1)
    targets = {"recompute_vs_prefix_caching <= 0.4": headline["recompute_vs_prefix_caching"] <= 0.4,
               "top1_agreement >= 0.98": headline["top1_agreement"] >= 0.98}  # fmt: skip
    for target, met in targets.items():
        print(f"target {target}: {'met' if met else 'MISSED'}")
    print(json.dumps(headline))


if __name__ == "__main__":
    main()
