"""Store configuration: dicts and TOML files validated with errors that say where."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tiers.config import ConfigError, load_config, open_store, parse_size
from tiers.tier_testing import as_bytes


def _config(tmp_path: Path, **overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "policy": "cost",
        "tiers": [
            {"kind": "hbm", "capacity": "64KiB", "device": "cpu"},
            {"kind": "dram", "capacity": "1MiB"},
            {"kind": "cxl", "capacity": "1MiB"},
            {"kind": "nvme", "capacity": "8MiB", "path": str(tmp_path / "nvme")},
        ],
    }
    base.update(overrides)
    return base


@pytest.mark.parametrize(
    ("text", "size"),
    [(4096, 4096), ("4KiB", 4096), ("1.5 GB", 1_500_000_000), ("2MiB", 2 << 20), ("10", 10)],
)
def test_sizes(text: Any, size: int) -> None:
    assert parse_size(text, "x") == size


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda c: c["tiers"].append({"kind": "tape", "capacity": 1}), r"tiers\[4\].kind: unknown"),
        (lambda c: c["tiers"][1].update(capacity=0), r"tiers\[1\].capacity: .*positive"),
        (lambda c: c["tiers"][1].update(capacity="3 furlongs"), r"unknown unit"),
        (lambda c: c["tiers"][3].update(path="/proc/nope"), r"tiers\[3\].path: cannot create"),
        (lambda c: c["tiers"][0].update(colour="red"), r"unknown keys \['colour'\]"),
        (lambda c: c.update(policy="random"), r"policy: unknown"),
        (lambda c: c.update(tiers=[]), r"non-empty list"),
    ],
)
def test_invalid_configs_name_the_problem(tmp_path: Path, mutate: Any, message: str) -> None:
    config = _config(tmp_path)
    mutate(config)
    with pytest.raises(ConfigError, match=message):
        load_config(config)


def test_unwritable_directory(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root may write anywhere; the read-only check cannot fail here")
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    config = _config(tmp_path)
    config["tiers"][3]["path"] = str(locked)
    with pytest.raises(ConfigError, match="not writable"):
        load_config(config)


def test_direct_io_unsupported_is_a_config_error(tmp_path: Path) -> None:
    shm = Path("/dev/shm")
    if not shm.is_dir():
        pytest.skip("no /dev/shm here")
    probe = shm / f"tierkit-probe-{os.getpid()}"
    try:
        fd = os.open(probe, os.O_CREAT | os.O_RDWR | os.O_DIRECT)
        os.close(fd)
        pytest.skip("this kernel's tmpfs supports O_DIRECT")
    except OSError:
        pass
    finally:
        probe.unlink(missing_ok=True)
    config = _config(tmp_path)
    config["tiers"][3]["path"] = str(shm / f"tierkit-test-{os.getpid()}")

    async def body() -> None:
        with pytest.raises(ConfigError, match="O_DIRECT"):
            await open_store(config)

    asyncio.run(body())


def test_toml_file_opens_a_working_store(tmp_path: Path) -> None:
    path = tmp_path / "store.toml"
    path.write_text(f"""
policy = "lru"
[[tiers]]
kind = "dram"
capacity = "64KiB"
[[tiers]]
kind = "nvme"
capacity = "4MiB"
path = "{tmp_path / "data"}"
""")
    value = np.arange(50_000, dtype=np.uint8)

    async def body() -> None:
        store = await open_store(path)
        assert store.write_through and [t.kind for t in store.tiers] == ["dram", "nvme"]
        await store.put("v", value)
        assert as_bytes(await store.get("v")) == value.tobytes()
        await store.aclose()
        reopened = await open_store(path)  # the NVMe tier kept the acknowledged object
        assert as_bytes(await reopened.get("v")) == value.tobytes()
        await reopened.aclose()

    asyncio.run(body())


def test_bad_toml_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text("tiers = [")
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(path)
