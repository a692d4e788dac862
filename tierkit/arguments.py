"""Argument types for the command line: a bad value becomes argparse's one-line error.

Each function takes the text as typed and returns the value, or raises ``ArgumentTypeError``
with what is wrong; argparse prefixes the option's name and exits with status 2.
"""

from __future__ import annotations

import math
import os
import tempfile
from argparse import ArgumentTypeError

__all__ = ["free_mib", "positive_float", "positive_int", "writable_directory"]


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value <= 0:
        raise ArgumentTypeError(f"must be a positive whole number, not {value}")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ArgumentTypeError(f"{text!r} is not a number") from None
    if not (math.isfinite(value) and value > 0):
        raise ArgumentTypeError(f"must be a positive, finite number, not {text}")
    return value


def _nearest_existing(path: str) -> str:
    while not os.path.exists(path):
        path = os.path.dirname(path)
    return path


def free_mib(directory: str) -> int:
    """MiB an unprivileged writer may still use on the filesystem that holds (or will hold)
    ``directory``."""
    stats = os.statvfs(_nearest_existing(os.path.abspath(os.path.expanduser(directory))))
    return stats.f_bavail * stats.f_frsize >> 20


def writable_directory(text: str) -> str:
    """A directory that exists or can be created, and where a file can be written. Probed by
    writing a temporary file in the nearest existing directory: permission bits do not tell
    root about read-only or special filesystems (``/proc``)."""
    nearest = _nearest_existing(os.path.abspath(os.path.expanduser(text)))
    if not os.path.isdir(nearest):
        raise ArgumentTypeError(f"{text}: {nearest} is not a directory")
    try:
        with tempfile.TemporaryFile(dir=nearest):
            pass
    except OSError as exc:
        raise ArgumentTypeError(f"{text}: cannot write in {nearest} ({exc.strerror})") from None
    return text
