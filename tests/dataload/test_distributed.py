"""A real two-process torch.distributed (gloo) run: ranks come from the process group."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.dataload.conftest import write_stamped

COUNT = 301
WORKER = """
import sys, torch, torch.distributed as dist
from dataload import FixedSizeSource, ShuffledLoader
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + sys.argv[2],
                        rank=int(sys.argv[3]), world_size=2)
with ShuffledLoader(FixedSizeSource(sys.argv[1], 16), 16, seed=4) as loader:  # rank: from dist
    ids = torch.tensor([i for b in loader for i in b.numpy().view("<i8")[:, 0].tolist()])
    batches = torch.tensor([len(loader)])
gathered = [torch.zeros_like(ids) for _ in range(2)]
dist.all_gather(gathered, ids)
if dist.get_rank() == 0:
    print("IDS", *[",".join(map(str, g.tolist())) for g in gathered], sep="\\n")
dist.destroy_process_group()
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_two_gloo_ranks_split_an_epoch_disjointly_and_completely(tmp_path: Path) -> None:
    path = write_stamped(tmp_path / "d.bin", COUNT)
    port = str(_free_port())
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(path), port, str(rank)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for rank in range(2)
    ]
    outs = [p.communicate(timeout=90) for p in procs]
    for proc, (_, err) in zip(procs, outs, strict=True):
        if proc.returncode:
            pytest.fail(f"rank failed ({proc.returncode}): {err[-2000:]}")
    lines = outs[0][0].split("IDS\n", 1)[1].split()
    rank0, rank1 = (np.array(line.split(","), np.int64) for line in lines)
    assert len(rank0) == len(rank1) == 151  # padded to equal shares
    assert len(set(rank0.tolist()) & set(rank1.tolist())) <= 1  # only the one padding repeat
    assert set(rank0.tolist()) | set(rank1.tolist()) == set(range(COUNT))
