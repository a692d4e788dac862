"""What OffloadedOptimizer refuses, and how clearly: each mistake is an OffloadError (a
tiers.TierkitError) that names it, raised before anything is changed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from kvstore.optim import OffloadedOptimizer, OffloadError
from tiers import TierkitError


def _params() -> list[torch.nn.Parameter]:
    torch.manual_seed(0)
    return [torch.nn.Parameter(torch.randn(4, 5)), torch.nn.Parameter(torch.randn(3))]


class _NormalisedSGD(torch.optim.Optimizer):
    """Divides each update by its tensor's norm: not elementwise."""

    def __init__(self, params: Any, lr: float = 0.1) -> None:
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.add_(p.grad / p.grad.norm(), alpha=-group["lr"])


def test_the_error_is_a_tierkit_error() -> None:
    assert issubclass(OffloadError, TierkitError)


@pytest.mark.parametrize(
    ("cls", "match"),
    [
        (torch.optim.LBFGS, "LBFGS cannot be offloaded: it needs a closure"),
        (torch.optim.SparseAdam, "sparse"),
        (torch.optim.Adafactor, "factored"),
        (_NormalisedSGD, "not elementwise"),
        (torch.nn.Linear, "torch.optim.Optimizer subclass"),
    ],
)
def test_optimizers_that_are_not_elementwise_are_refused(cls: Any, match: str) -> None:
    with pytest.raises(OffloadError, match=match):
        OffloadedOptimizer(_params(), cls)


def test_bad_optimizer_arguments_are_refused() -> None:
    with pytest.raises(OffloadError, match="cannot step"):
        OffloadedOptimizer(_params(), torch.optim.AdamW, lr=-1.0)


def test_nvme_paths(tmp_path: Path) -> None:
    with pytest.raises(OffloadError, match="needs directory="):
        OffloadedOptimizer(_params(), tier="nvme")
    missing = tmp_path / "typo" / "state"
    with pytest.raises(OffloadError, match=r"no such directory .*create=True"):
        OffloadedOptimizer(_params(), tier="nvme", directory=missing, create=False)
    assert not missing.exists()
    with pytest.raises(OffloadError, match="no NVMe tier"):  # exists, but holds no tier
        OffloadedOptimizer(_params(), tier="nvme", directory=tmp_path, create=False)
    with pytest.raises(OffloadError, match='"dram", "nvme" or a store configuration'):
        OffloadedOptimizer(_params(), tier="ssd")
    with OffloadedOptimizer(_params(), tier="nvme", directory=missing) as opt:  # create=True
        assert not opt.resumed
    with OffloadedOptimizer(_params(), tier="nvme", directory=missing, create=False) as opt:
        assert opt.resumed


def test_parameters_it_cannot_hold_are_refused() -> None:
    on_meta = torch.nn.Parameter(torch.empty(3, device="meta"))
    with pytest.raises(OffloadError, match=r"mixed devices \(cpu, meta\)"):
        OffloadedOptimizer([*_params(), on_meta])
    with pytest.raises(OffloadError, match="float64"):
        OffloadedOptimizer([torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))])
    strided = torch.nn.Parameter(torch.zeros(4, 4).t())
    with pytest.raises(OffloadError, match="contiguous"):
        OffloadedOptimizer([strided])
    with pytest.raises(OffloadError, match="host_budget_bytes"):
        OffloadedOptimizer(_params(), host_budget_bytes=4096)


def test_use_after_close_and_fixed_groups() -> None:
    params = _params()
    opt = OffloadedOptimizer(params, torch.optim.SGD, lr=0.1, momentum=0.9)
    with pytest.raises(OffloadError, match="groups are fixed"):
        opt.add_param_group({"params": [torch.nn.Parameter(torch.zeros(2))]})
    opt.close()
    opt.close()  # idempotent
    for p in params:
        p.grad = torch.ones_like(p)
    before = [p.clone() for p in params]
    for call in (opt.step, opt.state_dict, lambda: opt.load_state_dict({})):
        with pytest.raises(OffloadError, match="closed"):
            call()
    assert all(torch.equal(p, b) for p, b in zip(params, before, strict=True))


def test_sparse_gradients_are_refused() -> None:
    embedding = torch.nn.Embedding(10, 3, sparse=True)
    with OffloadedOptimizer(embedding.parameters(), torch.optim.SGD, lr=0.1) as opt:
        embedding(torch.tensor([1, 2])).sum().backward()
        with pytest.raises(OffloadError, match="sparse gradient"):
            opt.step()


def test_closure_and_step_hooks_work_as_in_torch() -> None:
    ours_params, ref_params = _params(), _params()
    calls: list[str] = []
    with OffloadedOptimizer(ours_params, torch.optim.SGD, lr=0.1, momentum=0.9) as opt:
        opt.register_step_pre_hook(lambda *_: calls.append("pre"))
        opt.register_step_post_hook(lambda *_: calls.append("post"))
        ref = torch.optim.SGD(ref_params, lr=0.1, momentum=0.9)
        for _ in range(3):
            for o, ps in ((opt, ours_params), (ref, ref_params)):

                def closure(o: Any = o, ps: Any = ps) -> torch.Tensor:
                    o.zero_grad()
                    loss = sum((p * p).sum() for p in ps)
                    loss.backward()
                    return loss

                loss = o.step(closure)
                assert isinstance(loss, torch.Tensor)
        assert calls == ["pre", "post"] * 3
        assert all(torch.equal(a, b) for a, b in zip(ours_params, ref_params, strict=True))
