"""The tar scanner against Python's tarfile: every regular member's bytes, long names, damage."""

from __future__ import annotations

import gzip
import io
import tarfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dataload import SourceFormatError
from dataload.shards.tar_scan import scan_tar
from tests.dataload.shards._shards import write_tar

FORMATS = [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT]


def by_tarfile(path: Path) -> list[tuple[str, bytes]]:
    with tarfile.open(path) as tar:
        return [(m.name, tar.extractfile(m).read()) for m in tar if m.isreg()]  # type: ignore[union-attr]


def by_scan(path: Path) -> list[tuple[str, bytes]]:
    raw = path.read_bytes()
    return [
        (m.name, raw[m.data_offset : m.data_offset + m.size_bytes]) for m in scan_tar(str(path))
    ]


names = st.lists(st.text("abcxyz_-", min_size=1, max_size=12), min_size=1, max_size=14).map(
    "/".join
)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    members=st.lists(st.tuples(names, st.binary(max_size=1100)), max_size=12),
    fmt=st.sampled_from([tarfile.GNU_FORMAT, tarfile.PAX_FORMAT]),
)
def test_every_member_as_tarfile_reads_it(tmp_path: Path, members, fmt) -> None:
    path = write_tar(tmp_path / "h.tar", members, fmt)  # names up to ~180 chars: long names
    assert by_scan(path) == by_tarfile(path) == [(n, d) for n, d in members]


@pytest.mark.parametrize("fmt", FORMATS)
def test_long_names_directories_links_and_pax_are_handled(tmp_path: Path, fmt: int) -> None:
    path = tmp_path / "mixed.tar"
    deep = "/".join(["folder"] * 20) if fmt != tarfile.USTAR_FORMAT else "a/" * 60 + "b"
    with tarfile.open(path, "w", format=fmt) as tar:
        for kind, name in ((tarfile.DIRTYPE, "dir"), (tarfile.SYMTYPE, "dir/link.png")):
            info = tarfile.TarInfo(name)
            info.type, info.linkname = kind, "x" * 150 if fmt != tarfile.USTAR_FORMAT else "x"
            tar.addfile(info)
        for name, data in ((f"{deep}/k1.png", b"one"), ("k1.cls", b"\0" * 512), ("e.txt", b"")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            if fmt == tarfile.PAX_FORMAT:
                info.pax_headers = {"comment": "ü" * 40}
            tar.addfile(info, io.BytesIO(data))
        fifo = tarfile.TarInfo("pipe")
        fifo.type = tarfile.FIFOTYPE
        tar.addfile(fifo)
    assert by_scan(path) == by_tarfile(path)
    assert [n for n, _ in by_scan(path)] == [f"{deep}/k1.png", "k1.cls", "e.txt"]


def test_truncated_corrupt_and_compressed_shards_raise_naming_the_shard(tmp_path: Path) -> None:
    good = write_tar(tmp_path / "good.tar", [("a.png", b"x" * 3000), ("a.cls", b"1")]).read_bytes()
    cases = {
        "mid-data.tar": good[:1500],  # inside a member's data
        "mid-header.tar": good[: 4096 + 100],  # inside the second header
        "no-end.tar": good[: 512 * 8],  # cut at a block boundary: no end-of-archive marker
        "checksum.tar": good[:100] + b"Z" + good[101:],  # a flipped byte in the first name
        "gz.tar": gzip.compress(good),
        "empty.tar": b"",
    }
    for name, raw in cases.items():
        path = tmp_path / name
        path.write_bytes(raw)
        with pytest.raises(SourceFormatError, match=name):
            scan_tar(str(path))
    assert len(scan_tar(str(tmp_path / "good.tar"))) == 2
