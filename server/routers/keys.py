"""Admin: create, list and revoke API keys. Every route needs the admin key (a tenant: 403).

A new key is in the creation answer only, once; listings show ids, tenants, quotas and whether
revoked, never a secret or a hash.

Thread-safety: handlers run on the event loop; blocking work goes to worker threads.
"""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request, Response

from server.deps import Admin
from server.envelope import OrjsonRoute, ok
from server.errors import ApiError
from server.keys import KeyStore
from server.models import CreateKeyBody
from server.responses import KeyCreated, KeyList, documented

__all__ = ["router"]

router = APIRouter(prefix="/admin/keys", tags=["admin"], route_class=OrjsonRoute)


def _keys(request: Request) -> KeyStore:
    keys: KeyStore = request.app.state.keys
    return keys


@router.post("", summary="Create a tenant key (shown once)", responses=documented(KeyCreated))
async def create_key(request: Request, body: CreateKeyBody, _: Admin) -> Response:
    store = _keys(request)
    try:  # the KDF takes ~50 ms: off the event loop
        key, record = await asyncio.to_thread(store.create, body.tenant, body.max_points, body.rps)
    except ValueError as exc:
        raise ApiError(400, str(exc)) from None
    return ok({"key": key, **record.public()}, request)


@router.get("", summary="List keys (no secrets)", responses=documented(KeyList))
async def list_keys(request: Request, _: Admin) -> Response:
    return ok({"keys": _keys(request).list()}, request)


@router.delete("/{key_id}", summary="Revoke a key", responses=documented(bool))
async def revoke_key(request: Request, key_id: str, _: Admin) -> Response:
    if not await asyncio.to_thread(_keys(request).revoke, key_id):
        raise ApiError(404, f"no key with id {key_id}")
    return ok(True, request)
