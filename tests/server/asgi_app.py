"""An in-process service for tests: ``create_app`` under its lifespan, reached over httpx's ASGI
transport (no socket), with a known admin key.

The admin key is passed the way an operator passes it, through ``TIERKIT_ADMIN_KEY``, which is
set only while the app starts and runs and removed after, so tests do not leak it to each other.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx

from server import Settings, create_app

__all__ = ["asgi_service"]


@contextlib.asynccontextmanager
async def asgi_service(
    data: Path, admin_key: str, *, send_key: bool = True, **settings: Any
) -> AsyncIterator[tuple[httpx.AsyncClient, Any]]:
    """(client, app) for a service over ``data``; the client sends ``admin_key`` if ``send_key``."""
    app = create_app(Settings(data_dir=str(data), **settings))
    os.environ["TIERKIT_ADMIN_KEY"] = admin_key
    try:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            headers = {"api-key": admin_key} if send_key else {}
            async with httpx.AsyncClient(
                transport=transport, base_url="http://t", headers=headers
            ) as http:
                yield http, app
    finally:
        del os.environ["TIERKIT_ADMIN_KEY"]
