"""Bit-exactness of ours against torch's AdamW in memory, at a small size, inside the benchmark.

Two copies of the same small model step side by side with the same fresh gradients each step:
one under ``torch.optim.AdamW(fused=True)``, one under ``OffloadedOptimizer`` over AdamW with
the same settings, with a subgroup small enough that the model spans several subgroups (and a
tensor straddles a boundary). After the last step every parameter must be equal bit for bit
(``torch.equal`` on the raw bits, so -0.0 vs 0.0 or NaN payloads would count as different).
"""

from __future__ import annotations

from pathlib import Path

import torch

from benchmarks.optim.model import build_params
from benchmarks.optim.worker import ADAMW_KWARGS

__all__ = ["check_exact"]


def _same_bits(left: torch.Tensor, right: torch.Tensor) -> bool:
    return torch.equal(left.detach().view(torch.int32), right.detach().view(torch.int32))


def check_exact(
    tier: str,
    directory: Path | None,
    params: int = 1_500_000,
    steps: int = 4,
    master: str = "tier",
) -> dict[str, object]:
    """Step both copies ``steps`` times; the report says whether every parameter matched."""
    from kvstore.optim import OffloadedOptimizer

    ours_params = build_params(params, seed=1, grads=False)
    ref_params = [torch.nn.Parameter(p.detach().clone()) for p in ours_params]
    reference = torch.optim.AdamW(ref_params, fused=True, **ADAMW_KWARGS)
    subgroup_bytes = 1 << 20  # a quarter of one 1024x4096 matrix: several subgroups per tensor
    generator = torch.Generator().manual_seed(2)
    with OffloadedOptimizer(
        ours_params,
        torch.optim.AdamW,
        tier=tier,
        directory=directory,
        subgroup_bytes=subgroup_bytes,
        master=master,
        fused=True,
        **ADAMW_KWARGS,
    ) as ours:
        for _ in range(steps):
            for mine, theirs in zip(ours_params, ref_params, strict=True):
                grad = torch.empty_like(mine).normal_(0.0, 1e-3, generator=generator)
                mine.grad = grad
                theirs.grad = grad.clone()
            ours.step()
            reference.step()
    mismatched = [
        index
        for index, (mine, theirs) in enumerate(zip(ours_params, ref_params, strict=True))
        if not _same_bits(mine, theirs)
    ]
    return {
        "tier": tier,
        "master": master,
        "params": params,
        "steps": steps,
        "subgroup_bytes": subgroup_bytes,
        "exact": not mismatched,
        "mismatched_tensors": len(mismatched),
    }
