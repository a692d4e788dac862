"""The error tree: typed, errno-preserving, catchable as the builtin they refine."""

from __future__ import annotations

import errno
import pickle

import pytest

from tiers.io.errors import (
    AlignmentError,
    FileMissingError,
    InvalidArgumentError,
    NoSpaceError,
    PermissionDeniedError,
    StorageError,
    TierkitError,
    error_from_errno,
    map_os_errors,
)


@pytest.mark.parametrize(
    ("err", "cls"),
    [
        (errno.ENOSPC, NoSpaceError),
        (errno.EDQUOT, NoSpaceError),
        (errno.ENOENT, FileMissingError),
        (errno.EACCES, PermissionDeniedError),
        (errno.EROFS, PermissionDeniedError),
        (errno.EIO, StorageError),
    ],
)
def test_errno_maps_to_a_typed_error(err: int, cls: type[StorageError]) -> None:
    error = error_from_errno(err, "/data/x", 4096)
    assert type(error) is cls and isinstance(error, OSError) and isinstance(error, TierkitError)
    assert error.errno == err and error.filename == "/data/x" and error.offset_bytes == 4096
    assert "4096" in str(error) and errno.errorcode[err] in str(error)


def test_map_os_errors_translates_once_and_keeps_the_cause() -> None:
    with pytest.raises(FileMissingError) as info, map_os_errors("/nowhere"):
        open("/nowhere/at/all")  # noqa: SIM115
    assert isinstance(info.value.__cause__, FileNotFoundError)
    with pytest.raises(AlignmentError), map_os_errors("/x"):
        raise AlignmentError("already ours: passes through untouched")


def test_value_errors_are_catchable_as_value_error() -> None:
    assert issubclass(AlignmentError, InvalidArgumentError)
    assert issubclass(InvalidArgumentError, ValueError)


def test_errors_survive_pickling_with_their_type_and_offset() -> None:
    error = pickle.loads(pickle.dumps(error_from_errno(errno.ENOSPC, "/d", 12)))
    assert type(error) is NoSpaceError and error.offset_bytes == 12 and error.errno == errno.ENOSPC
