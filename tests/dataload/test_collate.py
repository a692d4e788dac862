"""collate(): default_collate's values, in a loader worker without a shared-memory segment."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import default_collate, get_worker_info
from torch.utils.data._utils import worker as torch_worker

from dataload import collate as collate_module
from dataload.collate import collate


def _samples() -> list:
    return [(torch.full((1, 3, 2), float(i)), i, {"n": torch.tensor([i, -i])}) for i in range(5)]


@pytest.fixture
def as_a_loader_worker(monkeypatch):
    """This process dressed as a loader worker: the flag and DataLoader's worker info."""
    info = torch_worker.WorkerInfo(id=1, num_workers=2, seed=7, dataset=None)
    monkeypatch.setattr(torch_worker, "_worker_info", info)
    monkeypatch.setattr(collate_module, "_in_loader_worker", True)
    return info


def test_in_a_worker_the_batch_is_default_collates_in_private_memory(as_a_loader_worker) -> None:
    expected = default_collate(_samples())  # in a worker: a new shared-memory segment per batch
    assert expected[0].is_shared()
    got = collate(_samples(), None)
    assert not got[0].is_shared() and not got[2]["n"].is_shared()
    torch.testing.assert_close(got, expected)
    assert get_worker_info() is as_a_loader_worker  # hidden only for that call


def test_a_collate_fn_is_called_as_given_and_sees_the_worker_info(as_a_loader_worker) -> None:
    seen = []

    def mine(samples: list) -> int:
        seen.append(get_worker_info())
        return len(samples)

    assert collate(_samples(), mine) == 5
    assert seen == [as_a_loader_worker]


def test_outside_a_worker_it_is_default_collate() -> None:
    torch.testing.assert_close(collate(_samples(), None), default_collate(_samples()))
