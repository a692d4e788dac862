"""NUMA discovery, binding with mbind and the move_pages placement check, on this machine."""

from __future__ import annotations

import errno
import mmap
from pathlib import Path

import numpy as np
import pytest

from tiers.io.buffers import PAGE_SIZE_BYTES
from tiers.io.errors import InvalidArgumentError, StorageError
from tiers.memory import numa
from tiers.memory.numa import NumaNode, bind_to_node, cpuless_nodes, numa_nodes, pages_on_node

pytestmark = pytest.mark.skipif(
    not Path(numa.NODE_ROOT, "node0").is_dir(), reason="no NUMA sysfs (not Linux)"
)


def fresh_mapping(size_bytes: int) -> tuple[mmap.mmap, np.ndarray, int]:
    region = mmap.mmap(-1, size_bytes)
    array = np.frombuffer(region, dtype=np.uint8)
    return region, array, array.__array_interface__["data"][0]


def test_parse_cpulist() -> None:
    assert numa.parse_cpulist("0-3,8,10-11\n") == (0, 1, 2, 3, 8, 10, 11)
    assert numa.parse_cpulist("\n") == ()


def test_this_machine_has_node0_with_cpus() -> None:
    nodes = {n.node: n for n in numa_nodes()}
    assert 0 in nodes and nodes[0].cpus and nodes[0].mem_total_bytes > 0
    assert not nodes[0].cpuless
    assert 0 not in cpuless_nodes()


def test_cpuless_nodes_from_a_sysfs_tree(tmp_path: Path) -> None:
    def node(n: int, cpulist: str, mem_kb: int) -> None:
        path = tmp_path / f"node{n}"
        path.mkdir()
        (path / "cpulist").write_text(cpulist + "\n")
        (path / "meminfo").write_text(
            f"Node {n} MemTotal:       {mem_kb} kB\nNode {n} MemFree: 1 kB\n"
        )

    node(0, "0-7", 1 << 20)
    node(2, "", 64 << 20)  # CXL memory: memory, no CPUs
    node(3, "", 0)  # neither: not a memory tier
    (tmp_path / "possible").write_text("0-3\n")
    assert numa_nodes(str(tmp_path)) == [
        NumaNode(0, tuple(range(8)), 1 << 30),
        NumaNode(2, (), 64 << 30),
        NumaNode(3, (), 0),
    ]
    assert cpuless_nodes(str(tmp_path)) == [2]


def test_bind_to_node0_then_touch_places_every_page_there() -> None:
    size = 8 << 20
    region, array, address = fresh_mapping(size)
    pages = size // PAGE_SIZE_BYTES
    assert pages_on_node(address, size) == {-errno.ENOENT: pages}  # not touched yet
    bind_to_node(address, size, 0)
    array[::PAGE_SIZE_BYTES] = 1
    assert pages_on_node(address, size) == {0: pages}
    assert pages_on_node(address, size, sample_pages=16) == {0: 16}
    del array
    region.close()


def test_binding_to_a_missing_node_raises_typed_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    region, array, address = fresh_mapping(1 << 20)
    missing = max(n.node for n in numa_nodes()) + 1
    with pytest.raises(InvalidArgumentError, match="not online"):
        bind_to_node(address, 1 << 20, missing)
    with pytest.raises(InvalidArgumentError):
        bind_to_node(address + 1, 4096, 0)  # not page-aligned
    # Past the online check, the kernel's own refusal keeps its errno.
    fake = [*numa_nodes(), NumaNode(missing, (), 1 << 30)]
    monkeypatch.setattr(numa, "numa_nodes", lambda root=numa.NODE_ROOT: fake)
    with pytest.raises(StorageError) as caught:
        bind_to_node(address, 1 << 20, missing)
    assert caught.value.errno == errno.EINVAL
    del array
    region.close()
