"""API keys: who a request is. ``tk_<key_id>_<secret>`` keys map to the admin or to a tenant.

    store, new_admin_key = KeyStore.open("data", admin_key=os.environ.get("TIERKIT_ADMIN_KEY"))
    principal = await store.authenticate(presented)   # UnauthorizedError / ForbiddenError
    key, record = store.create(tenant="acme", max_points=10_000, rps=50.0)

Only a salted scrypt hash (n=2**14, r=8, p=1: ~50 ms, 16 MiB) of each key is stored, in
``<data>/keys.json``, written atomically (temp file, fsync, rename, fsync of the directory).
Checks compare in constant time (``hmac.compare_digest``). A key verified once is remembered in
memory under the sha256 of the presented text, so a request does not pay the KDF each time; the
record is still looked up on every request, so a revoke takes effect at once (and drops the
entry). A key that matched no record is remembered as such, so repeating a wrong key costs no
KDF either (records are only added with fresh random secrets, so a rejected text stays wrong;
a new env admin key needs a restart anyway). The slow path runs in a worker thread: the event
loop never waits on the KDF.

Messages never contain a presented key, a secret or a hash.

Thread-safety: every method may be called from any thread; one lock guards the records, the
cache and the file.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import os
import re
import secrets
import threading
import time
from dataclasses import asdict, dataclass, replace

__all__ = ["ForbiddenError", "KeyRecord", "KeyStore", "Principal", "UnauthorizedError"]

_SCRYPT = {"n": 2**14, "r": 8, "p": 1, "dklen": 32}
_KEY = re.compile(r"^tk_([0-9a-f]{12})_[A-Za-z0-9_-]{16,}$")
_ENV_KEY_ID = "env-admin"  # the record of a $TIERKIT_ADMIN_KEY that is not of the tk_ form
_MIN_KEY_CHARS = 16
_MAX_CACHED = 100_000  # fingerprints remembered, each way
_TENANT = re.compile(r"^[A-Za-z0-9_.:@-]{1,128}$")


class UnauthorizedError(Exception):
    """No key, or a key that is not one of ours (HTTP 401)."""


class ForbiddenError(Exception):
    """A valid key that may not do this: revoked, or not the admin's (HTTP 403)."""


@dataclass(frozen=True)
class KeyRecord:
    """One stored key: never its secret, only ``salt`` and ``hash`` (hex)."""

    key_id: str
    role: str  # "admin" | "tenant"
    tenant: str | None
    max_points: int | None
    rps: float | None
    revoked: bool
    created_at: float  # Unix seconds
    salt: str
    hash: str

    def public(self) -> dict[str, object]:
        """What the admin may list: no salt, no hash."""
        return {
            "key_id": self.key_id,
            "role": self.role,
            "tenant": self.tenant,
            "max_points": self.max_points,
            "rps": self.rps,
            "revoked": self.revoked,
            "created_at": self.created_at,
        }


@dataclass(frozen=True)
class Principal:
    """Who is calling: ``tenant`` None is the admin (sees everything)."""

    key_id: str
    tenant: str | None
    max_points: int | None = None
    rps: float | None = None

    @property
    def is_admin(self) -> bool:
        return self.tenant is None


def _hash(key: str, salt: bytes) -> str:
    return hashlib.scrypt(key.encode(), salt=salt, **_SCRYPT).hex()


