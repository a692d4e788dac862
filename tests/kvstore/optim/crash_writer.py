"""Crash writer for test_crash: trains with an NVMe-resident OffloadedOptimizer in
``directory`` (resuming from its committed step) and prints each committed step until killed.

Usage: crash_writer.py DIRECTORY SEED [MASTER]. Prints ``ready`` once the optimizer is open,
then the committed step number after each ``step()`` returns. Subgroups are small, so a step is
many durable writes and a kill lands inside one. With MASTER ``params`` (the parameters are the
masters, params_master.py) it follows the recipe that makes a kill resumable: after each step
the model's weights are saved (``DIRECTORY/weights.pt``, replaced atomically, with their step),
then ``opt.checkpoint("saved")``.
"""

from __future__ import annotations

import os
import sys

import torch

from kvstore.optim import OffloadedOptimizer
from tests.kvstore.optim.train_loop import groups, make_model, train

SUBGROUP_BYTES = 4 * 64  # 14 subgroups: a step is mostly durable writes
KWARGS = {"lr": 0.01, "weight_decay": 0.01}
WEIGHTS = "weights.pt"


def open_optimizer(
    model: torch.nn.Module, directory: str, master: str = "tier"
) -> OffloadedOptimizer:
    return OffloadedOptimizer(
        groups(model),  # type: ignore[arg-type]
        torch.optim.AdamW,
        tier="nvme",
        directory=directory,
        subgroup_bytes=SUBGROUP_BYTES,
        master=master,
        **KWARGS,
    )


def save_weights(model: torch.nn.Module, directory: str, step: int) -> None:
    path = os.path.join(directory, WEIGHTS)
    torch.save({"step": step, "model": model.state_dict()}, path + ".tmp")
    os.replace(path + ".tmp", path)


def main() -> None:
    directory = sys.argv[1]
    master = sys.argv[3] if len(sys.argv) > 3 else "tier"
    model = make_model()
    opt = open_optimizer(model, directory, master)  # resumes: the parameters get the masters
    print("ready", flush=True)
    step = opt.committed_step

    def acknowledge(_: int) -> None:
        if master == "params":
            save_weights(model, directory, opt.committed_step)
            opt.checkpoint("saved")
        print(opt.committed_step, flush=True)

    train(model, opt, 10_000, first_step=step, schedule="constant", on_step=acknowledge)


if __name__ == "__main__":
    main()
