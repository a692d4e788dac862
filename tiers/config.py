"""Store configuration: a dict or a TOML file, validated into tiers and a TieredStore.

    policy = "cost"            # lru | lfu | cost
    engine = "auto"            # auto | uring | thread (the I/O engine of NVMe tiers)
    write_through = true       # optional; default: true when an NVMe tier exists

    [[tiers]]
    kind = "dram"              # hbm | dram | cxl | nvme, fastest first
    capacity = "4GiB"          # bytes as an int, or a string with B/KiB/MiB/GiB/TiB/KB/MB/GB/TB

    [[tiers]]
    kind = "nvme"
    capacity = "100GiB"
    path = "/data/tierkit"     # a writable directory on a filesystem with O_DIRECT
    direct = true              # optional

Other per-tier keys: ``name``; ``device`` (hbm); ``node``, ``emulate``, ``added_latency_s``,
``bandwidth_bytes_per_s`` (cxl). Every mistake is a :class:`ConfigError` naming where it is.
"""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path
from typing import Any

from tiers.errors import DirectIOUnsupportedError, InvalidArgumentError
from tiers.factory import ENGINE_KINDS, create_engine
from tiers.policy import POLICIES
from tiers.store import TieredStore
from tiers.tier import Tier

__all__ = ["ConfigError", "load_config", "open_store", "parse_size"]

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "tib": 1 << 40,
}
_TIER_KEYS = {
    "hbm": {"device"},
    "dram": {"pinned"},
    "cxl": {"node", "emulate", "added_latency_s", "bandwidth_bytes_per_s"},
    "nvme": {"path", "direct", "extent_file_bytes"},
}
_TOP_KEYS = {"policy", "engine", "write_through", "tiers", "promote_on_hit"}


class ConfigError(InvalidArgumentError):
    """The configuration is invalid; the message says where and why."""


def parse_size(value: Any, where: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        size = value
    elif isinstance(value, str) and (m := re.fullmatch(r"\s*([\d.]+)\s*([a-zA-Z]*)\s*", value)):
        unit = _UNITS.get(m.group(2).lower())
        if unit is None:
            raise ConfigError(f"{where}: unknown unit {m.group(2)!r} in {value!r}")
        size = int(float(m.group(1)) * unit)
    else:
        raise ConfigError(f"{where}: expected a size like 4096 or '4GiB', got {value!r}")
    if size <= 0:
        raise ConfigError(f"{where}: capacity must be positive, got {value!r}")
    return size


def load_config(source: dict[str, Any] | str | os.PathLike[str]) -> dict[str, Any]:
    """A validated, normalised copy of ``source`` (a dict, or a path to a TOML file)."""
    if not isinstance(source, dict):
        try:
            source = tomllib.loads(Path(source).read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"cannot read configuration {os.fspath(source)!r}: {exc}") from exc
    unknown = set(source) - _TOP_KEYS
    if unknown:
        raise ConfigError(f"unknown configuration keys {sorted(unknown)}")
    policy = source.get("policy", "lru")
    if policy not in POLICIES:
        raise ConfigError(f"policy: unknown {policy!r}; choose from {sorted(POLICIES)}")
    engine = source.get("engine", "auto")
    if engine not in ENGINE_KINDS:
        raise ConfigError(f"engine: unknown {engine!r}; choose from {list(ENGINE_KINDS)}")
    tiers = source.get("tiers")
    if not isinstance(tiers, list) or not tiers:
        raise ConfigError("tiers: a non-empty list of tier tables is required")
    return {
        **source,
        "policy": policy,
        "engine": engine,
        "tiers": [_check_tier(t, f"tiers[{i}]") for i, t in enumerate(tiers)],
    }


def _check_tier(tier: Any, where: str) -> dict[str, Any]:
    if not isinstance(tier, dict):
        raise ConfigError(f"{where}: expected a table, got {tier!r}")
    kind = tier.get("kind")
    if kind not in _TIER_KEYS:
        raise ConfigError(f"{where}.kind: unknown tier {kind!r}; choose from {sorted(_TIER_KEYS)}")
    unknown = set(tier) - {"kind", "capacity", "name"} - _TIER_KEYS[kind]
    if unknown:
        raise ConfigError(f"{where}: unknown keys {sorted(unknown)} for a {kind} tier")
    checked = {**tier, "capacity": parse_size(tier.get("capacity"), f"{where}.capacity")}
    checked.setdefault("name", kind)
    if kind == "nvme":
        checked["path"] = _writable_directory(tier.get("path"), f"{where}.path")
    return checked


def _writable_directory(path: Any, where: str) -> str:
    if not isinstance(path, str | os.PathLike) or not os.fspath(path):
        raise ConfigError(f"{where}: an NVMe tier needs a directory path")
    directory = os.fspath(path)
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"{where}: cannot create {directory!r}: {exc.strerror}") from exc
    if not os.access(directory, os.W_OK | os.X_OK):
        raise ConfigError(f"{where}: {directory!r} is not writable")
    return directory


async def _build_tier(spec: dict[str, Any], engine_kind: str, where: str) -> Tier:
    kind, name, capacity = spec["kind"], spec["name"], spec["capacity"]
    extra = {k: v for k, v in spec.items() if k in _TIER_KEYS[kind] - {"path"}}
    if kind == "hbm":
        from tiers.hbm import HbmTier

        return HbmTier(name, capacity, **extra)
    if kind == "dram":
        from tiers.dram import DramTier

        return DramTier(name, capacity, **extra)
    if kind == "cxl":
        from tiers.cxl import CxlTier

        return CxlTier(name, capacity, **extra)
    from tiers.nvme import NvmeTier

    engine = create_engine(engine_kind)
    try:
        return await NvmeTier.open(
            name, capacity, spec["path"], engine=engine, owns_engine=True, **extra
        )
    except DirectIOUnsupportedError as exc:
        await engine.aclose()
        raise ConfigError(f"{where}: {exc}; set direct = false to use the page cache") from exc
    except BaseException:
        await engine.aclose()
        raise


async def open_store(source: dict[str, Any] | str | os.PathLike[str]) -> TieredStore:
    """Validate ``source`` and open its tiers and store (call from the store's event loop)."""
    config = load_config(source)
    tiers: list[Tier] = []
    try:
        for index, spec in enumerate(config["tiers"]):
            tiers.append(await _build_tier(spec, config["engine"], f"tiers[{index}]"))
        return TieredStore(
            tiers,
            config["policy"],
            write_through=config.get("write_through"),
            promote_on_hit=config.get("promote_on_hit", True),
        )
    except BaseException:
        for tier in tiers:
            await tier.aclose()
        raise
