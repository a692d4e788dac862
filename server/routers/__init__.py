"""One router per resource: collections, points, keys (admin) and ops (health, metrics)."""

from server.routers import collections, keys, ops, points

__all__ = ["collections", "keys", "ops", "points"]
