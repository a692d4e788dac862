"""The ``serve`` command's flags, shared by ``tierkit serve`` and ``python -m server``.

    tierkit serve --data DIR [--host 127.0.0.1] [--port 6333] [--config FILE] [--sample]

Flags win over ``TIERKIT_*`` environment variables, which win over the TOML file. A setting
that cannot work is one ``error:`` line and exit status 2, before anything starts.
"""

from __future__ import annotations

import argparse

__all__ = ["SERVE_DESCRIPTION", "add_serve_arguments", "main", "run_serve"]

SERVE_DESCRIPTION = (
    "Run the Qdrant-compatible REST vector search service on one data directory. A first start "
    "prints the admin key once (stdout); $TIERKIT_ADMIN_KEY sets it instead. Settings come from "
    "these flags, then TIERKIT_* environment variables, then --config FILE (TOML)."
)


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", dest="data_dir", metavar="DIR", help="the data directory")
    parser.add_argument("--host", help="the address to listen on (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, help="the port (default: 6333; 0: any free one)")
    parser.add_argument("--config", metavar="FILE", help="a TOML file of settings")
    parser.add_argument(
        "--sample",
        action="store_const",
        const=True,
        default=None,
        help="create the 2,000-point 'sample' collection if it is missing",
    )
    parser.add_argument("--max-body-bytes", type=int, metavar="BYTES", help="request body limit")
    parser.add_argument(
        "--request-timeout-s", type=float, metavar="SECONDS", help="per-request time limit"
    )
    parser.add_argument(
        "--log-level", choices=("debug", "info", "warning", "error", "critical"), default=None
    )


def run_serve(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from server.settings import SettingsError, load_settings

    names = ("data_dir", "host", "port", "sample", "max_body_bytes", "request_timeout_s")
    overrides = {name: getattr(args, name) for name in (*names, "log_level")}
    try:
        settings = load_settings(overrides, config_file=args.config)
    except SettingsError as exc:
        parser.error(str(exc))
    from server.run import serve

    serve(settings)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m server", description=SERVE_DESCRIPTION)
    add_serve_arguments(parser)
    return run_serve(parser.parse_args(argv), parser)
