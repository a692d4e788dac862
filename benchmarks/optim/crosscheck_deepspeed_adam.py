"""Cross-check: DeepSpeed's CPU Adam computes the same AdamW as torch, so timing them is fair.

``.venv-deepspeed/bin/python -m benchmarks.optim.crosscheck_deepspeed_adam`` (from the repository
root, ``TORCH_EXTENSIONS_DIR=.venv-deepspeed/torch_extensions``). Steps two copies of a 2M
parameter model five times with the same fresh gradients, one with
``DeepSpeedCPUAdam(adamw_mode=True)`` (the kernel both DeepSpeed peers step with), one with
``torch.optim.AdamW(fused=True)`` (the in-memory ceiling and what ours wraps), and prints the
largest absolute difference against the size of one step's update (``lr``). They are different
kernels (DeepSpeed's AVX-512 code vs torch's), so equality is not expected; a difference of a few
fp32 roundings of the weights (~1e-8 here, weights ~0.02) says both apply the same update with the
same hyperparameters. Exits 1 when the difference reaches 0.1% of one step's update.
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch

from benchmarks.optim.model import build_params

os.environ.setdefault("DS_ACCELERATOR", "cpu")
LR = 1e-3
ADAMW: dict[str, Any] = {"lr": LR, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01}


def main() -> int:
    from deepspeed.ops.adam import DeepSpeedCPUAdam  # type: ignore[import-not-found]

    theirs = build_params(2_000_000, seed=3, grads=False)
    ours = [torch.nn.Parameter(p.detach().clone()) for p in theirs]
    deepspeed_adam = DeepSpeedCPUAdam(theirs, adamw_mode=True, **ADAMW)
    torch_adam = torch.optim.AdamW(ours, fused=True, **ADAMW)
    generator = torch.Generator().manual_seed(4)
    for _ in range(5):
        for left, right in zip(theirs, ours, strict=True):
            left.grad = torch.empty_like(left).normal_(0.0, 1e-3, generator=generator)
            right.grad = left.grad.clone()
        deepspeed_adam.step()
        torch_adam.step()
    with torch.no_grad():
        abs_diff = max(float((a - b).abs().max()) for a, b in zip(theirs, ours, strict=True))
    of_update = abs_diff / LR
    print(json.dumps({"max_abs_diff": abs_diff, "diff_of_one_update": of_update, "steps": 5}))
    return 0 if of_update < 1e-3 else 1


if __name__ == "__main__":
    raise SystemExit(main())
