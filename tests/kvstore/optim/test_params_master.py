"""master="params": fp32 CPU parameters are the masters and the tier stores only the states.

The updates stay torch's bit for bit (every optimizer kind that keeps per-element state:
moments, a momentum buffer, Adagrad's eagerly made sum); the stored objects hold only the
states; a reopened state is paired with the parameters' own step (committed or a named
checkpoint) or refused; torch-layout state dicts go out and come in; what cannot be a master is
refused. The kill -9 story is in test_crash.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from kvstore.optim import OffloadedOptimizer, OffloadError
from kvstore.optim.manifest import object_key
from tests.kvstore.optim.train_loop import groups, make_model, same_params, train

OPTIMIZERS: list[tuple[type[torch.optim.Optimizer], dict[str, Any]]] = [
    (torch.optim.AdamW, {"lr": 0.01}),
    (torch.optim.AdamW, {"lr": 0.01, "fused": True}),
    (torch.optim.SGD, {"lr": 0.05, "momentum": 0.9, "nesterov": True}),
    (torch.optim.Adagrad, {"lr": 0.05, "initial_accumulator_value": 0.1}),
]
STEPS = 12


def _open(model: torch.nn.Module, directory: Path | None, **kwargs: Any) -> OffloadedOptimizer:
    """Ours with master="params", on NVMe in ``directory`` (None: the staged DRAM tier)."""
    kwargs = {"lr": 0.01, **kwargs}
    return OffloadedOptimizer(
        groups(model),  # type: ignore[arg-type]
        kwargs.pop("cls", torch.optim.AdamW),
        tier="dram" if directory is None else "nvme",
        resident=False,
        directory=directory,
        subgroup_bytes=4 * 97,
        master="params",
        **kwargs,
    )


@pytest.mark.parametrize(("cls", "kwargs"), OPTIMIZERS, ids=lambda v: getattr(v, "__name__", ""))
def test_steps_exactly_like_torch_and_stores_only_the_states(
    cls: type[torch.optim.Optimizer], kwargs: dict[str, Any]
) -> None:
    """Through the (staged) DRAM tier: the stepping is the same on NVMe, which the reopen
    tests below and test_crash.py use."""
    ours_model, ref_model = make_model(), make_model()
    ref = cls(groups(ref_model), **kwargs)
    with _open(ours_model, None, cls=cls, **kwargs) as ours:
        train(ours_model, ours, STEPS)
        train(ref_model, ref, STEPS)
        assert same_params(ours_model, ref_model)
        saved = ours.state_dict()
        for index, entry in ref.state_dict()["state"].items():
            assert saved["state"][index].keys() == entry.keys()  # no "master": params are
            for key, value in entry.items():
                assert torch.equal(torch.as_tensor(saved["state"][index][key]), value), key
        tier, first = ours.versions.tier, ours.subgroups[0]
        key = object_key(first.index, ours.versions.manifest.versions[first.index])
        stored = tier.runtime.submit(tier.store.get(key)).result()
        states = len(ours.schema.vector_keys)
        assert len(stored) == states * first.stride * 4  # no master section


def test_reopen_pairs_the_states_with_the_parameters_step(tmp_path: Path) -> None:
    model = make_model()
    with _open(model, tmp_path) as opt:
        train(model, opt, 3, schedule="constant")
        at_three = {k: v.clone() for k, v in model.state_dict().items()}
        opt.checkpoint("three")
        train(model, opt, 2, first_step=3, schedule="constant")
        at_five = {k: v.clone() for k, v in model.state_dict().items()}
    reference = make_model()
    ref = torch.optim.AdamW(groups(reference), lr=0.01)
    train(reference, ref, 5, schedule="constant")

    model = make_model()
    model.load_state_dict(at_five)  # the committed step's weights: resumed as is
    with _open(model, tmp_path) as opt:
        assert (opt.resumed, opt.resumed_from, opt.committed_step) == (True, None, 5)
        with pytest.raises(OffloadError, match="checkpoint 'three'"):
            opt.restore("three")  # the parameters are step 5's, not the checkpoint's
        assert opt.committed_step == 5  # refusing changed nothing
        train(model, opt, 1, first_step=5, schedule="constant")
        train(reference, ref, 1, first_step=5, schedule="constant")
        assert same_params(model, reference)

    model = make_model()
    model.load_state_dict(at_three)  # a checkpoint's weights: that checkpoint is adopted
    with _open(model, tmp_path) as opt:
        assert (opt.resumed_from, opt.committed_step) == ("three", 3)
        reference = make_model()
        ref = torch.optim.AdamW(groups(reference), lr=0.01)
        train(reference, ref, 3, schedule="constant")
        got, want = opt.state_dict()["state"][0], ref.state_dict()["state"][0]
        assert got["exp_avg"].equal(want["exp_avg"]) and got["step"].equal(want["step"])

    with pytest.raises(OffloadError, match="not that step's weights"):
        _open(make_model(), tmp_path)  # step 0's weights: neither step 3 nor the checkpoint


def test_a_checkpoint_name_taken_again_frees_what_only_it_held(tmp_path: Path) -> None:
    model = make_model()
    with _open(model, tmp_path) as opt:
        for step in range(3):
            train(model, opt, 1, first_step=step, schedule="constant")
            opt.checkpoint("latest")
        stored = opt.versions.tier.keys("optim/sg")
        assert len(stored) == len(opt.subgroups)  # the current objects, nothing older


def test_state_dicts_in_torchs_layout_round_trip(tmp_path: Path) -> None:
    model, reference = make_model(), make_model()
    ref = torch.optim.AdamW(groups(reference), lr=0.01)
    train(reference, ref, 4)
    model.load_state_dict(reference.state_dict())
    with _open(model, tmp_path) as opt:
        opt.load_state_dict(ref.state_dict())  # torch's own state dict migrates in
        train(model, opt, 3, first_step=4)
        train(reference, ref, 3, first_step=4)
        assert same_params(model, reference)
        assert set(opt.state_dict()["state"][0]) == set(ref.state_dict()["state"][0])


def test_what_cannot_be_a_master_is_refused(tmp_path: Path) -> None:
    bf16 = make_model(dtype=torch.bfloat16)
    with pytest.raises(OffloadError, match="fp32 CPU parameters"):
        _open(bf16, tmp_path)
    with pytest.raises(OffloadError, match="resident=True"):
        OffloadedOptimizer(make_model().parameters(), resident=True, master="params")
    with pytest.raises(OffloadError, match="master must be"):
        OffloadedOptimizer(make_model().parameters(), master="model")
