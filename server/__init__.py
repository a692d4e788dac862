"""server: the Qdrant-compatible REST vector search service (FastAPI, served by uvicorn).

    from server import Settings, create_app, serve
    serve(Settings(data_dir="data", port=6333))       # or: tierkit serve --data data

Layout: ``app`` (create_app and its lifespan), ``routers/`` (collections, points, keys, ops),
``deps`` (authentication, rate limits, the catalog), ``models`` (request bodies), ``shapes``
(JSON <-> collection values), ``errors`` (every error to one HTTP answer), ``keys`` (hashed API
keys), ``ratelimit``, ``limits`` (body size, timeouts), ``observability`` and ``metrics``,
``settings``, ``sample`` and ``run``.
"""

from server.app import create_app
from server.run import serve
from server.settings import Settings, SettingsError, load_settings

__all__ = ["Settings", "SettingsError", "create_app", "load_settings", "serve"]
