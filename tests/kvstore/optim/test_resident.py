"""resident=True: the DRAM state in per-subgroup host buffers, stepped in place, stays exactly
torch's optimizer (every optimizer, split and whole parameters, bf16), saves and loads torch's
state dict, and accounts host memory in proportion to the model."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from kvstore.optim import OffloadedOptimizer, OffloadError
from tests.kvstore.optim.test_exact import OPTIMIZERS as ALL_OPTIMIZERS
from tests.kvstore.optim.test_exact import _ids, _Shadowed
from tests.kvstore.optim.train_loop import groups, make_model, same_params, train

CASES = [(optimizer, 97) for optimizer in ALL_OPTIMIZERS] + [
    (ALL_OPTIMIZERS[0], 1 << 20),
    (ALL_OPTIMIZERS[2], 1 << 20),
]


@pytest.mark.parametrize(
    ("optimizer", "subgroup_elems"), CASES, ids=[f"{_ids(o)}-{n}" for o, n in CASES]
)
def test_resident_steps_exactly_like_torch(
    optimizer: tuple[type[torch.optim.Optimizer], dict[str, Any]], subgroup_elems: int
) -> None:
    cls, kwargs = optimizer
    ours_model, ref_model = make_model(), make_model()
    ref = cls(groups(ref_model), **kwargs)
    schedule = "cosine" if cls is torch.optim.SGD else "lambda"
    with OffloadedOptimizer(
        groups(ours_model), cls, resident=True, subgroup_bytes=4 * subgroup_elems, **kwargs
    ) as ours:
        train(ours_model, ours, 20, schedule=schedule)
        train(ref_model, ref, 20, schedule=schedule)
        assert same_params(ours_model, ref_model)
        assert ours.committed_step == 20
        saved, theirs = ours.state_dict(), ref.state_dict()
        assert saved["state"].keys() == theirs["state"].keys()
        for index, entry in theirs["state"].items():
            for key, value in entry.items():
                assert torch.equal(saved["state"][index][key], value), (index, key)


def test_fp32_gradients_are_read_in_place_not_copied() -> None:
    """The gradient staging buffer stays untouched for fp32 CPU gradients."""
    model = make_model()
    with OffloadedOptimizer(groups(model), resident=True, subgroup_bytes=4 * 97) as opt:
        opt.staging.grad[:] = 0xAB
        train(model, opt, 3)
        assert np.all(opt.staging.grad == 0xAB)


def test_bf16_params_step_like_torch_on_fp32_masters() -> None:
    model, shadow = make_model(dtype=torch.bfloat16), make_model(dtype=torch.bfloat16)
    masters = make_model(dtype=torch.bfloat16).float()
    with OffloadedOptimizer(
        groups(model), torch.optim.AdamW, resident=True, subgroup_bytes=4 * 97, lr=0.01
    ) as ours:
        train(model, ours, 8)
        train(shadow, _Shadowed(torch.optim.AdamW(groups(masters), lr=0.01), masters, shadow), 8)
        assert same_params(model, shadow)


def test_load_state_dict_continues_exactly() -> None:
    kwargs: dict[str, Any] = {"lr": 0.01, "weight_decay": 0.01}
    model, reference = make_model(), make_model()
    ref = torch.optim.AdamW(groups(reference), **kwargs)
    train(reference, ref, 5, schedule="constant")
    with OffloadedOptimizer(groups(model), resident=True, subgroup_bytes=4 * 97, **kwargs) as opt:
        train(model, opt, 5, schedule="constant")
        saved = opt.state_dict()
    restarted = make_model()
    restarted.load_state_dict(model.state_dict())
    with OffloadedOptimizer(
        groups(restarted), resident=True, subgroup_bytes=4 * 97, **kwargs
    ) as opt:
        opt.load_state_dict(saved)
        train(restarted, opt, 4, first_step=5, schedule="constant")
        train(reference, ref, 4, first_step=5, schedule="constant")
        assert same_params(restarted, reference)


def test_host_memory_is_the_state_and_nvme_is_refused() -> None:
    sizes = {}
    for numel in (10_240, 409_600):
        params = [torch.nn.Parameter(torch.zeros(numel))]
        with OffloadedOptimizer(params, resident=True, subgroup_bytes=4 * 4096) as opt:
            sizes[numel] = opt.staging.host_bytes
            with pytest.raises(OffloadError, match="persistent"):
                opt.checkpoint("a")
        assert sizes[numel] == 3 * 4 * numel + 4 * 4096  # master + 2 moments, one grad buffer
    with pytest.raises(OffloadError, match='resident=True needs tier="dram"'):
        OffloadedOptimizer([torch.nn.Parameter(torch.zeros(4))], tier="nvme", resident=True)


def test_fp32_parameters_are_their_masters_and_stay_safe() -> None:
    """Whole fp32 parameters view their masters (no copy back); a model.load_state_dict into
    them is what the next step starts from, as with torch; a parameter given new storage is
    copied into again; close gives each parameter its own storage with its values."""
    kwargs: dict[str, Any] = {"lr": 0.01}
    model, reference = make_model(), make_model()
    ref = torch.optim.AdamW(groups(reference), **kwargs)
    with OffloadedOptimizer(groups(model), resident=True, subgroup_bytes=1 << 20, **kwargs) as opt:
        buffers = [(b.ctypes.data, b.ctypes.data + b.nbytes) for b in opt.staging.slots]
        inside = [any(lo <= p.data_ptr() < hi for lo, hi in buffers) for p in model.parameters()]
        assert all(inside)
        train(model, opt, 3, schedule="constant")
        train(reference, ref, 3, schedule="constant")
        model.load_state_dict(reference.state_dict())  # the same values: still exact
        first = next(model.parameters())
        first.data = first.data.clone()  # no longer the master: copied into after a step
        train(model, opt, 3, first_step=3, schedule="constant")
        train(reference, ref, 3, first_step=3, schedule="constant")
        assert same_params(model, reference)
    after = [p.detach().clone() for p in model.parameters()]
    for p in model.parameters():
        assert not any(lo <= p.data_ptr() < hi for lo, hi in buffers)
    assert all(torch.equal(a, p) for a, p in zip(after, reference.parameters(), strict=True))


def test_a_step_makes_one_inner_step_call_over_every_subgroup() -> None:
    """Resident state steps all subgroups with one inner optimizer (one fused kernel call per
    param group, as torch's own step), not one per subgroup."""
    calls: list[int] = []

    class Counted(torch.optim.AdamW):
        def step(self, closure: Any = None) -> Any:  # type: ignore[override]
            calls.append(len(self.param_groups))
            return super().step(closure)

    model, reference = make_model(), make_model()
    ref = torch.optim.AdamW(groups(reference), lr=0.01)
    with OffloadedOptimizer(groups(model), Counted, subgroup_bytes=4 * 97, lr=0.01) as opt:
        assert len(opt.subgroups) > 4
        calls.clear()
        train(model, opt, 1, schedule="constant")
        # the first step makes the states: a subgroup at a time (torch allocates them)
        assert len(calls) > 2
        calls.clear()
        train(model, opt, 3, first_step=1, schedule="constant")
        train(reference, ref, 4, schedule="constant")
        assert calls == [2, 2, 2]  # the model's two param groups, once a step
        assert same_params(model, reference)
