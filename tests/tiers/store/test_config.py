"""Store configuration: dicts and TOML files validated with errors that say where."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.any_values import ANY_VALUE
from tiers.io.errors import InvalidArgumentError, NoMemoryError
from tiers.store import config_fit
from tiers.store.config import ConfigError, load_config, open_store, parse_size
from tiers.store.machine_limits import Limit, filesystem_size, host_memory
from tiers.testing.tier_contract import as_bytes


def _config(tmp_path: Path, **overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "policy": "cost",
        "tiers": [
            {"kind": "hbm", "capacity": "64KiB", "device": "cpu"},
            {"kind": "dram", "capacity": "1MiB"},
            {"kind": "cxl", "capacity": "1MiB"},
            {"kind": "nvme", "capacity": "8MiB", "path": str(tmp_path / "nvme"), "create": True},
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
create = true
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


# ----------------------------------------------------------------- every setting checked
def _good(tmp_path: Path) -> dict[str, Any]:
    """One tier of each kind with every key set to a good value."""
    return {
        "policy": "lru",
        "engine": "thread",
        "write_through": True,
        "promote_on_hit": False,
        "tiers": [
            {"kind": "hbm", "capacity": "64KiB", "name": "h", "device": "cpu"},
            {"kind": "dram", "capacity": 1 << 20, "name": "d", "pinned": None},
            {
                "kind": "cxl",
                "capacity": "1.5MiB",
                "name": "c",
                "emulate": True,
                "node": None,
                "added_latency_s": 0,
                "bandwidth_bytes_per_s": 25e9,
            },
            {
                "kind": "nvme",
                "capacity": "8 MiB",
                "name": "n",
                "path": str(tmp_path / "nvme"),
                "create": True,
                "direct": False,
                "extent_file_bytes": "1MiB",
            },
        ],
    }


_NAN, _INF = float("nan"), float("inf")
# (where, bad values): every key of the configuration and of each tier kind
_BAD_VALUES: list[tuple[str, list[Any]]] = [
    ("policy", ["random", 3, None, ["lru"], True]),
    ("engine", ["fast", 1, None, ""]),
    ("write_through", ["no", "false", "true", 1, 0, 1.0]),
    ("promote_on_hit", ["maybe", "false", 1, None]),
    ("tiers", [[], {}, "dram", None]),
    ("tiers[0].kind", ["tape", None, ["dram"], 1, "DRAM"]),
    ("tiers[1].capacity", [0, -1, "3 furlongs", "1.5.3GiB", "big", 1.5, True, "1.5B", "", "GiB"]),
    ("tiers[1].capacity", [None, "0MiB", "-4KiB", "1e9", "4 GiB GiB", 1 << 80]),
    ("tiers[0].name", ["", 3, None, "  "]),
    ("tiers[0].device", ["gpu", 0, "cuda:x", "cpu:0", ""]),
    ("tiers[1].pinned", ["yes", "false", 1]),
    ("tiers[2].node", [-1, "0", 1.0, True, 4096]),
    ("tiers[2].emulate", ["false", 0, "yes"]),
    ("tiers[2].added_latency_s", [-1e-9, "fast", _NAN, 2.0, True, None]),
    ("tiers[2].bandwidth_bytes_per_s", ["fast", 0, -1, _NAN, _INF, "25GB", None]),
    ("tiers[3].path", ["", 3, None]),
    ("tiers[3].direct", ["false", 1, "no"]),
    ("tiers[3].create", ["yes", 1, "true"]),
    ("tiers[3].extent_file_bytes", ["big", 0, 100, "2TiB", 1.5, True]),
]
_CASES = [(where, value) for where, values in _BAD_VALUES for value in values]


def _set(config: dict[str, Any], where: str, value: Any) -> None:
    if where.startswith("tiers["):
        index, key = int(where[6]), where.split(".", 1)[1]
        config["tiers"][index][key] = value
    else:
        config[where] = value


def test_the_good_values_are_accepted_and_normalised(tmp_path: Path) -> None:
    config = load_config(_good(tmp_path))
    assert [t["capacity"] for t in config["tiers"]] == [64 << 10, 1 << 20, 3 << 19, 8 << 20]
    assert config["tiers"][3]["extent_file_bytes"] == 1 << 20
    assert config["write_through"] is True and config["promote_on_hit"] is False
    assert config["tiers"][2]["bandwidth_bytes_per_s"] == 25e9


@pytest.mark.parametrize(("where", "value"), _CASES, ids=[f"{w}={v!r}" for w, v in _CASES])
def test_every_bad_value_is_a_config_error_naming_its_place(
    tmp_path: Path, where: str, value: Any
) -> None:
    config = _good(tmp_path)
    _set(config, where, value)
    with pytest.raises(ConfigError) as info:
        load_config(config)
    assert info.value.where == where, str(info.value)
    assert str(info.value).startswith(f"{where}: ")
    assert isinstance(info.value, InvalidArgumentError)


def test_the_message_says_what_was_expected(tmp_path: Path) -> None:
    config = _good(tmp_path)
    config["tiers"][1]["write_through"] = "no"
    with pytest.raises(ConfigError, match=r"unknown keys \['write_through'\] for a dram tier"):
        load_config(config)
    config = _good(tmp_path)
    config["write_through"] = "no"
    with pytest.raises(ConfigError, match=r"^write_through: expected a boolean, got 'no'$"):
        load_config(config)
    config = _good(tmp_path)
    config["colour"] = "red"
    with pytest.raises(ConfigError, match=r"unknown keys \['colour'\].*known: \['engine'"):
        load_config(config)


@pytest.mark.parametrize(
    ("where", "drop"), [("tiers[1].capacity", "capacity"), ("tiers[3].path", "path")]
)
def test_missing_required_keys_are_named(tmp_path: Path, where: str, drop: str) -> None:
    config = _good(tmp_path)
    del config["tiers"][int(where[6])][drop]
    with pytest.raises(ConfigError) as info:
        load_config(config)
    assert info.value.where == where


def test_write_through_needs_an_nvme_tier(tmp_path: Path) -> None:
    config = _good(tmp_path)
    config["tiers"].pop()
    with pytest.raises(ConfigError) as info:
        load_config(config)
    assert info.value.where == "write_through"
    config["write_through"] = None  # automatic: off without a persistent tier
    assert load_config(config)["write_through"] is None


def test_names_are_unique_and_default_to_the_kind(tmp_path: Path) -> None:
    tiers = [{"kind": "dram", "capacity": 4096} for _ in range(3)]
    tiers[2]["name"] = "dram-2"
    names = [t["name"] for t in load_config({"tiers": tiers})["tiers"]]
    assert names == ["dram", "dram-3", "dram-2"]
    tiers[0]["name"] = "dram-2"
    with pytest.raises(ConfigError) as info:
        load_config({"tiers": tiers})
    assert info.value.where == "tiers[2].name" and "tiers[0]" in str(info.value)


def test_a_cxl_node_must_be_online(tmp_path: Path) -> None:
    config = _good(tmp_path)
    config["tiers"][2]["node"] = 999
    with pytest.raises(ConfigError, match="not online") as info:
        load_config(config)
    assert info.value.where == "tiers[2].node"


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("1.5GiB", 3 << 29),
        ("1.1GB", 1_100_000_000),
        (".5KiB", 512),
        ("7.", 7),
        (" 2 mib ", 2 << 20),
    ],
)
def test_sizes_are_exact(text: str, size: int) -> None:
    assert parse_size(text, "x") == size


@settings(max_examples=300, deadline=None)
@given(
    st.integers(1, 1 << 50),
    st.sampled_from(["", "B", "KB", "MB", "GB", "TB", "KiB", "MiB", "GiB", "TiB", "kib", "gb"]),
    st.sampled_from(["", " "]),
)
def test_a_whole_number_with_a_unit_is_that_many_bytes(count: int, unit: str, space: str) -> None:
    factor = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
    factor.update({"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40})
    assert parse_size(f"{count}{space}{unit}", "x") == count * factor[unit.lower()]


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=12), st.floats(), st.booleans(), st.none(), st.integers()))
def test_any_size_is_a_positive_int_or_a_config_error(value: Any) -> None:
    try:
        size = parse_size(value, "where")
    except ConfigError as exc:
        assert exc.where == "where"
    else:
        assert isinstance(size, int) and size > 0


_KEYS = [where for where, _ in _BAD_VALUES if where != "tiers"]


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.sampled_from(_KEYS), ANY_VALUE)
def test_any_value_anywhere_is_accepted_or_named(tmp_path: Path, where: str, value: Any) -> None:
    """Whatever a setting holds, the answer is a config or a ConfigError naming that setting,
    never a TypeError or a ValueError from deep inside."""
    if where.endswith(".path"):
        value = value if value in (None, "", 0) else 3  # never create arbitrary directories
    config = _good(tmp_path)
    _set(config, where, value)
    try:
        load_config(config)
    except ConfigError as exc:
        assert exc.where is not None and exc.where.startswith(where.split(".")[0]), str(exc)


# ----------------------------------------------------------------- capacities honest
def test_a_memory_capacity_above_the_machine_is_refused_naming_the_tier() -> None:
    limit = host_memory()
    assert limit is not None and limit.bytes > 0
    too_big = {"tiers": [{"kind": "dram", "capacity": limit.bytes + 4096, "name": "big"}]}
    with pytest.raises(ConfigError, match=r"dram tier 'big' is more than there is") as info:
        load_config(too_big)
    assert info.value.where == "tiers[0].capacity" and limit.source in str(info.value)
    for kind in ("cxl", "dram"):  # the whole of it is a promise the machine can keep
        load_config({"tiers": [{"kind": kind, "capacity": limit.bytes}]})


def test_memory_tiers_share_the_host_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(config_fit, "host_memory", lambda: Limit(1 << 30, "MemTotal"))
    tiers: list[dict[str, Any]] = [
        {"kind": "hbm", "capacity": "256MiB", "device": "cpu"},
        {"kind": "dram", "capacity": "512MiB"},
        {"kind": "cxl", "capacity": "256MiB"},  # emulated here: ordinary memory
    ]
    load_config({"tiers": tiers})  # exactly 1 GiB
    tiers[2]["capacity"] = (256 << 20) + 4096
    with pytest.raises(ConfigError) as info:
        load_config({"tiers": tiers})
    message = str(info.value)
    assert info.value.where == "tiers[2].capacity"
    assert "tiers[0] ('hbm'), tiers[1] ('dram')" in message and "1 GiB (MemTotal)" in message


def test_nvme_capacity_is_bounded_by_the_filesystem_size_not_its_free_space(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = filesystem_size(str(tmp_path))
    free_bytes = os.statvfs(tmp_path).f_bavail * os.statvfs(tmp_path).f_frsize
    assert real.bytes >= free_bytes
    nvme = {
        "kind": "nvme",
        "capacity": real.bytes + 4096,
        "path": str(tmp_path / "n"),
        "create": True,
    }
    with pytest.raises(ConfigError, match="the size of the filesystem") as info:
        load_config({"tiers": [nvme]})
    assert info.value.where == "tiers[0].capacity"
    # Two tiers on one filesystem share it.
    half = {**nvme, "capacity": real.bytes // 2 + 4096}
    other = {**half, "path": str(tmp_path / "m")}
    with pytest.raises(ConfigError) as info:
        load_config({"tiers": [half, other]})
    assert info.value.where == "tiers[1].capacity" and "tiers[0] ('nvme')" in str(info.value)
    # Above the free space is fine: the files grow as records come.
    monkeypatch.setattr(config_fit, "filesystem_size", lambda path: Limit(16 << 40, "fs"))
    load_config({"tiers": [{**nvme, "capacity": "4TiB"}]})


def test_a_store_far_larger_than_the_free_disk_opens_and_grows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(config_fit, "filesystem_size", lambda path: Limit(16 << 40, "fs"))
    directory = tmp_path / "n"
    config = {
        "tiers": [{"kind": "nvme", "capacity": "4TiB", "path": str(directory), "create": True}]
    }

    def disk_bytes() -> int:
        return sum(path.stat().st_blocks * 512 for path in directory.glob("extents-*"))

    async def body() -> None:
        store = await open_store(config)
        assert disk_bytes() == 0
        await store.put("v", np.zeros(1 << 20, np.uint8))
        assert 1 << 20 < disk_bytes() <= 65 << 20
        await store.aclose()

    asyncio.run(body())


def test_extent_files_must_fit_the_open_file_limit(tmp_path: Path) -> None:
    nvme = {"kind": "nvme", "capacity": "64GiB", "path": str(tmp_path), "extent_file_bytes": 4096}
    with pytest.raises(ConfigError, match="files open") as info:
        load_config({"tiers": [nvme]})
    assert info.value.where == "tiers[0].extent_file_bytes"
    nvme["extent_file_bytes"] = "1GiB"
    load_config({"tiers": [nvme]})


def test_an_arena_the_os_refuses_is_a_config_error_naming_the_tier(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(config_fit, "host_memory", lambda: Limit(1 << 60, "MemTotal"))
    config = {"tiers": [{"kind": "dram", "capacity": 1 << 50, "name": "huge"}]}  # > address space

    async def body() -> None:
        with pytest.raises(ConfigError, match=r"ENOMEM.*dram tier 'huge'") as info:
            await open_store(config)
        assert info.value.where == "tiers[0]"
        assert isinstance(info.value.__cause__, NoMemoryError)

    asyncio.run(body())


@pytest.mark.gpu
def test_an_hbm_capacity_above_the_device_is_refused() -> None:
    import torch

    total = torch.cuda.get_device_properties(0).total_memory
    config = {"tiers": [{"kind": "hbm", "capacity": total + (1 << 30), "device": "cuda:0"}]}

    async def body() -> None:
        with pytest.raises(ConfigError, match=r"hbm tier 'hbm'.*the device has") as info:
            await open_store(config)
        assert info.value.where == "tiers[0]"

    asyncio.run(body())


# ----------------------------------------------------------------- what the machine has
def _fake_machine(root: Path, mem_total_kib: int, cgroup: str, files: dict[str, str]) -> None:
    (root / "proc" / "self").mkdir(parents=True)
    (root / "proc" / "meminfo").write_text(f"MemFree: 1 kB\nMemTotal:  {mem_total_kib} kB\n")
    (root / "proc" / "self" / "cgroup").write_text(cgroup)
    for name, text in files.items():
        path = root / "cg" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


@pytest.mark.parametrize(
    ("cgroup", "files", "expected"),
    [
        ("0::/\n", {}, (8 << 30, "MemTotal")),
        ("0::/a/b\n", {"a/memory.max": f"{2 << 30}\n", "a/b/memory.max": "max\n"}, 2 << 30),
        ("0::/a/b\n", {"a/b/memory.max": f"{3 << 30}\n", "memory.max": f"{1 << 40}"}, 3 << 30),
        ("0::/gone/x\n", {"memory.max": f"{1 << 30}\n"}, 1 << 30),  # only the root is visible
        ("4:memory:/c\n0::/\n", {"memory/c/memory.limit_in_bytes": f"{5 << 30}"}, 5 << 30),
        ("4:memory:/c\n", {"memory/memory.limit_in_bytes": "9223372036854771712"}, 8 << 30),
        ("5:cpu,memory:/d\n", {"memory/d/memory.limit_in_bytes": f"{6 << 30}\n"}, 6 << 30),
    ],
)
def test_host_memory_is_memtotal_or_a_lower_cgroup_limit(
    tmp_path: Path, cgroup: str, files: dict[str, str], expected: Any
) -> None:
    _fake_machine(tmp_path, 8 << 20, cgroup, files)
    limit = host_memory(str(tmp_path / "proc"), str(tmp_path / "cg"))
    assert limit is not None
    size_bytes = expected[0] if isinstance(expected, tuple) else expected
    assert limit.bytes == size_bytes
    assert ("MemTotal" if size_bytes == 8 << 30 else "cgroup") in limit.source


def test_a_mistyped_nvme_path_is_an_error_not_a_new_empty_tier(tmp_path: Path) -> None:
    """Without create = true, a path that is missing, or holds no tier, is refused and nothing
    is made there; with it, the tier is made, and later opens need no flag."""
    config = _config(tmp_path)
    del config["tiers"][3]["create"]
    with pytest.raises(ConfigError, match=r"tiers\[3\].path: no such directory .*create = true"):
        load_config(config)
    assert not (tmp_path / "nvme").exists()
    (tmp_path / "nvme").mkdir()  # exists, but holds no tier

    async def refused() -> None:
        with pytest.raises(ConfigError, match=r"tiers\[3\].path: no NVMe tier in .*create"):
            await open_store(config)

    asyncio.run(refused())
    assert list((tmp_path / "nvme").iterdir()) == []

    async def made_then_reopened() -> None:
        made = await open_store({**config, "tiers": [{**config["tiers"][3], "create": True}]})
        await made.put("k", b"v" * 100)
        await made.aclose()
        store = await open_store(config)  # the tier exists now: no flag needed
        assert as_bytes(await store.get("k")) == b"v" * 100
        await store.aclose()

    asyncio.run(made_then_reopened())


def test_open_store_leases_from_the_given_runtime_or_a_private_one(tmp_path: Path) -> None:
    from tiers.io.runtime import IORuntime

    def config(engine: str) -> dict[str, Any]:
        tier = {"kind": "nvme", "capacity": "1MiB", "path": str(tmp_path / engine), "create": True}
        return {"engine": engine, "tiers": [tier]}

    async def main() -> None:
        runtime = IORuntime(engine="thread")
        store = await open_store(config("auto"), runtime=runtime)
        assert store.tiers[0].runtime is runtime and store.owned_runtime is None  # type: ignore[attr-defined]
        assert runtime.stats()["leases"] == 1
        await store.put("k", b"v")
        await store.aclose()
        assert runtime.stats()["leases"] == 0 and not runtime.closed
        with pytest.raises(ConfigError, match="not both"):
            await open_store(config("thread"), runtime=runtime)
        runtime.close()
        store = await open_store(config("thread"))
        private = store.owned_runtime
        assert private is not None and store.tiers[0].engine.name == "thread"  # type: ignore[attr-defined]
        await store.aclose()
        assert private.closed

    asyncio.run(main())
