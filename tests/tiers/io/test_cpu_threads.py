"""single_threaded_blas: numpy's BLAS on one thread while any holder is inside, the saved
setting back once the last one leaves, whatever order overlapping holders leave in."""

from __future__ import annotations

import pytest

from tiers.io.cpu_threads import _numpy_blas, single_threaded_blas


def _threads() -> list[int]:
    return [c.num_threads for c in _numpy_blas()]


def test_overlapping_holders_restore_the_setting_once_all_are_out() -> None:
    if not _numpy_blas():
        pytest.skip("numpy's BLAS is not one threadpoolctl can control here")
    controller = _numpy_blas()[0]
    original = controller.num_threads
    controller.set_num_threads(3)
    try:
        first, second = single_threaded_blas(), single_threaded_blas()
        first.__enter__()
        assert _threads() == [1] * len(_threads())
        second.__enter__()
        first.__exit__(None, None, None)  # the first out is not the last
        assert _threads() == [1] * len(_threads())
        second.__exit__(None, None, None)
        assert controller.num_threads == 3
        with pytest.raises(RuntimeError), single_threaded_blas():
            raise RuntimeError("an error inside still restores")
        assert controller.num_threads == 3
    finally:
        controller.set_num_threads(original)
