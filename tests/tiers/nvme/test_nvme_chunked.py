"""Chunked records (tiers.nvme.chunks): byte ranges read and checked alone, against a plain bytes
model; damage inside a range found, damage outside its chunks not in its way (but found by a
whole get); get_many with ranges in one submission, moving only the covering chunks."""

from __future__ import annotations

import asyncio
import gzip
import shutil
import struct
import tempfile
import zlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.tiers.nvme.helpers import flip_byte
from tests.tiers.nvme.test_nvme import assert_space_consistent, lease
from tiers.io.buffers import aligned_empty
from tiers.io.errors import CorruptionError, InvalidArgumentError
from tiers.io.threaded import ThreadEngine
from tiers.nvme.catalog import Catalog, CatalogEntry
from tiers.nvme.chunks import chunk_log2_for
from tiers.nvme.format import CHUNK_LOG2, CHUNKED_FROM_BYTES, HEADER_BYTES
from tiers.nvme.nvme_tier import NvmeTier
from tiers.testing.tier_contract import as_bytes

MIB = 1 << 20
CHUNK = 1 << CHUNK_LOG2
PAGE = 4096


def _data(size: int, seed: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()


def _window(size: int, offset: int, nbytes: int) -> tuple[int, int]:
    """Payload bytes [start, end) the spec (tiers.nvme.format) says a range reads and checks."""
    first = min(offset // CHUNK, (size - 1) // CHUNK)
    last = first if nbytes == 0 else (offset + nbytes - 1) // CHUNK
    return first * CHUNK, min((last + 1) * CHUNK, size)


@st.composite
def _ranges(draw: st.DrawFn, size: int) -> tuple[int, int]:
    offset = draw(st.integers(0, size))
    return offset, draw(st.integers(0, size - offset))


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
@given(data=st.data())
def test_ranges_match_a_bytes_model_and_damage_is_found_where_read(data: st.DataObject) -> None:
    sizes = data.draw(
        st.lists(
            st.one_of(
                st.integers(CHUNKED_FROM_BYTES, 3 * MIB),  # chunked, mostly not page multiples
                st.sampled_from([CHUNKED_FROM_BYTES, 2 * MIB + PAGE, 5 * CHUNK]),
                st.integers(1, 3 * PAGE),  # small: header or bare records, checked whole
            ),
            min_size=1,
            max_size=3,
        )
    )
    model = {f"k{i}": _data(size, size + i) for i, size in enumerate(sizes)}
    spans = {key: [data.draw(_ranges(len(v))) for _ in range(3)] for key, v in model.items()}
    victim = data.draw(st.sampled_from(sorted(model)))
    spot = data.draw(st.integers(0, len(model[victim]) - 1))

    async def main(directory: str) -> None:
        tier = await NvmeTier.open("n", 16 * MIB, directory, create=True)
        await tier.put_many(model)
        for key, value in model.items():
            for offset, nbytes in spans[key]:
                got = await tier.get(key, byte_range=(offset, nbytes))
                assert as_bytes(got) == value[offset : offset + nbytes]
        keys = [key for key in model for _ in range(3)]
        flat = [span for key in model for span in spans[key]]
        got_many = await tier.get_many(keys, byte_ranges=list(flat))
        assert [as_bytes(g) for g in got_many] == [
            model[k][o : o + n] for k, (o, n) in zip(keys, flat, strict=True)
        ]
        value, chunked = model[victim], chunk_log2_for(len(model[victim])) > 0
        header = 0 if chunked or len(value) % PAGE == 0 else HEADER_BYTES
        flip_byte(tier, victim, header + spot)
        for offset, nbytes in spans[victim]:
            start, end = _window(len(value), offset, nbytes) if chunked else (0, len(value))
            before = tier.stats()["corruptions"]
            if start <= spot < end:  # in the chunks read: never served
                with pytest.raises(CorruptionError):
                    await tier.get(victim, byte_range=(offset, nbytes))
                assert tier.stats()["corruptions"] == before + 1
            else:  # outside them: the range still reads
                got = await tier.get(victim, byte_range=(offset, nbytes))
                assert as_bytes(got) == value[offset : offset + nbytes]
        with pytest.raises(CorruptionError):  # a whole get (a scrub) finds it
            await tier.get(victim)
        with pytest.raises(CorruptionError):
            await tier.get_many(list(model))
        await tier.aclose()

    with tempfile.TemporaryDirectory() as directory:
        asyncio.run(main(directory))


def test_get_many_with_ranges_reads_only_the_covering_chunks(tmp_path: Path) -> None:
    big, odd, small = _data(8 * MIB, 1), _data(3 * MIB + 100, 2), _data(5000, 3)

    async def main() -> None:
        engine = ThreadEngine(4)
        tier = await NvmeTier.open("n", 32 * MIB, tmp_path, runtime=lease(engine), create=True)
        await tier.put_many({"big": big, "odd": odd, "small": small})
        layer = aligned_empty(MIB)  # page-aligned and exactly a window: read in place
        keys = ["big", "big", "odd", "small", "absent", "odd"]
        spans = [(2 * MIB, MIB), (CHUNK + 10, 20), (3 * MIB, 100), (10, 10), (0, 1), None]
        outs = [layer, None, None, None, None, None]
        before, read_before = engine.counters["batches"], tier.stats()["bytes_read"]
        got = await tier.get_many(keys, outs, byte_ranges=spans)
        assert engine.counters["batches"] - before == 1
        assert got[0] is layer and layer.tobytes() == big[2 * MIB : 3 * MIB]
        assert as_bytes(got[1]) == big[CHUNK + 10 : CHUNK + 30]
        assert as_bytes(got[2]) == odd[3 * MIB :] and as_bytes(got[3]) == small[10:20]
        assert got[4] is None and as_bytes(got[5]) == odd
        # 1 MiB + one chunk + the odd record's last chunk (its padding page) + the small
        # record whole (64-byte header, padded) + the odd record whole (a 4 KiB pad)
        moved = MIB + CHUNK + PAGE + 8192 + (3 * MIB + PAGE)
        assert tier.stats()["bytes_read"] - read_before == moved
        with pytest.raises(InvalidArgumentError):  # a bad range, before any I/O
            await tier.get_many(["big", "odd"], byte_ranges=[(0, 1), (3 * MIB, 101)])
        with pytest.raises(InvalidArgumentError):
            await tier.get_many(["big"], byte_ranges=[])
        assert engine.counters["batches"] - before == 1
        assert_space_consistent(tier)
        await tier.aclose()
        await engine.aclose()

    asyncio.run(main())


def test_a_layer_get_reads_its_chunks_alone(tmp_path: Path) -> None:
    block = _data(16 * MIB, 4)

    async def main() -> None:
        tier = await NvmeTier.open("n", 32 * MIB, tmp_path, create=True)
        await tier.put("block", block)
        start = tier.stats()["bytes_read"]
        layers = await asyncio.gather(  # gathered into one submission, as load_layer's gets
            *(tier.get("block", byte_range=(i * MIB, MIB)) for i in range(3, 7))
        )
        want = [block[i * MIB : (i + 1) * MIB] for i in range(3, 7)]
        assert [as_bytes(x) for x in layers] == want
        assert tier.stats()["bytes_read"] - start == 4 * MIB
        assert as_bytes(await tier.get("block")) == block
        await tier.aclose()

    asyncio.run(main())


def test_the_chunk_extension_follows_the_documented_layout(tmp_path: Path) -> None:
    value = _data(CHUNKED_FROM_BYTES + 1000, 5)

    async def main() -> None:
        tier = await NvmeTier.open("n", 8 * MIB, tmp_path, create=True)
        await tier.put("k", value)
        entry = tier._open_catalog().entries["k"]
        await tier.aclose()
        k = -(-len(value) // CHUNK)
        assert entry.pack()[32:36] == struct.pack("<HBB", 1, CHUNK_LOG2, 0)
        table = [zlib.crc32(value[i * CHUNK : (i + 1) * CHUNK]) for i in range(k)]
        assert entry.chunks[4:] == struct.pack(f"<{k}I", *table)
        assert entry.crc32 == zlib.crc32(entry.chunks[4:])
        assert len(entry.pack()) == 32 + 4 + 4 * k
        raw = (tmp_path / "extents-00000.dat").read_bytes()  # no header: payload, zero padding
        start = entry.offset_bytes
        assert raw[start : start + len(value)] == value
        end = start + len(value)
        assert raw[end : -(-end // PAGE) * PAGE] == bytes(-(-end // PAGE) * PAGE - end)

    asyncio.run(main())


@pytest.mark.parametrize("size", [CHUNKED_FROM_BYTES - 1, 300 * MIB])
def test_chunk_sizes(size: int) -> None:
    log2 = chunk_log2_for(size)
    if size < CHUNKED_FROM_BYTES:
        assert log2 == 0
    else:  # large records: larger chunks, at most 1024 of them
        assert log2 > CHUNK_LOG2 and -(-size >> log2) <= 1024 < -(-size >> (log2 - 1))


FORMAT2_TIER = Path(__file__).parent / "format2_tier"  # written by the writer of 26f6bb1
_OLD = {"big-bare": 3 * MIB, "big-odd": 3 * MIB + 1000, "page": PAGE, "odd": 5000}


def _pattern(size: int, seed: int) -> bytes:
    """The fixture's bytes (compressible, so the fixture is small in git)."""
    return ((np.arange(size, dtype=np.int64) * (seed + 3)) % 251).astype(np.uint8).tobytes()


def test_records_written_before_chunking_still_read(tmp_path: Path) -> None:
    directory = tmp_path / "tier"
    shutil.copytree(FORMAT2_TIER, directory)
    packed = directory / "extents-00000.dat.gz"  # 6 MiB of extents, 28 KiB gzipped
    (directory / "extents-00000.dat").write_bytes(gzip.decompress(packed.read_bytes()))
    packed.unlink()
    expected = {key: _pattern(size, i) for i, (key, size) in enumerate(_OLD.items())}

    async def main() -> None:
        tier = await NvmeTier.open("n", 16 * MIB, directory)
        entries = tier._open_catalog().entries
        assert not any(entry.chunks for entry in entries.values())  # base entries only
        for key, value in expected.items():
            assert as_bytes(await tier.get(key)) == value
            start = tier.stats()["bytes_read"]
            part = await tier.get(key, byte_range=(len(value) // 3, len(value) // 4))
            assert as_bytes(part) == value[len(value) // 3 : len(value) // 3 + len(value) // 4]
            assert tier.stats()["bytes_read"] - start == tier._entry_bytes(entries[key])  # whole
        spans: list[tuple[int, int] | None] = [(100, 200), None, (0, PAGE), (4999, 1)]
        got = await tier.get_many(list(expected), byte_ranges=spans)
        assert [as_bytes(g) for g in got] == [
            v if s is None else v[s[0] : s[0] + s[1]]
            for v, s in zip(expected.values(), spans, strict=True)
        ]
        flip_byte(tier, "big-bare", 2 * MIB)  # an old record's damage: any range read finds it
        with pytest.raises(CorruptionError):
            await tier.get("big-bare", byte_range=(0, 10))
        expected["big-bare"] = _data(3 * MIB, 9)  # an overwrite: now a chunked record
        await tier.put("big-bare", expected["big-bare"])
        assert tier._open_catalog().entries["big-bare"].chunks
        assert_space_consistent(tier)
        await tier.aclose()
        tier = await NvmeTier.open("n", 16 * MIB, directory)
        for key, value in expected.items():
            assert as_bytes(await tier.get(key)) == value
        assert_space_consistent(tier)
        await tier.aclose()

    asyncio.run(main())


@pytest.mark.parametrize("damage", ["table", "format", "length"])
def test_a_chunk_extension_that_does_not_add_up_is_refused(tmp_path: Path, damage: str) -> None:
    async def main() -> None:
        catalog = Catalog(str(tmp_path))
        await catalog.open()
        table = struct.pack("<4I", 1, 2, 3, 4)
        chunks = struct.pack("<HBB", 1, CHUNK_LOG2, 0) + table
        size, crc = 4 * CHUNK - 5, zlib.crc32(table)
        if damage == "table":
            crc ^= 1  # sealed, so only the table's CRC tells
        elif damage == "format":
            chunks = struct.pack("<HBB", 2, CHUNK_LOG2, 0) + table
        else:
            size += CHUNK  # five chunks' worth of bytes, four CRCs
        await catalog.apply("k", CatalogEntry(0, 0, size, crc, 1, chunks))
        await catalog.close()
        with pytest.raises(CorruptionError, match="'k'"):
            await Catalog(str(tmp_path)).open()

    asyncio.run(main())
