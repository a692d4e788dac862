"""Store configuration: a dict or a TOML file, validated into tiers and a TieredStore.

    policy = "cost"            # lru | lfu | cost | tinylfu
    engine = "auto"            # auto | uring | thread | gds (the I/O engine of NVMe tiers;
                               # other than auto: a private IORuntime with that engine)
    write_through = true       # optional; default: true when an NVMe tier exists
    promote_on_hit = true      # optional

    [[tiers]]
    kind = "dram"              # hbm | dram | cxl | nvme, fastest first
    capacity = "4GiB"          # bytes as an int, or a string with B/KiB/MiB/GiB/TiB/KB/MB/GB/TB

    [[tiers]]
    kind = "nvme"
    capacity = "100GiB"
    path = "/data/tierkit"     # a writable directory on a filesystem with O_DIRECT
    create = true              # make the tier if the path holds none (default false: a
                               # mistyped path is an error, not a new, empty tier)
    direct = true              # optional

Other per-tier keys: ``name`` (unique; default: the kind); ``device`` (hbm: "cpu", "cuda" or
"cuda:N"); ``pinned`` (dram); ``node``, ``emulate``, ``added_latency_s`` (0 to 1),
``bandwidth_bytes_per_s`` (> 0) (cxl); ``extent_file_bytes`` (nvme). Every value is checked for
type and range (tiers.storage.config_checks: booleans must be booleans, "no" is refused),
unknown keys are refused with the known ones listed, and every mistake is a :class:`ConfigError`
naming where it is (``tiers[1].write_through: expected a boolean, got 'no'``). Then the capacities
must fit this machine (tiers.store.config_fit): memory tiers within its memory, NVMe tiers within
their filesystem's size (not its free space: NVMe files grow as records come).
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any

from tiers.io.errors import ConfigError, DirectIOUnsupportedError, FileMissingError, NoMemoryError
from tiers.io.factory import ENGINE_KINDS
from tiers.io.runtime import IORuntime, default_runtime
from tiers.nvme.space import FILE_STRIDE_BYTES
from tiers.storage.config_checks import (
    Check,
    boolean,
    choice,
    integer,
    number,
    optional,
    parse_size,
    refuse_unknown,
    size,
    text,
)
from tiers.storage.tier import Tier
from tiers.store.config_fit import check_fit
from tiers.store.policy import POLICIES
from tiers.store.tiered_store import TieredStore

__all__ = ["ConfigError", "load_config", "open_store", "parse_size"]


def _device(value: Any, where: str, error: type[ConfigError] = ConfigError) -> str:
    kind, _, index = text(value, where, error).partition(":")
    if kind not in ("cpu", "cuda") or (index and (kind == "cpu" or not index.isdigit())):
        raise error(f"expected 'cpu', 'cuda' or 'cuda:N', got {value!r}", where)
    return value


def _path(value: Any, where: str, error: type[ConfigError] = ConfigError) -> str:
    if not isinstance(value, str | os.PathLike) or not os.fspath(value):
        raise error(f"an NVMe tier needs a directory path, got {value!r}", where)
    return os.fspath(value)


_TOP_LEVEL: dict[str, Check] = {
    "policy": choice(sorted(POLICIES)),
    "engine": choice(ENGINE_KINDS),
    "write_through": optional(boolean),  # None: on exactly when there is an NVMe tier
    "promote_on_hit": boolean,
}
_COMMON: dict[str, Check] = {"capacity": size(), "name": text}
_TIER_KEYS: dict[str, dict[str, Check]] = {
    "hbm": {"device": optional(_device)},
    "dram": {"pinned": optional(boolean)},
    "cxl": {
        "node": optional(integer(0)),
        "emulate": optional(boolean),
        "added_latency_s": number(0.0, 1.0),
        # at most 1 PB/s, beyond any device: a typo of a few digits is caught
        "bandwidth_bytes_per_s": number(0.0, above_minimum=True, maximum=1e15),
    },
    "nvme": {
        "path": _path,
        "create": boolean,
        "direct": boolean,
        "extent_file_bytes": size(4096, FILE_STRIDE_BYTES - 4096),
    },
}
_KIND = choice(_TIER_KEYS)


def load_config(source: dict[str, Any] | str | os.PathLike[str]) -> dict[str, Any]:
    """A validated, normalised copy of ``source`` (a dict, or a path to a TOML file): sizes in
    bytes, every tier named, NVMe directories created where ``create`` says so. Raises
    ConfigError."""
    source = _read(source)
    refuse_unknown(source, [*_TOP_LEVEL, "tiers"], None, "the store configuration")
    config = {key: check(source[key], key) for key, check in _TOP_LEVEL.items() if key in source}
    config.setdefault("policy", "lru")
    config.setdefault("engine", "auto")
    tiers = source.get("tiers")
    if not isinstance(tiers, list) or not tiers:
        raise ConfigError(f"a non-empty list of tier tables is required, got {tiers!r}", "tiers")
    specs = [_check_tier(tier, f"tiers[{i}]") for i, tier in enumerate(tiers)]
    _name_tiers(specs)
    if config.get("write_through") and not any(spec["kind"] == "nvme" for spec in specs):
        raise ConfigError("true needs an nvme tier (the persistent one)", "write_through")
    for index, spec in enumerate(specs):
        if spec["kind"] == "nvme":
            where = f"tiers[{index}].path"
            spec["path"] = _writable_directory(spec["path"], spec.get("create", False), where)
    check_fit(specs)
    return {**config, "tiers": specs}


def _read(source: Any) -> dict[str, Any]:
    if isinstance(source, dict):
        return source
    if not isinstance(source, str | os.PathLike):
        raise ConfigError(f"expected a dict or a TOML file's path, got {source!r}")
    try:
        return tomllib.loads(Path(source).read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read configuration {os.fspath(source)!r}: {exc}") from exc


def _check_tier(tier: Any, where: str) -> dict[str, Any]:
    if not isinstance(tier, dict):
        raise ConfigError(f"expected a table, got {tier!r}", where)
    kind = _KIND(tier.get("kind"), f"{where}.kind")
    checks = {**_COMMON, **_TIER_KEYS[kind]}
    refuse_unknown(tier, ["kind", *checks], where, f"a {kind} tier")
    for required in ("capacity", "path") if kind == "nvme" else ("capacity",):
        if required not in tier:
            raise ConfigError(f"missing: a {kind} tier needs a {required}", f"{where}.{required}")
    checked = {
        key: checks[key](value, f"{where}.{key}") for key, value in tier.items() if key != "kind"
    }
    return {"kind": kind, **checked}


def _name_tiers(specs: list[dict[str, Any]]) -> None:
    """Refuse a name given twice; name each unnamed tier after its kind (``dram``, then
    ``dram-2`` ... where taken), so every tier's name says which one it is."""
    owners: dict[str, int] = {}
    for index, spec in enumerate(specs):
        if "name" in spec:
            if spec["name"] in owners:
                raise ConfigError(
                    f"{spec['name']!r} already names tiers[{owners[spec['name']]}]",
                    f"tiers[{index}].name",
                )
            owners[spec["name"]] = index
    for index, spec in enumerate(specs):
        if "name" not in spec:
            name, copy = spec["kind"], 1
            while name in owners:
                copy += 1
                name = f"{spec['kind']}-{copy}"
            spec["name"] = name
            owners[name] = index


