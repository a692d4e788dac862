"""Batches cross from worker to loader through a slab: pack_tree/unpack_tree against a copy."""

from __future__ import annotations

from collections import namedtuple

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dataload.workers.protocol import NoRoom, TensorRef, pack_tree, tree_bytes, unpack_tree

Pair = namedtuple("Pair", "image label")

DTYPES = [torch.uint8, torch.int64, torch.float32, torch.float16, torch.bfloat16, torch.bool]


@st.composite
def tensors(draw) -> torch.Tensor:
    dtype = draw(st.sampled_from(DTYPES))
    shape = tuple(draw(st.lists(st.integers(0, 5), max_size=3)))
    values = torch.arange(int(np.prod(shape, dtype=np.int64)), dtype=torch.float64) * 1.5
    tensor = (values % 200).to(dtype).reshape(shape)
    if draw(st.booleans()) and tensor.dim() == 2:
        tensor = tensor.t()  # not contiguous
    return tensor


leaves = st.one_of(
    tensors(),
    st.integers(-5, 5),
    st.text(max_size=4),
    st.builds(lambda n: np.arange(n, dtype=np.int32), st.integers(0, 6)),
)
trees = st.recursive(
    leaves,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.tuples(inner, inner),
        st.dictionaries(st.text(max_size=3), inner, max_size=3),
        st.builds(Pair, inner, inner),
    ),
    max_leaves=8,
)


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return a == b


@settings(max_examples=150, deadline=None)
@given(trees)
def test_a_packed_tree_comes_back_equal_and_in_the_slab(tree) -> None:
    out = np.zeros(tree_bytes(tree) + 64, np.uint8)
    spec = pack_tree(tree, out)
    back = unpack_tree(spec, out)
    assert same(tree, back)
    if isinstance(back, torch.Tensor) and back.numel():  # a view of the slab, not a copy
        assert back.untyped_storage().data_ptr() == out.__array_interface__["data"][0]


def test_a_tree_that_does_not_fit_says_how_much_it_needs() -> None:
    tree = (torch.zeros(100, dtype=torch.float32), [torch.ones(3, dtype=torch.int64)])
    with pytest.raises(NoRoom) as caught:
        pack_tree(tree, np.zeros(100, np.uint8))
    assert caught.value.needed_bytes == tree_bytes(tree) == 448 + 64
    spec = pack_tree(tree, np.zeros(1024, np.uint8))
    assert isinstance(spec[0], TensorRef) and spec[1][0].offset % 64 == 0
