"""The layers import only downward, and each package's __all__ names what it exports.

Between packages: tiers <- vectordb, dataload, kvstore <- server (tierkit, the command line,
and the benchmarks sit on top). Inside tiers: io <- storage <- memory, nvme <- store, and
testing may use them all. Products reach tiers only through public names: ``tiers`` or one of
its subpackages, and only names in that module's ``__all__``.
"""

from __future__ import annotations

import ast
import importlib
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# package -> the tierkit packages it may import
ALLOWED = {
    "tiers": set(),
    "vectordb": {"tiers"},
    "dataload": {"tiers"},
    "kvstore": {"tiers"},
    "server": {"tiers", "vectordb", "kvstore", "dataload"},
    "tierkit": {"tiers", "vectordb", "kvstore", "dataload", "server"},
}
# tiers subpackage -> the tiers subpackages it may import besides itself
TIERS_ALLOWED = {
    "io": set(),
    "storage": {"io"},
    "memory": {"io", "storage"},
    "nvme": {"io", "storage"},
    "store": {"io", "storage", "memory", "nvme"},
    "testing": {"io", "storage", "memory", "nvme", "store"},
}
PUBLIC_MODULES = ["tiers"] + [f"tiers.{sub}" for sub in TIERS_ALLOWED]
CONSUMERS = ["vectordb", "dataload", "kvstore", "server", "tierkit", "benchmarks"]


def _imports(path: Path) -> Iterator[tuple[str, list[str]]]:
    """(module, names imported from it) for every absolute import; names is [] for ``import m``."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, []
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            yield node.module, [alias.name for alias in node.names]


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_no_upward_imports(package: str) -> None:
    for path in (ROOT / package).rglob("*.py"):
        imported = {module.split(".")[0] for module, _ in _imports(path)}
        bad = imported & (set(ALLOWED) - ALLOWED[package] - {package})
        assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)} (upward or sideways)"


@pytest.mark.parametrize("sub", sorted(TIERS_ALLOWED))
def test_tiers_layers_import_only_downward(sub: str) -> None:
    for path in (ROOT / "tiers" / sub).rglob("*.py"):
        for module, _ in _imports(path):
            parts = module.split(".")
            if parts[0] != "tiers":
                continue
            where = path.relative_to(ROOT)
            assert len(parts) > 1, f"{where} imports the tiers facade; import the layer instead"
            allowed = TIERS_ALLOWED[sub] | {sub}
            assert parts[1] in allowed, f"{where} imports {module}: {sub} may use {sorted(allowed)}"


@pytest.mark.parametrize("package", CONSUMERS)
def test_products_import_only_public_names(package: str) -> None:
    exported = {name: set(importlib.import_module(name).__all__) for name in PUBLIC_MODULES}
    for path in (ROOT / package).rglob("*.py"):
        if "out" in path.relative_to(ROOT).parts:
            continue  # benchmarks/out/: scratch, peers' virtual environments
        for module, names in _imports(path):
            if module.split(".")[0] != "tiers":
                continue
            where = path.relative_to(ROOT)
            assert module in exported, f"{where} imports {module}, not a public tiers module"
            private = set(names) - exported[module]
            assert not private, f"{where} imports {sorted(private)} from {module}, not in __all__"


@pytest.mark.parametrize("name", PUBLIC_MODULES)
def test_public_surfaces_are_complete(name: str) -> None:
    module = importlib.import_module(name)
    assert len(set(module.__all__)) == len(module.__all__)
    for exported in module.__all__:
        assert getattr(module, exported) is not None, exported


def test_tiers_facade_exports_what_a_user_needs_and_no_test_doubles() -> None:
    tiers = importlib.import_module("tiers")
    needed = {"create_engine", "open_store", "TieredStore", "Tier", "TierkitError", "NvmeTier"}
    assert needed <= set(tiers.__all__)
    assert not {"FaultyEngine", "FaultyEnv", "PowerCutReport"} & set(tiers.__all__)


def test_every_package_ships_in_the_wheel() -> None:
    import tomllib

    listed = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    for init in ROOT.glob("*/**/__init__.py"):
        package = ".".join(init.parent.relative_to(ROOT).parts)
        if package.split(".")[0] in ALLOWED:
            assert package in listed, f"{package} is missing from pyproject's packages"