def _writable_directory(directory: str, create: bool, where: str) -> str:
    if not create and not os.path.isdir(directory):
        missing = f"no such directory {directory!r} (set create = true to make a tier there)"
        raise ConfigError(missing, where)
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot create {directory!r}: {exc.strerror}", where) from exc
    if not os.access(directory, os.W_OK | os.X_OK):
        raise ConfigError(f"{directory!r} is not writable", where)
    return directory


async def _build_tier(spec: dict[str, Any], runtime: IORuntime, where: str) -> Tier:
    kind, name, capacity = spec["kind"], spec["name"], spec["capacity"]
    extra = {k: v for k, v in spec.items() if k in _TIER_KEYS[kind] and k != "path"}
    if kind != "nvme":
        try:
            return _memory_tier(kind, name, capacity, extra)
        except NoMemoryError as exc:  # the machine had less to give than its limits said
            raise ConfigError(str(exc), where) from exc
    from tiers.nvme.nvme_tier import NvmeTier

    try:
        return await NvmeTier.open(name, capacity, spec["path"], runtime=runtime, **extra)
    except DirectIOUnsupportedError as exc:
        raise ConfigError(f"{exc}; set direct = false to use the page cache", where) from exc
    except FileMissingError as exc:
        raise ConfigError(exc.strerror or str(exc), f"{where}.path") from exc


def _memory_tier(kind: str, name: str, capacity: int, extra: dict[str, Any]) -> Tier:
    if kind == "hbm":
        from tiers.memory.hbm import HbmTier

        return HbmTier(name, capacity, **extra)
    if kind == "dram":
        from tiers.memory.dram import DramTier

        return DramTier(name, capacity, **extra)
    from tiers.memory.cxl import CxlTier

    return CxlTier(name, capacity, **extra)


async def open_store(
    source: dict[str, Any] | str | os.PathLike[str], runtime: IORuntime | None = None
) -> TieredStore:
    """Validate ``source`` and open its tiers and store (call from the store's event loop).

    ``runtime``: the IORuntime the NVMe tiers lease their engine, buffers and executors from
    (default: ``default_runtime()``). A configured ``engine`` other than "auto" asks for a
    private runtime with that engine instead, closed with the store; giving both is an error.
    """
    config = load_config(source)
    owned: IORuntime | None = None
    if config["engine"] != "auto":
        if runtime is not None:
            raise ConfigError("give runtime= or an engine other than auto, not both", "engine")
        owned = runtime = IORuntime(engine=config["engine"])
    runtime = runtime or default_runtime()
    tiers: list[Tier] = []
    try:
        for index, spec in enumerate(config["tiers"]):
            tiers.append(await _build_tier(spec, runtime, f"tiers[{index}]"))
        store = TieredStore(
            tiers,
            config["policy"],
            write_through=config.get("write_through"),
            promote_on_hit=config.get("promote_on_hit", True),
        )
    except BaseException:
        for tier in tiers:
            await tier.aclose()
        if owned is not None:
            owned.close()
        raise
    store.owned_runtime = owned
    return store
