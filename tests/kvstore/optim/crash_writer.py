"""Crash writer for test_crash: trains with an NVMe-resident OffloadedOptimizer in
``directory`` (resuming from its committed step) and prints each committed step until killed.

Usage: crash_writer.py DIRECTORY SEED. Prints ``ready`` once the optimizer is open, then the
committed step number after each ``step()`` returns. Subgroups are small, so a step is many
durable writes and a kill lands inside one.
"""

from __future__ import annotations

import sys

import torch

from kvstore.optim import OffloadedOptimizer
from tests.kvstore.optim.train_loop import groups, make_model, train

SUBGROUP_BYTES = 4 * 16  # 48 subgroups: a step is mostly durable writes
KWARGS = {"lr": 0.01, "weight_decay": 0.01}


def open_optimizer(model: torch.nn.Module, directory: str) -> OffloadedOptimizer:
    return OffloadedOptimizer(
        groups(model),  # type: ignore[arg-type]
        torch.optim.AdamW,
        tier="nvme",
        directory=directory,
        subgroup_bytes=SUBGROUP_BYTES,
        **KWARGS,
    )


def main() -> None:
    directory = sys.argv[1]
    model = make_model()
    opt = open_optimizer(model, directory)  # resumes: the parameters get the masters
    print("ready", flush=True)
    step = opt.committed_step

    def acknowledge(_: int) -> None:
        print(opt.committed_step, flush=True)

    train(model, opt, 10_000, first_step=step, schedule="constant", on_step=acknowledge)


if __name__ == "__main__":
    main()
