"""StateTier reads a large object as several byte-range gets at once, cut on the NVMe tier's
chunk boundaries, and writes a batch of objects with one put_many; an optimizer whose objects
take those paths (several read parts, batches of two writes) still steps exactly like torch."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstore.optim import OffloadedOptimizer, OffloadError, sizing, state_tier
from kvstore.optim.state_tier import read_spans
from tiers.nvme import chunk_log2_for


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 1 << 32), st.integers(1, 8))
def test_spans_cover_the_object_once_on_chunk_boundaries(size_bytes: int, parts: int) -> None:
    spans = read_spans(size_bytes, parts)
    assert spans[0][0] == 0 and sum(n for _, n in spans) == size_bytes
    assert all(a + n == b for (a, n), (b, _) in pairwise(spans))
    chunk = 1 << max(chunk_log2_for(size_bytes), 12)
    assert all(a % chunk == 0 for a, _ in spans)
    assert 1 <= len(spans) <= parts
    if len(spans) > 1:
        assert min(n for _, n in spans[:-1]) >= state_tier._MIN_PART_BYTES


def test_split_reads_and_batched_writes_step_exactly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sizing, "MAX_SLOTS", 5)  # ahead 1, writes in batches of 2
    torch.manual_seed(0)
    shapes = [(1024, 1024)] * 5 + [(1000,)]  # 4 MiB matrices: a subgroup each
    ours_params = [torch.nn.Parameter(torch.randn(s)) for s in shapes]
    ref_params = [torch.nn.Parameter(p.detach().clone()) for p in ours_params]
    ref = torch.optim.AdamW(ref_params, lr=0.01, fused=True)
    with OffloadedOptimizer(
        ours_params,
        tier="nvme",
        directory=tmp_path,
        master="tier",
        subgroup_bytes=4 << 20,
        lr=0.01,
        fused=True,
    ) as ours:
        assert ours.versions.tier.read_parts > 1 and len(ours.staging.slots) == 5
        assert len(read_spans(ours.staging.object_bytes, ours.versions.tier.read_parts)) > 1
        for step in range(2):
            for p, q in zip(ours_params, ref_params, strict=True):
                q.grad = torch.randn(p.shape, generator=torch.Generator().manual_seed(step))
                p.grad = q.grad.clone()
            ours.step()
            ref.step()
        assert all(torch.equal(p, q) for p, q in zip(ours_params, ref_params, strict=True))
    with OffloadedOptimizer(  # reopened: the stored objects read back in parts
        [torch.nn.Parameter(torch.zeros(s)) for s in shapes],
        tier="nvme",
        directory=tmp_path,
        subgroup_bytes=4 << 20,
        lr=0.01,
        fused=True,
    ) as reopened:
        assert reopened.master == "tier" and reopened.committed_step == 2
        got = reopened.state_dict()["state"]
        want = ref.state_dict()["state"]
        assert all(torch.equal(got[i]["exp_avg_sq"], want[i]["exp_avg_sq"]) for i in want)


def test_a_missing_object_is_named() -> None:
    with OffloadedOptimizer(
        [torch.nn.Parameter(torch.zeros(4096))],
        tier={"tiers": [{"kind": "dram", "capacity": 1 << 24}]},
        master="tier",
    ) as opt:
        tier = opt.versions.tier
        into = opt.staging.slot_bytes(0, 4096)
        with pytest.raises(OffloadError, match="is missing"):
            tier.read("optim/sg9/v9", into).result()
