"""Checks of single configuration values: type and range, every failure a ConfigError naming where.

A check is a callable ``check(value, where, error=ConfigError)`` that returns the value,
normalised (a size string becomes an int, a numpy integer an int), or raises ``error`` (a
ConfigError subclass such as vectordb's IndexConfigError) whose message starts with ``where``.
The rules:

* booleans are real booleans. TOML has them; a string such as "no" or "false" is refused, never
  interpreted, since any non-empty string is true to Python and would switch the feature on;
* integers are ints (numpy's too), never bools or floats; numbers are ints or floats, never bools
  or strings, and NaN is refused everywhere (infinity only where a range allows it);
* sizes are ints, or strings of a decimal number and a unit (``"4096"``, ``"64MiB"``,
  ``"1.5GiB"``, ``"2 GB"``) that come to a whole number of bytes; anything else is refused;
* ``optional(check)`` lets None through, for settings whose default is "decide automatically".

Concurrency: pure functions, thread-safe. Invariants: a check returns a value of its documented
type within its range, or raises; it never raises anything but ``error``.
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Callable, Iterable
from fractions import Fraction
from typing import Any

from tiers.io.errors import ConfigError

__all__ = [
    "Check",
    "boolean",
    "choice",
    "integer",
    "number",
    "optional",
    "parse_size",
    "refuse_unknown",
    "size",
    "text",
]

Check = Callable[..., Any]  # (value, where, error=ConfigError) -> the normalised value

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "tib": 1 << 40,
}
_UNIT_NAMES = "B, KB, MB, GB, TB, KiB, MiB, GiB, TiB (any case)"
_SIZE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)\s*")


def parse_size(value: Any, where: str, error: type[ConfigError] = ConfigError) -> int:
    """Bytes of a size: an int, or a string like ``"4096"``, ``"64MiB"`` or ``"1.5 GB"``."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        size_bytes = int(value)
    elif isinstance(value, str) and (match := _SIZE.fullmatch(value)):
        unit = _UNITS.get(match.group(2).lower())
        if unit is None:
            raise error(f"unknown unit {match.group(2)!r} in {value!r}; use {_UNIT_NAMES}", where)
        exact = Fraction(match.group(1)) * unit  # exact: "1.1GB" is 1100000000, not 1099999999
        if exact.denominator != 1:
            raise error(f"{value!r} is not a whole number of bytes", where)
        size_bytes = int(exact)
    else:
        raise error(f"expected a size like 4096 or '4GiB', got {value!r}", where)
    if size_bytes <= 0:
        raise error(f"a size must be positive, got {value!r}", where)
    return size_bytes


def size(minimum_bytes: int = 1, maximum_bytes: int | None = None) -> Check:
    """A size (see parse_size) in ``[minimum_bytes, maximum_bytes]``."""

    def check(value: Any, where: str, error: type[ConfigError] = ConfigError) -> int:
        size_bytes = parse_size(value, where, error)
        if size_bytes < minimum_bytes or (maximum_bytes is not None and size_bytes > maximum_bytes):
            top = "" if maximum_bytes is None else f" and at most {maximum_bytes}"
            raise error(f"must be at least {minimum_bytes}{top} bytes, got {value!r}", where)
        return size_bytes

    return check


def boolean(value: Any, where: str, error: type[ConfigError] = ConfigError) -> bool:
    if not isinstance(value, bool):
        raise error(f"expected a boolean, got {value!r}", where)
    return value


def text(value: Any, where: str, error: type[ConfigError] = ConfigError) -> str:
    """A non-empty string."""
    if not isinstance(value, str) or not value.strip():
        raise error(f"expected a non-empty string, got {value!r}", where)
    return value


def choice(options: Iterable[str]) -> Check:
    """One of ``options`` (strings), exactly."""
    allowed = tuple(options)

    def check(value: Any, where: str, error: type[ConfigError] = ConfigError) -> str:
        if not isinstance(value, str) or value not in allowed:
            raise error(f"unknown {value!r}; choose from {list(allowed)}", where)
        return value

    return check


def integer(minimum: int, maximum: int | None = None) -> Check:
    """An int (a numpy integer is converted) in ``[minimum, maximum]``."""

    def check(value: Any, where: str, error: type[ConfigError] = ConfigError) -> int:
        ok = isinstance(value, numbers.Integral) and not isinstance(value, bool)
        if not ok or value < minimum or (maximum is not None and value > maximum):
            span = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
            raise error(f"expected an integer {span}, got {value!r}", where)
        return int(value)

    return check


def number(minimum: float, maximum: float = math.inf, *, above_minimum: bool = False) -> Check:
    """A float (an int is converted) in ``[minimum, maximum]``, or ``(minimum, maximum]`` when
    ``above_minimum``; never NaN, and infinite only when ``maximum`` is."""

    def check(value: Any, where: str, error: type[ConfigError] = ConfigError) -> float:
        ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
        try:
            real = float(value) if ok else math.nan
        except OverflowError:  # an int beyond any float
            real = math.inf if value > 0 else -math.inf
        low_ok = real > minimum if above_minimum else real >= minimum
        if not (low_ok and real <= maximum):  # NaN fails every comparison
            low = f"{'(' if above_minimum else '['}{minimum:g}"
            raise error(f"expected a number in {low}, {maximum:g}], got {value!r}", where)
        return real

    return check


def optional(check: Check) -> Check:
    """``check``, or None (the setting's automatic default)."""

    def optional_check(value: Any, where: str, error: type[ConfigError] = ConfigError) -> Any:
        return None if value is None else check(value, where, error)

    return optional_check


def refuse_unknown(
    table: dict[str, Any], known: Iterable[str], where: str | None, what: str
) -> None:
    """A ConfigError listing the keys of ``table`` not in ``known``, and the known ones."""
    allowed = sorted(known)
    unknown = sorted(str(key) for key in table if key not in allowed)
    if unknown:
        raise ConfigError(f"unknown keys {unknown} for {what}; known: {allowed}", where)
