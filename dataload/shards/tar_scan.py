"""Scanning a tar shard's headers: where every regular member's data lies, without reading it.

A tar file is a sequence of 512-byte headers, each followed by its member's data padded to a
multiple of 512 bytes, and ends with two zero blocks. :func:`scan_tar` walks the headers of an
uncompressed tar (ustar, GNU and PAX variants, as Python's ``tarfile`` and GNU tar write them)
and returns ``(name, data_offset, size)`` of each regular member in archive order:

* GNU long names (type ``L``) and PAX extended headers (type ``x``: ``path``, ``size``) apply to
  the member that follows; ustar's ``prefix`` field is joined to ``name``; PAX global headers
  (``g``) and GNU long link names (``K``) are read past.
* Directories, links, devices, FIFOs and GNU sparse members are skipped (WebDataset reads only
  regular files); their data blocks, if any, are stepped over.
* Anything that is not a well-formed tar -- a bad header checksum, a member whose data runs past
  the end of the file, a partial header, a missing end-of-archive marker (a file cut at a block
  boundary), a compressed file -- raises :class:`~dataload.errors.SourceFormatError` naming the
  shard and the byte offset: an index is never built from a damaged shard.

Concurrency: pure functions over a read-only mapping of the file; any thread may call them.
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass

from dataload.errors import SourceFormatError
from tiers.io import map_os_errors

__all__ = ["BLOCK_BYTES", "TarMember", "scan_tar"]

BLOCK_BYTES = 512
_REGULAR = (b"0", b"\0", b"7")  # regular file, old-style regular file, contiguous file
_ZERO_BLOCK = bytes(BLOCK_BYTES)
_COMPRESSED_MAGIC = {
    b"\x1f\x8b": "gzip",
    b"BZ": "bzip2",
    b"\xfd7zXZ": "xz",
    b"\x28\xb5\x2f\xfd": "zstd",
}


@dataclass(frozen=True)
class TarMember:
    """One regular member: its full name and where its data is in the file."""

    name: str
    data_offset: int
    size_bytes: int


def scan_tar(path: str) -> list[TarMember]:
    """The regular members of the tar at ``path``, in archive order (see the module doc)."""
    with map_os_errors(path), open(path, "rb") as file:
        size = os.fstat(file.fileno()).st_size
        if size == 0:
            raise SourceFormatError(path, "empty file: not a tar archive")
        with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as view:
            return _scan(path, view, size)


def _scan(path: str, data: mmap.mmap, size: int) -> list[TarMember]:
    for magic, compression in _COMPRESSED_MAGIC.items():
        if bytes(data[: len(magic)]) == magic:
            raise SourceFormatError(
                path, f"{compression}-compressed; only uncompressed tar is read"
            )
    members: list[TarMember] = []
    offset = 0
    long_name: str | None = None
    pax: dict[str, str] = {}
    try:
        while True:
            if offset + BLOCK_BYTES > size:
                what = "partial header" if offset < size else "no end-of-archive marker"
                raise SourceFormatError(path, f"truncated at byte {offset}: {what}")
            header = bytes(data[offset : offset + BLOCK_BYTES])
            if header == _ZERO_BLOCK:
                return members
            _check_sum(path, header, offset)
            kind = header[156:157]
            member_size = (
                int(pax["size"]) if "size" in pax else _number(path, header[124:136], offset)
            )
            start = offset + BLOCK_BYTES
            end = start + member_size
            if end > size:
                raise SourceFormatError(
                    path,
                    f"truncated: the member at byte {offset} needs {member_size} bytes of data "
                    f"from byte {start}, the file has {size}",
                )
            offset = start + -(-member_size // BLOCK_BYTES) * BLOCK_BYTES
            if kind == b"L":
                long_name = _text(data[start:end])
                continue
            if kind == b"x":
                pax = _pax(path, bytes(data[start:end]), start)
                continue
            if kind in (b"g", b"K"):
                continue
            name = pax.get("path") or long_name or _ustar_name(header)
            long_name, pax = None, {}
            if kind == b"S" and header[482]:  # sparse map continues in extra blocks
                raise SourceFormatError(path, f"GNU sparse member at byte {offset}: unsupported")
            if kind in _REGULAR:
                members.append(TarMember(name, start, member_size))
    except (ValueError, UnicodeDecodeError) as exc:
        raise SourceFormatError(path, f"unreadable header at byte {offset}: {exc}") from exc


def _check_sum(path: str, header: bytes, offset: int) -> None:
    """The header checksum: the sum of its bytes with the checksum field read as spaces (tar
    writers have used signed and unsigned sums; both are accepted, as tarfile does)."""
    stored = _number(path, header[148:156], offset)
    blanked = header[:148] + b" " * 8 + header[156:]
    unsigned = sum(blanked)
    if stored == unsigned:
        return
    if stored != unsigned - 256 * sum(1 for b in blanked if b > 127):  # signed-char writers
        raise SourceFormatError(path, f"corrupt: bad header checksum at byte {offset}")


def _number(path: str, field: bytes, offset: int) -> int:
    """An octal field, or GNU base-256 (high bit of the first byte set) for large values."""
    if field and field[0] & 0x80:
        value = int.from_bytes(field[1:], "big")
        return value - (1 << (8 * len(field) - 8)) if field[0] & 0x40 else value
    text = field.split(b"\0", 1)[0].strip(b" ")
    if not text:
        return 0
    try:
        return int(text, 8)
    except ValueError:
        raise SourceFormatError(path, f"corrupt: non-octal header field at byte {offset}") from None


def _text(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")


def _ustar_name(header: bytes) -> str:
    name = _text(header[0:100])
    if header[257:262] == b"ustar" and header[262:263] == b"\0":  # POSIX ustar: prefix field
        prefix = _text(header[345:500])
        if prefix:
            return f"{prefix}/{name}"
    return name


def _pax(path: str, raw: bytes, offset: int) -> dict[str, str]:
    """PAX records ``"<length> <key>=<value>\\n"``; only the keys that locate data are kept."""
    out: dict[str, str] = {}
    at = 0
    while at < len(raw) and raw[at : at + 1] != b"\0":
        space = raw.index(b" ", at)
        length = int(raw[at:space])
        if length <= 0 or at + length > len(raw):
            raise SourceFormatError(path, f"corrupt: bad PAX record at byte {offset + at}")
        key, _, value = raw[space + 1 : at + length - 1].partition(b"=")
        if key in (b"path", b"size"):
            out[key.decode()] = value.decode("utf-8", "surrogateescape")
        at += length
    return out
