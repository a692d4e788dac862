"""The io_uring kernel ABI, in one place: syscalls through ctypes, structs, numpy dtypes, constants.

Byte layouts follow ``include/uapi/linux/io_uring.h``:

  struct io_uring_sqe (64 bytes)            struct io_uring_cqe (16 bytes)
   0 u8  opcode     28 u32 rw_flags/fsync     0 u64 user_data
   1 u8  flags      32 u64 user_data          8 s32 res   (bytes, or -errno)
   2 u16 ioprio     40 u16 buf_index         12 u32 flags
   4 s32 fd         42 u16 personality
   8 u64 off        44 s32 splice_fd_in
  16 u64 addr       48 u64 addr3
  24 u32 len        56 u64 __pad2

Syscall numbers 425/426/427 are the same on every Linux architecture (the unified table).
Nothing here allocates rings; see :mod:`tiers.io.uring.ring`.
"""

from __future__ import annotations

import ctypes
import os

import numpy as np

SYS_IO_URING_SETUP = 425
SYS_IO_URING_ENTER = 426
SYS_IO_URING_REGISTER = 427

# io_uring_setup flags
SETUP_CQSIZE = 1 << 3
SETUP_CLAMP = 1 << 4
SETUP_SUBMIT_ALL = 1 << 7
SETUP_COOP_TASKRUN = 1 << 8
SETUP_SINGLE_ISSUER = 1 << 12
SETUP_DEFER_TASKRUN = 1 << 13

FEAT_SINGLE_MMAP = 1 << 0
FEAT_NODROP = 1 << 1

OFF_SQ_RING = 0
OFF_CQ_RING = 0x8000000
OFF_SQES = 0x10000000

ENTER_GETEVENTS = 1 << 0

# opcodes
OP_FSYNC = 3
OP_READ_FIXED = 4
OP_WRITE_FIXED = 5
OP_READ = 22
OP_WRITE = 23
FSYNC_DATASYNC = 1

SQE_FIXED_FILE = 1 << 0

# io_uring_register opcodes
REGISTER_BUFFERS = 0
UNREGISTER_BUFFERS = 1
REGISTER_FILES = 2
UNREGISTER_FILES = 3
REGISTER_EVENTFD = 4
UNREGISTER_EVENTFD = 5
REGISTER_FILES_UPDATE = 6

SQE_DTYPE = np.dtype(
    {
        "names": [
            "opcode",
            "flags",
            "ioprio",
            "fd",
            "off",
            "addr",
            "len",
            "rw_flags",
            "user_data",
            "buf_index",
            "personality",
            "splice_fd_in",
            "addr3",
            "pad2",
        ],
        "formats": [
            "u1",
            "u1",
            "<u2",
            "<i4",
            "<u8",
            "<u8",
            "<u4",
            "<u4",
            "<u8",
            "<u2",
            "<u2",
            "<i4",
            "<u8",
            "<u8",
        ],
        "offsets": [0, 1, 2, 4, 8, 16, 24, 28, 32, 40, 42, 44, 48, 56],
        "itemsize": 64,
    }
)
CQE_DTYPE = np.dtype(
    {
        "names": ["user_data", "res", "flags"],
        "formats": ["<u8", "<i4", "<u4"],
        "offsets": [0, 8, 12],
        "itemsize": 16,
    }
)


class SqringOffsets(ctypes.Structure):
    _fields_ = [
        ("head", ctypes.c_uint32),
        ("tail", ctypes.c_uint32),
        ("ring_mask", ctypes.c_uint32),
        ("ring_entries", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("dropped", ctypes.c_uint32),
        ("array", ctypes.c_uint32),
        ("resv1", ctypes.c_uint32),
        ("user_addr", ctypes.c_uint64),
    ]


class CqringOffsets(ctypes.Structure):
    _fields_ = [
        ("head", ctypes.c_uint32),
        ("tail", ctypes.c_uint32),
        ("ring_mask", ctypes.c_uint32),
        ("ring_entries", ctypes.c_uint32),
        ("overflow", ctypes.c_uint32),
        ("cqes", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("resv1", ctypes.c_uint32),
        ("user_addr", ctypes.c_uint64),
    ]


class Params(ctypes.Structure):
    _fields_ = [
        ("sq_entries", ctypes.c_uint32),
        ("cq_entries", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("sq_thread_cpu", ctypes.c_uint32),
        ("sq_thread_idle", ctypes.c_uint32),
        ("features", ctypes.c_uint32),
        ("wq_fd", ctypes.c_uint32),
        ("resv", ctypes.c_uint32 * 3),
        ("sq_off", SqringOffsets),
        ("cq_off", CqringOffsets),
    ]


class FilesUpdate(ctypes.Structure):
    _fields_ = [("offset", ctypes.c_uint32), ("resv", ctypes.c_uint32), ("fds", ctypes.c_uint64)]


class Iovec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


assert ctypes.sizeof(Params) == 120 and ctypes.sizeof(FilesUpdate) == 16

_libc = ctypes.CDLL(None, use_errno=True)  # CDLL releases the GIL around each call
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long
# A second handle with fixed argument types for the hot call: no per-call ctypes boxing.
# (syscall(2) is variadic, but on x86-64 and arm64 Linux integer varargs travel in the same
# registers as fixed arguments, and glibc's syscall reads no vector registers.)
_enter_syscall = _libc["syscall"]
_enter_syscall.restype = ctypes.c_long
_enter_syscall.argtypes = [ctypes.c_long] * 7


def _check(result: int) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return result


def io_uring_setup(entries: int, params_address: int) -> int:
    return _check(
        _syscall(
            ctypes.c_long(SYS_IO_URING_SETUP),
            ctypes.c_long(entries),
            ctypes.c_void_p(params_address),
        )
    )


def io_uring_enter(ring_fd: int, to_submit: int, min_complete: int, flags: int) -> int:
    """Returns the number of SQEs consumed. Raises OSError (EINTR, EAGAIN, EBUSY, ...)."""
    result = _enter_syscall(SYS_IO_URING_ENTER, ring_fd, to_submit, min_complete, flags, 0, 0)
    return result if result >= 0 else _check(result)


def io_uring_register(ring_fd: int, opcode: int, arg_address: int, nr_args: int) -> int:
    return _check(
        _syscall(
            ctypes.c_long(SYS_IO_URING_REGISTER),
            ctypes.c_long(ring_fd),
            ctypes.c_long(opcode),
            ctypes.c_void_p(arg_address),
            ctypes.c_long(nr_args),
        )
    )
