"""The README's service examples work exactly as written, against the real service.

tests/test_readme.py skips them (they need a running service); here the service is started as
the README says (``tierkit serve --sample``, on a free loopback port with a known admin key) and
every block whose skip marker names this file and needs the running service is run the way
tests/test_readme.py runs blocks, with ``TIERKIT_URL`` and ``TIERKIT_API_KEY`` set as the
README tells the reader to set them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.server.live_server import LiveServer, new_admin_key
from tests.test_readme import README, RUNNERS, Block, read_blocks

ROOT = Path(__file__).resolve().parents[2]
BLOCKS = [
    b
    for b in read_blocks(README.read_text())
    if b.skip_reason and "needs the running service" in b.skip_reason and b.lang in RUNNERS
]
# what each block must print (the README's comments promise these)
EXPECTED = {
    "bash": ['"status":"ok"', '"points_count":2000', '"count":100', '"tenant":"acme"'],
    "python": ["2000", "42 1.0 {'group': 'g10', 'n': 42}", "2001"],
}


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    data = tmp_path_factory.mktemp("readme") / "data"
    live = LiveServer(data, new_admin_key(), extra_args=["--sample"])
    live.start()
    try:
        yield live
    finally:
        live.stop()


def test_the_readme_has_the_service_examples() -> None:
    assert sorted(b.lang for b in BLOCKS) == ["bash", "python"]
    text = README.read_text()
    assert "bash scripts/serve.sh --sample" in text
    serve = (ROOT / "scripts" / "serve.sh").read_text()
    assert "_venv.sh" in serve and "exec tierkit serve --data .tierkit-data" in serve


@pytest.mark.parametrize("block", BLOCKS, ids=[f"{b.lang}-line{b.line}" for b in BLOCKS])
def test_service_example_runs_as_written(service: LiveServer, block: Block, tmp_path: Path) -> None:
    script = tmp_path / ("snippet.py" if block.lang == "python" else "snippet.sh")
    script.write_text(block.code)
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""),
        "TIERKIT_URL": service.url,
        "TIERKIT_API_KEY": service.admin_key,
    }
    done = subprocess.run(
        [*RUNNERS[block.lang], str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, f"{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    for expected in EXPECTED[block.lang]:
        assert expected in done.stdout, (expected, done.stdout[-3000:])
    assert "error" not in done.stdout.lower(), done.stdout[-3000:]
    assert "Warning" not in done.stderr, done.stderr[-3000:]
