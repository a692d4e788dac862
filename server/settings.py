"""The service's settings: one frozen dataclass, read from (highest first) command-line flags,
``TIERKIT_*`` environment variables, a TOML file, then the defaults here.

    settings = load_settings(overrides={"data_dir": "data"}, config_file="tierkit.toml")

The TOML file holds the field names at top level or under ``[server]``: ``data_dir``, ``host``,
``port``, ``max_body_bytes``, ``request_timeout_s``, ``graceful_timeout_s``, ``log_level``,
``sample``, ``memory_budget_bytes``, ``heap_trim_every_s``. An environment variable is the
field name upper-cased with the ``TIERKIT_`` prefix (``TIERKIT_PORT=7000``).
``TIERKIT_ADMIN_KEY`` is read by the key store, not here: a key never sits in a settings object
that may be logged.

Thread-safety: values are frozen; ``load_settings`` only reads the environment and one file.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["Settings", "SettingsError", "load_settings"]

_MIB = 1 << 20
_LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


class SettingsError(ValueError):
    """A setting that cannot work; the message names it and the value's source."""


@dataclass(frozen=True)
class Settings:
    """Everything the service is configured with (never a key)."""

    data_dir: str = ".tierkit-data"
    host: str = "127.0.0.1"
    port: int = 6333
    max_body_bytes: int = 32 * _MIB  # an upsert of ~20k 384-d float vectors as JSON
    request_timeout_s: float = 30.0
    graceful_timeout_s: float = 10.0  # uvicorn drains in-flight requests this long on shutdown
    log_level: str = "info"
    sample: bool = False  # create the "sample" collection on start if it is missing
    memory_budget_bytes: int | None = None  # the catalog's cache budget (None: its default)
    heap_trim_every_s: float = 10.0  # freed C heap pages back to the OS this often (0: never)

    def __post_init__(self) -> None:
        if not self.data_dir:
            raise SettingsError("data_dir must not be empty")
        if not 0 <= self.port <= 65535:
            raise SettingsError(f"port must be in 0..65535, got {self.port}")
        if self.max_body_bytes < 1024:
            raise SettingsError(f"max_body_bytes must be >= 1024, got {self.max_body_bytes}")
        if not self.request_timeout_s > 0:
            raise SettingsError(f"request_timeout_s must be > 0, got {self.request_timeout_s}")
        if self.graceful_timeout_s < 0:
            raise SettingsError(f"graceful_timeout_s must be >= 0, got {self.graceful_timeout_s}")
        if self.heap_trim_every_s < 0:
            raise SettingsError(f"heap_trim_every_s must be >= 0, got {self.heap_trim_every_s}")
        if self.log_level not in _LOG_LEVELS:
            raise SettingsError(f"log_level must be one of {_LOG_LEVELS}, got {self.log_level!r}")


_FIELDS = {f.name: f for f in dataclasses.fields(Settings)}


def _convert(name: str, value: Any, source: str) -> Any:
    """``value`` (text from the environment, or a TOML value) as the field's type."""
    kind = str(_FIELDS[name].type)
    try:
        if kind == "bool":
            if isinstance(value, str):
                if value.lower() not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
                    raise ValueError(value)
                return value.lower() in ("1", "true", "yes", "on")
            return bool(value)
        if kind == "int" or kind == "int | None":
            if value is None or (isinstance(value, str) and value == ""):
                if kind == "int":
                    raise ValueError(value)
                return None
            if isinstance(value, float) and not value.is_integer():
                raise ValueError(value)
            return int(value)
        if kind == "float":
            return float(value)
        return str(value)
    except (TypeError, ValueError):
        raise SettingsError(f"{name} from {source}: cannot read {value!r} as {kind}") from None


def _from_toml(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as file:
            document = tomllib.load(file)
    except OSError as exc:
        raise SettingsError(f"config file {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise SettingsError(f"config file {path}: {exc}") from None
    table = document.get("server", document)
    unknown = sorted(set(table) - set(_FIELDS) - {"server"})
    if unknown:
        raise SettingsError(f"config file {path}: unknown settings {unknown}")
    return {k: _convert(k, v, path) for k, v in table.items() if k in _FIELDS}


def _from_env(environ: Mapping[str, str]) -> dict[str, Any]:
    values = {}
    for name in _FIELDS:
        text = environ.get("TIERKIT_" + name.upper())
        if text is not None:
            values[name] = _convert(name, text, "TIERKIT_" + name.upper())
    return values


def load_settings(
    overrides: Mapping[str, Any] | None = None,
    config_file: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> Settings:
    """Settings from ``overrides`` (flags given; None values are ignored) > the environment >
    ``config_file`` (or ``$TIERKIT_CONFIG``) > the defaults."""
    environ = os.environ if environ is None else environ
    config_file = config_file or environ.get("TIERKIT_CONFIG") or None
    values: dict[str, Any] = _from_toml(config_file) if config_file else {}
    values.update(_from_env(environ))
    values.update({k: v for k, v in (overrides or {}).items() if v is not None})
    unknown = sorted(set(values) - set(_FIELDS))
    if unknown:
        raise SettingsError(f"unknown settings {unknown}")
    return Settings(**values)
