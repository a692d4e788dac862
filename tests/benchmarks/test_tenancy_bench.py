"""The tenancy benchmark (issue 15) runs as ``python -m benchmarks.vectordb.tenancy --smoke``.

As in test_smoke.py: a subprocess, as a user runs it, on a tiny generated set (3,000 x 64, no
../shared needed), every system in its own worker process; only the shape of the last line is
checked, and that the benchmark's own access check found no leak. The figures mean nothing.
About 15 s on a 2 vCPU machine.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.common.paths import REPO_ROOT

pytestmark = pytest.mark.slow
_TIMEOUT_S = 100  # a smoke run takes ~15 s here; this only stops a hung one
_SET = "tsmoke-3000"
KEYS = frozenset(
    {"tenant_recall_at_10", "tenant_qps_vs_filtered_ivf_small", "tenant_qps_vs_per_tenant"}
    | {"tenant_resident_vs_shared", "grant_us", "revoke_us", "leaks", "leaks_by_system"}
    | {"tenant_recall_at_10_by_class", "qps_at_recall_0_9", "targets", "notes", "datasets"}
)
PEERS = {"shared_filter", "faiss_ivf_filter", "per_tenant_ram", "per_tenant_disk"}


def test_tenancy_smoke(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.vectordb.tenancy", "--smoke", "--out", str(tmp_path)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, f"tenancy benchmark failed:\n{done.stderr[-4000:]}"
    lines = done.stdout.strip().splitlines()
    assert lines, f"the tenancy benchmark printed nothing:\n{done.stderr[-2000:]}"
    figures = json.loads(lines[-1])
    missing = KEYS - figures.keys()
    assert not missing, f"the last line lacks {sorted(missing)}"
    assert figures["datasets"] == [_SET]
    assert not any("failed" in note for note in figures["notes"]), figures["notes"]
    leaks = figures["leaks_by_system"][_SET]
    assert set(leaks) >= PEERS, leaks
    assert not any(leaks.values()), f"results a tenant may not read: {leaks}"
    if "ours" not in leaks:  # a commit without the tenancy API: said so, not failed
        assert any("no tenancy API" in note for note in figures["notes"])
        return
    assert figures["leaks"][_SET] == 0  # searches and the update phase
    assert 0 < figures["tenant_recall_at_10"][_SET] <= 1
    for peer in ("per_tenant_ram", "per_tenant_disk"):  # exact: the ground truth itself
        assert figures["qps_at_recall_0_9"][_SET][peer]["all"] is not None
    assert figures["grant_us"][_SET] is not None and figures["revoke_us"][_SET] is not None