def _fingerprint(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def _new_key() -> tuple[str, str]:
    key_id = secrets.token_hex(6)
    return key_id, f"tk_{key_id}_{secrets.token_urlsafe(32)}"


class KeyStore:
    """The keys of one data directory; see the module docstring."""

    def __init__(self, path: str, records: dict[str, KeyRecord]) -> None:
        self._path = path
        self._records = records
        self._verified: dict[str, str] = {}  # sha256(presented key) -> key_id
        self._rejected: set[str] = set()  # sha256 of keys that matched no record
        self._lock = threading.Lock()
        self._dummy_salt = secrets.token_bytes(16)

    @classmethod
    def open(cls, data_dir: str, admin_key: str | None = None) -> tuple[KeyStore, str | None]:
        """The store under ``data_dir``, and a new admin key (to print once) when it had none
        and ``admin_key`` (``$TIERKIT_ADMIN_KEY``) is not given; that one is stored hashed."""
        os.makedirs(data_dir, exist_ok=True)
        path = os.path.join(data_dir, "keys.json")
        records: dict[str, KeyRecord] = {}
        if os.path.exists(path):
            with open(path, encoding="utf-8") as file:
                for item in json.load(file)["keys"]:
                    records[item["key_id"]] = KeyRecord(**item)
        store = cls(path, records)
        created = None
        if admin_key is not None:
            store._adopt_admin_key(admin_key)
        elif not any(r.role == "admin" and not r.revoked for r in records.values()):
            created, _ = store._add("admin", None, None, None)
        return store, created

    def _adopt_admin_key(self, key: str) -> None:
        if len(key) < _MIN_KEY_CHARS:
            raise ValueError(f"TIERKIT_ADMIN_KEY must have at least {_MIN_KEY_CHARS} characters")
        match = _KEY.match(key)
        key_id = match.group(1) if match else _ENV_KEY_ID
        old = self._records.get(key_id)
        usable = old is not None and not old.revoked and old.role == "admin"
        if old is not None and usable and self._matches(key, old):
            return
        self._add("admin", None, None, None, key=key, key_id=key_id)

    def _add(
        self,
        role: str,
        tenant: str | None,
        max_points: int | None,
        rps: float | None,
        key: str | None = None,
        key_id: str | None = None,
    ) -> tuple[str, KeyRecord]:
        if key is None or key_id is None:
            key_id, key = _new_key()
        salt = secrets.token_bytes(16)
        record = KeyRecord(
            key_id, role, tenant, max_points, rps, False, time.time(), salt.hex(), _hash(key, salt)
        )
        with self._lock:
            self._records[key_id] = record
            self._forget(key_id)
            self._save()
        return key, record

    def create(
        self, tenant: str, max_points: int | None = None, rps: float | None = None
    ) -> tuple[str, KeyRecord]:
        """A new tenant key (returned once, never stored) and its record. Blocks ~50 ms."""
        if not _TENANT.match(tenant):
            raise ValueError("tenant must be 1-128 characters of letters, digits and _.:@-")
        if max_points is not None and max_points < 0:
            raise ValueError("max_points must be >= 0")
        if rps is not None and not rps > 0:
            raise ValueError("rps must be > 0")
        return self._add("tenant", tenant, max_points, rps)

    def revoke(self, key_id: str) -> bool:
        """Revoke a key at once; False when there is no such key."""
        with self._lock:
            record = self._records.get(key_id)
            if record is None:
                return False
            self._records[key_id] = replace(record, revoked=True)
            self._forget(key_id)
            self._save()
            return True

    def list(self) -> list[dict[str, object]]:
        with self._lock:
            return [r.public() for r in self._records.values()]

    def _forget(self, key_id: str) -> None:
        for fingerprint in [f for f, k in self._verified.items() if k == key_id]:
            del self._verified[fingerprint]

    async def authenticate(self, presented: str | None) -> Principal:
        """The principal of ``presented``; UnauthorizedError when it is missing or not ours,
        ForbiddenError when it was revoked."""
        if not presented:
            raise UnauthorizedError("an API key is required (header api-key or Authorization)")
        fingerprint = _fingerprint(presented)
        with self._lock:
            if fingerprint in self._rejected:
                raise UnauthorizedError("invalid API key")
            key_id = self._verified.get(fingerprint)
            record = self._records.get(key_id) if key_id is not None else None
        if record is None:
            try:
                record = await asyncio.to_thread(self._verify, presented)
            except UnauthorizedError:
                with self._lock:  # the same wrong key again costs no KDF (bounded memory)
                    if len(self._rejected) >= _MAX_CACHED:
                        self._rejected.clear()
                    self._rejected.add(fingerprint)
                raise
            with self._lock:  # revoked too: its record says so on every request
                if len(self._verified) >= _MAX_CACHED:
                    self._verified.clear()
                self._verified[fingerprint] = record.key_id
        if record.revoked:
            raise ForbiddenError("this API key was revoked")
        return Principal(record.key_id, record.tenant, record.max_points, record.rps)

    def _verify(self, presented: str) -> KeyRecord:
        match = _KEY.match(presented)
        with self._lock:
            record = self._records.get(match.group(1) if match else _ENV_KEY_ID)
        if record is None:  # pay the KDF anyway: timing says nothing about which ids exist
            _hash(presented, self._dummy_salt)
            raise UnauthorizedError("invalid API key")
        if not self._matches(presented, record):
            raise UnauthorizedError("invalid API key")
        return record

    @staticmethod
    def _matches(key: str, record: KeyRecord) -> bool:
        return hmac.compare_digest(_hash(key, bytes.fromhex(record.salt)), record.hash)

    def _save(self) -> None:
        """Write every record atomically; the caller holds the lock."""
        document = {"version": 1, "keys": [asdict(r) for r in self._records.values()]}
        directory = os.path.dirname(os.path.abspath(self._path))
        temp = f"{self._path}.{os.getpid()}.tmp"
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as file:
            file.write(json.dumps(document, indent=1).encode())
            file.flush()
            os.fsync(file.fileno())
        os.replace(temp, self._path)
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
