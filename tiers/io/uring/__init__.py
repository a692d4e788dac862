"""tiers.io.uring: io_uring from pure Python. ``abi`` holds the kernel ABI, ``ring`` one mapped
ring, ``ring_exit`` the wait for a closed ring's teardown, ``engine`` the UringEngine."""

from tiers.io.uring.engine import UringEngine

__all__ = ["UringEngine"]
