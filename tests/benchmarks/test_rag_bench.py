"""The RAG chunk-cache benchmark (issue 20): ``python -m benchmarks.rag.chunks`` end to end,
as a user runs it (a subprocess), on a miniature debian-minilm made here: 40 documents cut
from the repository's README, random unit embeddings, and a model trained for 2 s into a
temporary directory (``TIERKIT_RAG_MODEL_DIR``). Checks the last line's keys and what holds at
any size: fraction 1.0 agrees with the full prefill exactly, and the chunk cache computes no
more than no cache. Without data it says so. About 20 s.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from benchmarks.common.paths import REPO_ROOT

pytest.importorskip("transformers", reason="the benchmark's model needs transformers")

_TIMEOUT_S = 300  # ~20 s here; this only stops a hung run
KEYS = {"recompute_vs_prefix_caching", "top1_agreement", "ttft_vs_prefix_caching"}


def _mini_corpus(directory: Path) -> None:
    words = (REPO_ROOT / "README.md").read_text().split()
    with open(directory / "docs.jsonl", "w") as f:
        for doc in range(40):
            text = f"pkg{doc}: " + " ".join(words[doc * 30 : doc * 30 + 30])
            f.write(json.dumps({"id": doc, "text": text}) + "\n")
    vectors = np.random.default_rng(0).standard_normal((40, 384)).astype(np.float32)
    np.save(directory / "embeddings.npy", vectors / np.linalg.norm(vectors, axis=1)[:, None])


def _run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "benchmarks.rag.chunks", *args],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=_TIMEOUT_S,
    )  # fmt: skip


def test_the_benchmark_runs_end_to_end(tmp_path: Path) -> None:
    _mini_corpus(tmp_path)
    env = {**os.environ, "TIERKIT_RAG_MODEL_DIR": str(tmp_path / "model")}
    args = ["--data-dir", str(tmp_path), "--model-train-s", "2", "--questions", "4"]
    args += ["--requests", "8", "--rounds", "1", "--fractions", "0,0.15,1"]
    done = _run(args, env)
    assert done.returncode == 0, done.stderr[-3000:]
    headline = json.loads(done.stdout.strip().splitlines()[-1])
    assert headline.keys() >= KEYS
    by_config = headline["by_config"]
    assert by_config["deviation 1"]["top1"] == 1.0 and by_config["deviation 1"]["kl"] < 1e-6
    for config in by_config.values():
        assert config["tokens_vs_prefix"] <= 1 / headline["prefix_vs_no_cache"] + 1e-9


def test_without_data_it_says_so(tmp_path: Path) -> None:
    done = _run(["--quick", "--data-dir", str(tmp_path / "absent")], dict(os.environ))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "skipped" in json.loads(done.stdout.strip().splitlines()[-1])
