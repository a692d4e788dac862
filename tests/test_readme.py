"""The README's code blocks run exactly as written, so that a reader's first copy-paste works.

Every ```python block runs as its own script and every ```bash block as a bash script, each in
a fresh temporary directory (its working directory, removed afterwards) with the repository on
PYTHONPATH and the venv's commands on PATH. A block that must not run in the test suite (the
full demo, the suite itself, benchmarks, installs) carries a visible marker on the line just
before its fence, and is reported as skipped with the reason::

    <!-- readme-test: skip (the reason) -->
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MARKER = re.compile(r"<!--\s*readme-test:\s*skip\s*\((?P<reason>[^)]+)\)\s*-->")
FENCE = re.compile(r"^```(?P<lang>[\w+-]*)\s*$")
RUNNERS = {"python": [sys.executable], "bash": ["bash", "-euo", "pipefail"]}
TIMEOUT_S = 60  # each block should take seconds; this only stops a hung one


@dataclass(frozen=True)
class Block:
    lang: str
    line: int  # 1-based line of the opening fence
    code: str
    skip_reason: str | None


def read_blocks(text: str) -> list[Block]:
    """The fenced blocks of ``text``, with the skip marker of the line before each."""
    lines = text.splitlines()
    blocks, at = [], 0
    while at < len(lines):
        fence = FENCE.match(lines[at])
        if fence is None:
            at += 1
            continue
        end = next((j for j in range(at + 1, len(lines)) if lines[j].startswith("```")), None)
        assert end is not None, f"README line {at + 1}: the block is never closed"
        marker = MARKER.search(lines[at - 1]) if at else None
        code = "\n".join(lines[at + 1 : end]) + "\n"
        blocks.append(Block(fence["lang"], at + 1, code, marker and marker["reason"]))
        at = end + 1
    return blocks


BLOCKS = read_blocks(README.read_text())
RUNNABLE = [block for block in BLOCKS if block.lang in RUNNERS]
PYTHON = [block for block in RUNNABLE if block.lang == "python" and not block.skip_reason]


def _env() -> dict[str, str]:
    path = os.environ.get("PYTHONPATH")
    commands = os.path.dirname(sys.executable)  # the venv's tierkit, next to its python
    return {
        **os.environ,
        "PYTHONPATH": str(ROOT) + (os.pathsep + path if path else ""),
        "PATH": commands + os.pathsep + os.environ.get("PATH", ""),
    }


@pytest.mark.parametrize("block", RUNNABLE, ids=[f"{b.lang}-line{b.line}" for b in RUNNABLE])
def test_block_runs_as_written(block: Block) -> None:
    if block.skip_reason:
        pytest.skip(f"README line {block.line}: {block.skip_reason}")
    with tempfile.TemporaryDirectory(prefix="tierkit-readme-") as scratch:
        script = Path(scratch) / ("snippet.py" if block.lang == "python" else "snippet.sh")
        script.write_text(block.code)
        work = Path(scratch) / "work"
        work.mkdir()
        done = subprocess.run(
            [*RUNNERS[block.lang], str(script)],
            cwd=work,
            env=_env(),
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
    assert done.returncode == 0, (
        f"README line {block.line} ({block.lang}) exited {done.returncode}:\n"
        f"{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    )


def test_every_marker_precedes_a_block() -> None:
    """A marker left behind when its block moved would silently skip nothing (or the wrong
    block): each one must sit on the line just before a fence."""
    lines = README.read_text().splitlines()
    for number, line in enumerate(lines, 1):
        if "readme-test" in line:
            assert MARKER.search(line), f"README line {number}: malformed marker {line!r}"
            following = lines[number] if number < len(lines) else ""
            assert FENCE.match(following), f"README line {number}: no block follows the marker"


@pytest.mark.parametrize("block", PYTHON, ids=[f"python-line{b.line}" for b in PYTHON])
def test_python_block_uses_what_it_defines(block: Block) -> None:
    """A snippet that defines ``main()`` and never calls it exits 0 having shown nothing."""
    tree = ast.parse(block.code)
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    defined = [n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    unused = [name for name in defined if name not in used]
    assert not unused, f"README line {block.line}: defines {unused} but never calls them"


def test_the_readme_has_python_to_run() -> None:
    assert len(PYTHON) >= 4
