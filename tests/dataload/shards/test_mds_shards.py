"""MDSShards: the column encodings, damaged and compressed shards, every sample once, resume."""

from __future__ import annotations

import io
import json
from decimal import Decimal
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from dataload import MDSShards, ShuffledLoader, SourceFormatError
from dataload.testing import assert_resumes_exactly
from tests.dataload.shards._shards import checked_id, every_sample_once, write_mds

pytestmark = pytest.mark.usefixtures("no_thread_leak")

TEXT = {"id": "int", "text": "str"}


def rows(count: int) -> list[dict]:
    return [{"id": i, "text": f"row {i}" * (1 + i % 5)} for i in range(count)]


def png_bytes(value: int) -> bytes:
    out = io.BytesIO()
    Image.fromarray(np.full((4, 3), value, np.uint8)).save(out, format="PNG")
    return out.getvalue()


def test_every_supported_encoding_round_trips(tmp_path: Path) -> None:
    columns = {
        "b": "bytes", "s": "str", "i": "int", "i32": "int32", "u8": "uint8", "f32": "float32",
        "f64": "float64", "j": "json", "p": "pkl", "img": "png", "si": "str_int",
        "sf": "str_float", "sd": "str_decimal", "fixed": "ndarray:int16:2,3",
        "dtyped": "ndarray:float32", "free": "ndarray",
    }  # fmt: skip
    data = [
        {
            "b": bytes([i]) * i,
            "s": "é" * i,
            "i": -(2**40) * i,
            "i32": -i,
            "u8": i,
            "f32": i / 4,
            "f64": i / 3,
            "j": {"n": [i, None]},
            "p": {i: (i,)},
            "img": png_bytes(i),
            "si": i * 7,
            "sf": i / 8,
            "sd": Decimal(f"{i}.25"),
            "fixed": np.arange(6, dtype=np.int16).reshape(2, 3) * i,
            "dtyped": np.full(i, 0.5, np.float32),
            "free": np.ones((i, 2), np.uint64) * i,
        }
        for i in range(6)
    ]
    dataset = MDSShards(write_mds(tmp_path, columns, data, 4), allow_unsafe_types=True)
    assert len(dataset) == 6 and len(dataset.shards) == 2
    for i, expected in enumerate(data):
        got = dataset[i]
        assert set(got) == set(columns)
        for name, value in expected.items():
            if isinstance(value, np.ndarray):
                assert got[name].dtype == value.dtype
                np.testing.assert_array_equal(got[name], value)
            else:
                assert got[name] == value, name
    decoded = MDSShards(tmp_path, decode_images=True, allow_unsafe_types=True)[5]["img"]
    assert np.asarray(decoded).tolist() == np.full((4, 3), 5).tolist()


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    texts=st.lists(st.text(max_size=40), min_size=1, max_size=30),
    per_shard=st.integers(1, 8),
)
def test_strings_and_bytes_against_a_list(tmp_path: Path, texts: list[str], per_shard: int) -> None:
    data = [{"t": t, "raw": t.encode()[::-1]} for t in texts]
    folder = write_mds(tmp_path / f"h{per_shard}", {"t": "str", "raw": "bytes"}, data, per_shard)
    dataset = MDSShards(folder)
    assert [dataset[i] for i in range(len(dataset))] == data


def test_compressed_unsafe_unknown_and_truncated_shards_are_typed_errors(tmp_path: Path) -> None:
    folder = write_mds(tmp_path / "d", TEXT, rows(20), 8)
    index = json.loads((folder / "index.json").read_text())
    index["shards"][1]["compression"] = "zstd:7"
    (folder / "index.json").write_text(json.dumps(index))
    with pytest.raises(SourceFormatError, match="zstd:7-compressed"):
        MDSShards(folder)
    with pytest.raises(SourceFormatError, match="allow_unsafe_types"):
        MDSShards(write_mds(tmp_path / "p", {"p": "pkl"}, [{"p": 1}], 1))
    unknown = write_mds(tmp_path / "l", {"x": "bytes"}, [{"x": b""}], 1)
    text = (unknown / "index.json").read_text().replace('"bytes"', '"list[pil]"')
    (unknown / "index.json").write_text(text)
    with pytest.raises(SourceFormatError, match=r"list\[pil\]"):
        MDSShards(unknown)
    cut = write_mds(tmp_path / "t", TEXT, rows(20), 8)
    shard = cut / "shard.00001.mds"
    shard.write_bytes(shard.read_bytes()[:-10])
    with pytest.raises(SourceFormatError, match=r"shard\.00001\.mds"):
        MDSShards(cut)


@pytest.mark.parametrize(("world_size", "workers"), [(1, 0), (2, 2)])
def test_every_sample_once_across_ranks_and_workers(tmp_path, world_size, workers) -> None:
    dataset = MDSShards(write_mds(tmp_path, TEXT, rows(61), 9))
    seen = every_sample_once(dataset, checked_id, world_size, workers)
    assert set(seen.values()) == {1}
    assert len(seen) == 61 - 61 % world_size


def test_resume_at_random_points(tmp_path: Path) -> None:
    dataset = MDSShards(write_mds(tmp_path, TEXT, rows(40), 7))

    def make() -> ShuffledLoader:
        return ShuffledLoader(dataset, 6, seed=2, transform=checked_id, collate_fn=list)

    cuts = np.random.default_rng(5).integers(1, 14, 3).tolist()
    assert_resumes_exactly(make, list, cuts, total_batches=14)
