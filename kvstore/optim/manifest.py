"""Manifest: the record that commits an OffloadedOptimizer step, and what it must match.

Each subgroup's object is stored under a key carrying the version (the step number) that wrote
it, ``optim/sg<i>/v<version>``; a step writes new keys and never overwrites the objects the
committed manifest names. The manifest (``optim/manifest``), written last, names for every
subgroup the version that is current and holds the per-parameter scalars (``step`` ...), so
reopening after a crash mid-step finds the previous step whole: the objects it names were
durable before it was written (NvmeTier puts are durable when they return). A named checkpoint
is a copy of a manifest under ``optim/ckpt/<name>``; garbage collection deletes only the
subgroup objects that no manifest names.

The signature (optimizer class, parameter shapes and dtypes, group sizes, subgroup cut, state
keys) must match exactly for a stored state to be used: a mismatch is refused with the first
difference named, never reinterpreted.

Thread-safety: plain values; owned by one OffloadedOptimizer.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kvstore.optim.layout import OffloadError

__all__ = [
    "MANIFEST_KEY",
    "Manifest",
    "checkpoint_key",
    "object_key",
    "parse_object_key",
    "referenced_keys",
]

FORMAT = "tierkit-offloaded-optimizer/1"
MANIFEST_KEY = "optim/manifest"
CHECKPOINT_PREFIX = "optim/ckpt/"
OBJECT_PREFIX = "optim/sg"
_OBJECT_KEY = re.compile(r"optim/sg(\d+)/v(\d+)")
_NAME = re.compile(r"[A-Za-z0-9._-]{1,200}")


def object_key(subgroup: int, version: int) -> str:
    return f"{OBJECT_PREFIX}{subgroup}/v{version}"


def parse_object_key(key: str) -> tuple[int, int] | None:
    match = _OBJECT_KEY.fullmatch(key)
    return None if match is None else (int(match[1]), int(match[2]))


def checkpoint_key(name: str) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise OffloadError(f"checkpoint names are 1-200 of [A-Za-z0-9._-], got {name!r}")
    return CHECKPOINT_PREFIX + name


@dataclass
class Manifest:
    """``versions[i]``: the current version of subgroup i; ``scalars[p]``: the JSON scalars of
    parameter p (present exactly when p has optimizer state); ``param_sums[i]``: with
    ``master="params"``, the fingerprint of subgroup i's parameters at this step
    (params_master.py), else None."""

    signature: dict[str, Any]
    step: int
    versions: list[int]
    scalars: dict[int, dict[str, Any]] = field(default_factory=dict)
    param_sums: list[int] | None = None

    def to_bytes(self) -> np.ndarray:
        body = {
            "format": FORMAT,
            "signature": self.signature,
            "step": self.step,
            "versions": self.versions,
            "scalars": {str(k): v for k, v in self.scalars.items()},
        }
        if self.param_sums is not None:
            body["param_sums"] = self.param_sums
        return np.frombuffer(json.dumps(body, sort_keys=True).encode(), dtype=np.uint8).copy()

    @classmethod
    def from_bytes(cls, data: Any, where: str) -> Manifest:
        try:
            body = json.loads(bytes(np.asarray(data, dtype=np.uint8)).decode())
            if body.get("format") != FORMAT:
                raise ValueError(f"format {body.get('format')!r}, expected {FORMAT!r}")
            sums = body.get("param_sums")
            return cls(
                body["signature"],
                int(body["step"]),
                [int(v) for v in body["versions"]],
                {int(k): v for k, v in body["scalars"].items()},
                None if sums is None else [int(v) for v in sums],
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise OffloadError(f"{where}: not an optimizer manifest ({exc})") from exc

    def check(self, signature: dict[str, Any], where: str) -> None:
        """Raise OffloadError naming the first way this stored state differs from
        ``signature`` (the parameters and optimizer it is being opened for)."""
        for key in sorted(set(signature) | set(self.signature)):
            stored, wanted = self.signature.get(key), signature.get(key)
            if stored != wanted:
                raise OffloadError(
                    f"{where} holds an optimizer state for other parameters or another "
                    f"optimizer: {key} is {_short(stored)} there, {_short(wanted)} here "
                    "(use another directory, or delete this one to start afresh)"
                )
        if len(self.versions) != signature["subgroups"]:
            raise OffloadError(
                f"{where}: {len(self.versions)} subgroup versions, expected "
                f"{signature['subgroups']}"
            )


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 120 else text[:117] + "..."


def referenced_keys(manifests: Iterable[Manifest]) -> set[str]:
    """The subgroup object keys some manifest names: the ones garbage collection keeps."""
    return {
        object_key(index, version)
        for manifest in manifests
        for index, version in enumerate(manifest.versions)
    }
