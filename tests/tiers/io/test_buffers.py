"""as_buffer and aligned_empty: every buffer kind reduces to the same address, without copies."""

from __future__ import annotations

import mmap

import numpy as np
import pytest

from tiers.io.buffers import aligned_empty, array_address, as_buffer
from tiers.io.errors import InvalidArgumentError


@pytest.mark.parametrize("alignment", [512, 4096, 1 << 16])
def test_aligned_empty(alignment: int) -> None:
    array = aligned_empty(3 * alignment, alignment)
    assert array.__array_interface__["data"][0] % alignment == 0
    assert array.nbytes == 3 * alignment and array.flags.c_contiguous


def test_aligned_empty_rejects_bad_alignment() -> None:
    with pytest.raises(InvalidArgumentError):
        aligned_empty(4096, 3000)
    with pytest.raises(InvalidArgumentError):
        aligned_empty(10, 4096, np.float32)


def test_views_share_memory_with_the_original() -> None:
    array = np.arange(16, dtype=np.uint8)
    ref = as_buffer(array)
    ref.memoryview()[3] = 200
    assert array[3] == 200 and ref.size_bytes == 16 and ref.writable
    data = bytearray(b"abcdef")
    as_buffer(data).memoryview(2, 2)[:] = b"XY"
    assert data == bytearray(b"abXYef")
    mapped = mmap.mmap(-1, 4096)
    assert as_buffer(mapped).size_bytes == 4096


def test_torch_cpu_tensor_of_any_dtype() -> None:
    torch = pytest.importorskip("torch")
    tensor = torch.zeros(8, dtype=torch.bfloat16)
    ref = as_buffer(tensor)
    assert ref.address == tensor.data_ptr() and ref.size_bytes == 16
    with pytest.raises(InvalidArgumentError, match="contiguous"):
        as_buffer(torch.zeros(4, 4)[:, 1])


def test_read_only_and_non_buffers() -> None:
    assert not as_buffer(b"fixed").writable
    frozen = np.zeros(4)
    frozen.flags.writeable = False
    assert not as_buffer(frozen).writable
    assert as_buffer(frozen).memoryview().readonly is not False
    with pytest.raises(InvalidArgumentError):
        as_buffer(object())
    with pytest.raises(InvalidArgumentError):
        as_buffer(np.zeros((4, 4))[:, 0])


def _interface_address(array: np.ndarray) -> int:
    return int(array.__array_interface__["data"][0])


def test_array_address_is_right_for_views_and_for_arrays_that_move() -> None:
    """Views' addresses are remembered by id; a new view that reuses a dead view's id, and an
    array whose own memory moved (``resize``), must still get their true address."""
    base = np.zeros(1 << 16, np.uint8)
    for start in range(0, 1 << 16, 4096):  # each view dies at once: ids get reused
        view = base[start : start + 4096]
        assert array_address(view) == _interface_address(view)
        assert as_buffer(view).address == _interface_address(view)
        frozen = base[start : start + 8]
        frozen.flags.writeable = False
        assert not as_buffer(frozen).writable  # writability is read per call, never remembered
    owner = np.zeros(4096, np.uint8)
    assert array_address(owner) == _interface_address(owner)
    owner.resize(1 << 22, refcheck=False)  # realloc: the memory may move
    assert array_address(owner) == _interface_address(owner)
