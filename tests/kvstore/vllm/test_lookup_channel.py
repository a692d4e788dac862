"""kvstore.vllm.lookup_channel: the scheduler's lookups into a store the worker owns."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from kvstore import ModelFingerprint, SyncKVBlockStore, chain_hashes
from kvstore.vllm import lookup_channel
from kvstore.vllm.lookup_channel import LookupClient, LookupServer, channel_name

FINGERPRINT = ModelFingerprint(model="m", dtype="bfloat16", num_layers=1, block_tokens=4,
                               num_kv_heads=1, head_dim=8)  # fmt: skip


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SyncKVBlockStore]:
    with SyncKVBlockStore.open(tmp_path, FINGERPRINT, dram_bytes=1 << 20) as opened:
        yield opened


def _remote_client(
    name: bytes, monkeypatch: pytest.MonkeyPatch, connect_timeout_s: float = 2.0
) -> LookupClient:
    # the scheduler's process has no store of its own: hide this process's registry entry
    monkeypatch.setattr(lookup_channel, "_LOCAL", {})
    return LookupClient(name, connect_timeout_s=connect_timeout_s)


def test_a_client_gets_the_longest_cached_prefix_over_the_socket(
    store: SyncKVBlockStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hashes = chain_hashes(list(range(20)), 4)
    blocks = torch.zeros((3, *FINGERPRINT.block_shape), dtype=torch.bfloat16)
    store.store_blocks(hashes[:3], blocks)
    server = LookupServer(store, channel_name(str(tmp_path), FINGERPRINT))
    client = _remote_client(channel_name(str(tmp_path), FINGERPRINT), monkeypatch)
    assert client.lookup(hashes) == 3
    assert client.lookup(hashes[1:]) == 2
    assert client.lookup(hashes[3:]) == 0
    assert client.lookup([]) == 0
    server.close()
    started = time.monotonic()
    assert client.lookup(hashes) == 0  # the worker is gone: a miss, at once
    assert client.lookup(hashes) == 0
    assert time.monotonic() - started < 1.0
    client.close()


def test_in_one_process_the_client_calls_the_store_directly(
    store: SyncKVBlockStore, tmp_path: Path
) -> None:
    hashes = chain_hashes(list(range(8)), 4)
    store.store_blocks(hashes[:1], torch.zeros((1, *FINGERPRINT.block_shape), dtype=torch.bfloat16))
    name = channel_name(str(tmp_path), FINGERPRINT)
    server = LookupServer(store, name)
    assert lookup_channel._LOCAL[name] is store
    assert LookupClient(name).lookup(hashes) == 1
    server.close()
    assert name not in lookup_channel._LOCAL


def test_channels_differ_by_directory_and_model(tmp_path: Path) -> None:
    other = ModelFingerprint(model="n", dtype="bfloat16", num_layers=1, block_tokens=4,
                             num_kv_heads=1, head_dim=8)  # fmt: skip
    names = {channel_name(str(tmp_path / "a"), FINGERPRINT),
             channel_name(str(tmp_path / "b"), FINGERPRINT),
             channel_name(str(tmp_path / "a"), other)}  # fmt: skip
    assert len(names) == 3


def test_a_client_with_no_worker_gives_up_after_its_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = channel_name(str(tmp_path / "none"), FINGERPRINT)
    client = _remote_client(name, monkeypatch, connect_timeout_s=0.3)
    started = time.monotonic()
    assert client.lookup([b"x" * 32]) == 0
    assert client.lookup([b"x" * 32]) == 0  # gave up: no second wait
    assert time.monotonic() - started < 2.0
