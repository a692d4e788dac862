"""The layers import only downward, and each package's __all__ names what it exports."""

from __future__ import annotations

import ast
import importlib
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
}


def _imported_packages(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names & (set(ALLOWED) | {"tierkit"})


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_no_upward_imports(package: str) -> None:
    for path in (ROOT / package).rglob("*.py"):
        bad = _imported_packages(path) - ALLOWED[package] - {package}
        assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)} (upward or sideways)"


def test_tiers_public_surface_is_complete() -> None:
    tiers = importlib.import_module("tiers")
    assert len(set(tiers.__all__)) == len(tiers.__all__)
    for name in tiers.__all__:
        assert hasattr(tiers, name), name
