"""The ``tierkit`` command as a user meets it, run as a real process.

A bad value is refused before anything runs: exit status 2 and one ``error:`` line naming the
option, no traceback. ``--help`` describes the tool with examples. A failure the library reports
(a typed tierkit error) is one ``tierkit: error:`` line and exit status 1. The demo, at its
smallest, prints each step as it starts and ends with its JSON summary.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _env() -> dict[str, str]:
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": str(ROOT) + (os.pathsep + path if path else "")}


def tierkit(*args: str, **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tierkit", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=_env(),
        **kwargs,  # type: ignore[call-overload]
    )


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "error:" in line]


BAD_VALUES = [
    (["--engine", "bogus"], "--engine"),
    (["--size-mib", "0"], "--size-mib"),
    (["--size-mib", "-3"], "--size-mib"),
    (["--size-mib", "lots"], "--size-mib"),
    (["--size-mib", str(1 << 40)], "--size-mib"),  # more than the disk holds
    (["--duration-s", "0"], "--duration-s"),
    (["--duration-s", "nan"], "--duration-s"),
    (["--duration-s", "inf"], "--duration-s"),
    (["--dir", "/proc/tierkit-demo"], "--dir"),
]


@pytest.mark.parametrize(
    ("args", "option"), BAD_VALUES, ids=[" ".join(args) for args, _ in BAD_VALUES]
)
def test_bad_value_is_one_line_and_exit_2(args: list[str], option: str) -> None:
    done = tierkit("demo", *args)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    errors = _error_lines(done.stderr)
    assert len(errors) == 1, done.stderr
    assert errors[0].startswith("tierkit demo: error: argument") and option in errors[0]
    assert done.stdout == ""


def test_dir_below_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "plain").write_text("not a directory")
    done = tierkit("demo", "--dir", str(tmp_path / "plain" / "demo"))
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert len(_error_lines(done.stderr)) == 1, done.stderr


def test_help_describes_the_tool() -> None:
    done = tierkit("--help")
    assert done.returncode == 0
    text = done.stdout
    assert "I/O core" in text and "tiered store" in text
    assert "demo" in text and "engines" in text
    assert "examples:" in text and "tierkit demo --size-mib" in text
    assert "issue" not in text.lower() and "``" not in text


def test_demo_help_lists_the_choices() -> None:
    done = tierkit("demo", "--help")
    assert done.returncode == 0
    assert "{auto,uring,thread}" in done.stdout and "--size-mib" in done.stdout


def test_library_error_is_one_line(tmp_path: Path) -> None:
    """A write past the file-size limit fails in the I/O core with a typed StorageError
    (EFBIG): the command reports it in one line instead of a traceback."""

    def limit_file_size() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of being killed
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 19, 1 << 19))

    done = tierkit("demo", "--engine", "thread", "--dir", str(tmp_path), preexec_fn=limit_file_size)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    errors = _error_lines(done.stderr)
    assert len(errors) == 1 and errors[0].startswith("tierkit: error:"), done.stderr
    assert "too large" in errors[0]
    assert os.listdir(tmp_path) == []  # the demo's scratch is gone


def test_demo_reports_as_it_goes(tmp_path: Path) -> None:
    """The smallest demo: the first line comes while it still runs (not buffered to the end),
    numba's kernels are readied before anything is timed, and the JSON summary is last."""
    command = [sys.executable, "-m", "tierkit", "demo", "--size-mib", "1", "--duration-s", "0.2"]
    command += ["--dir", str(tmp_path / "demo")]
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env()
    ) as process:
        assert process.stdout is not None
        first = process.stdout.readline()
        running_at_first_line = process.poll() is None
        rest, errors = process.communicate(timeout=120)
    assert process.returncode == 0, errors
    assert first.strip() and running_at_first_line
    lines = [first.rstrip("\n"), *rest.splitlines()]
    summary = json.loads(lines[-1])
    assert summary["vectordb_qps"] > 0 and summary["read_iops_4k_qd32"] > 0
    body = "\n".join(lines[:-1])
    assert "numba" in body and "{'" not in body  # kernels announced; tables, not dicts
    assert not (tmp_path / "demo").exists()
