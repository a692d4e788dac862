"""Cached builds of every system's data, and the fresh cold copy each measuring round opens.

A build lives in ``builds/<system>-<dataset>-<tag>/`` with a ``BUILT`` stamp holding its
seconds. The tag follows what the stored format depends on: the source of vectordb/ and tiers/
(and server/ for the service), or the peer's package version. A stale build of the same system
and dataset is removed when a new one is made. ``fresh_copy`` copies a build to a scratch folder
and drops every copied file from the page cache, so each round opens its files cold.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from benchmarks.common.paths import REPO_ROOT
from benchmarks.server._dataset import Data
from benchmarks.server._service import build_server_data, env

_CODE = {
    "http": ("vectordb", "tiers", "server"),
    "inprocess": ("vectordb", "tiers"),
    "index_bulk": ("vectordb", "tiers"),
}
_PACKAGES = {"milvus_lite": ("pymilvus", "milvus-lite"), "qdrant_local": ("qdrant-client",)}


def code_tag(system: str) -> str:
    digest = hashlib.sha256()
    for package in _CODE.get(system, ()):
        root = REPO_ROOT / package
        for source in sorted(root.rglob("*.py")):
            digest.update(str(source.relative_to(REPO_ROOT)).encode() + source.read_bytes())
    for name in _PACKAGES.get(system, ()):
        try:
            digest.update(f"{name}=={version(name)}".encode())
        except PackageNotFoundError as exc:
            raise RuntimeError(f"{name} is not installed") from exc
    return digest.hexdigest()[:10]


def cached_build(
    system: str, data: Data, manifest: Path, cache: Path, log_level: str | None, stale: bool
) -> tuple[Path, float | None, str | None]:
    """(folder, build seconds, note) of ``system``'s data for ``data``; built when missing.
    ``stale``: reuse a build made by other code (said in the note) rather than rebuild."""
    prefix = f"{system}-{data.name}-{len(data.base)}x{data.dim}-"
    where = cache / (prefix + code_tag(system))
    stamp = where / "BUILT"
    older = sorted(cache.glob(prefix + "*/BUILT"), key=lambda p: p.stat().st_mtime)
    if not stamp.exists() and stale and older:
        stamp, where = older[-1], older[-1].parent
        note = f"{system}: build reused from other code ({where.name}; --reuse-stale-builds)"
        print(note, file=sys.stderr, flush=True)
        return where, json.loads(stamp.read_text())["build_s"], note
    if stamp.exists():
        print(f"{system}: reusing {where}", file=sys.stderr, flush=True)
        return where, json.loads(stamp.read_text())["build_s"], None
    if cache.exists():
        for stale in cache.glob(prefix + "*"):
            shutil.rmtree(stale, ignore_errors=True)
    shutil.rmtree(where, ignore_errors=True)
    where.mkdir(parents=True)
    print(
        f"{system}: building {len(data.base):,} vectors into {where}", file=sys.stderr, flush=True
    )
    if system == "http":
        seconds = build_server_data(where / "data", data.base, log_level)
    else:
        cmd = [sys.executable, "-m", "benchmarks.server._worker", "--system", system]
        cmd += ["--manifest", str(manifest), "--dir", str(where), "--build"]
        done = subprocess.run(
            cmd,
            cwd=REPO_ROOT,
            env=env(),
            stdout=subprocess.PIPE,
            text=True,
            check=False,
            timeout=3600,
        )
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        reply = json.loads(lines[-1]) if lines else {"error": f"exit {done.returncode}"}
        if "error" in reply:
            shutil.rmtree(where, ignore_errors=True)
            raise RuntimeError(reply["error"])
        seconds = reply["build_s"]
    print(f"{system}: built in {seconds:.1f} s", file=sys.stderr, flush=True)
    stamp.write_text(json.dumps({"build_s": seconds}))
    return where, seconds, None


def fresh_copy(source: Path, target: Path) -> Path:
    """``source`` copied to ``target`` (replacing it), every file dropped from the page cache."""
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(source, target)
    for folder, _, files in os.walk(target):
        for name in files:
            drop_cached(Path(folder) / name)
    return target


def drop_cached(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)  # dirty pages are not dropped: write them back first
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
