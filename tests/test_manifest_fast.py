"""The bulk (column-wise) manifest validation accepts and refuses exactly what the per-field checks
do, and names the same field when it refuses."""

from __future__ import annotations

import copy
import json
from typing import Any

import numpy as np
import pytest

from ckptio import errors
from ckptio import format as fmt


def _doc(ntensors: int = 3, per: int = 20, rows: int = 8) -> dict[str, Any]:
    objects = {f"data/rank-{r:05d}-000-ab.bin": 1 << 30 for r in range(per)}
    tensors = {}
    for t in range(ntensors):
        chunks = [
            fmt.Chunk((c * rows, 0), (rows, 16), f"data/rank-{c:05d}-000-ab.bin", t * 4096, rows * 16 * 4, 7 + c).as_json()
            for c in range(per)
        ]
        tensors[f"w{t}"] = {"dtype": "float32", "shape": [rows * per, 16], "chunks": chunks}
    return {
        "format": fmt.FORMAT_NAME,
        "version": fmt.FORMAT_VERSION,
        "step": 1,
        "world_size": 1,
        "objects": objects,
        "tensors": tensors,
        "tree": {"d": {p: {"t": p} for p in tensors}},
    }


def _outcome(doc: Any) -> Any:
    try:
        m = fmt.parse_manifest(json.dumps(doc).encode())
    except errors.ManifestError as err:
        return ("error", err.field if hasattr(err, "field") else None, type(err))
    return ("ok", {p: (t.dtype, t.shape, t.chunks) for p, t in m.tensors.items()})


def _slow_outcome(doc: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    with monkeypatch.context() as m:
        m.setattr(fmt, "_chunks_fast", lambda *a, **k: None)
        m.setattr(fmt, "_chunks_few", lambda *a, **k: None)
        return _outcome(doc)


def _set(doc: dict[str, Any], field: str, value: Any) -> dict[str, Any]:
    doc = copy.deepcopy(doc)
    chunk = doc["tensors"]["w1"]["chunks"][2]
    if field.startswith("offsets") or field.startswith("shape"):
        name, i = field.split(":")
        chunk[name][int(i)] = value
    else:
        chunk[field] = value
    return doc


MUTATIONS = [
    ("offsets:0", True),
    ("offsets:0", 1.0),
    ("offsets:0", -1),
    ("offsets:0", 1 << 62),
    ("offsets:1", 1),
    ("shape:0", 9),
    ("shape:0", 0),
    ("shape:1", 1 << 63),
    ("offset", 1 << 62),
    ("offset", (1 << 30) - 100),
    ("offset", "0"),
    ("length", 1),
    ("length", None),
    ("crc32c", 1 << 32),
    ("crc32c", False),
    ("key", "data/other.bin"),
    ("key", ["data/rank-00000-000-ab.bin"]),
    ("key", "../escape.bin"),
]


@pytest.mark.parametrize("per", [3, 20])  # plain-Python pass / numpy pass
@pytest.mark.parametrize(("field", "value"), MUTATIONS)
def test_bulk_validation_refuses_what_the_field_checks_refuse(field, value, per, monkeypatch):
    doc = _set(_doc(per=per), field, value)
    fast, slow = _outcome(doc), _slow_outcome(doc, monkeypatch)
    assert fast == slow
    assert fast[0] == "error"


@pytest.mark.parametrize("per", [1, 3, 20])
def test_bulk_validation_accepts_what_the_field_checks_accept(per, monkeypatch):
    doc = _doc(per=per)
    fast = _outcome(doc)
    assert fast[0] == "ok"
    assert fast == _slow_outcome(doc, monkeypatch)


def test_overlapping_chunks_are_refused_by_both_paths(monkeypatch):
    doc = _doc()
    chunks = doc["tensors"]["w0"]["chunks"]
    chunks[3]["offsets"] = [chunks[2]["offsets"][0] + 1, 0]  # overlaps its neighbour...
    chunks[4]["offsets"] = [0, 0]  # ...and the volume still adds up only if overlap is missed
    fast, slow = _outcome(doc), _slow_outcome(doc, monkeypatch)
    assert fast == slow
    assert fast[0] == "error"


def test_duplicate_json_keys_are_refused():
    data = json.dumps(_doc()).encode().replace(b'"world_size": 1', b'"world_size": 1, "world_size": 2')
    with pytest.raises(errors.ManifestError, match="duplicate key 'world_size'"):
        fmt.parse_manifest(data)


def test_chunks_sharing_object_bytes_are_refused():
    doc = _doc()
    doc["tensors"]["w1"]["chunks"][0]["offset"] = doc["tensors"]["w0"]["chunks"][0]["offset"] + 8
    with pytest.raises(errors.ManifestError, match="share bytes"):
        fmt.parse_manifest(json.dumps(doc).encode())


def test_bulk_built_chunks_equal_and_hash_like_constructed_ones():
    m = fmt.parse_manifest(json.dumps(_doc()).encode())
    c = m.tensors["w2"].chunks[1]
    twin = fmt.Chunk(c.offsets, c.shape, c.key, c.offset, c.length, c.crc32c)
    assert c == twin and hash(c) == hash(twin) and repr(c) == repr(twin)
    with pytest.raises(AttributeError):
        c.offset = 0  # still frozen


def test_a_scalar_node_with_a_non_string_dtype_is_a_manifest_error():
    doc = _doc()
    doc["tree"]["d"]["x"] = {"s": [[], "05"]}
    with pytest.raises(errors.ManifestError, match="bad scalar"):
        fmt.parse_manifest(json.dumps(doc).encode())


def test_the_bulk_path_is_the_one_exercised_above(monkeypatch):
    calls = []
    real = fmt._chunks_fast
    monkeypatch.setattr(fmt, "_chunks_fast", lambda *a: calls.append(1) or real(*a))
    fmt.parse_manifest(json.dumps(_doc()).encode())
    assert calls and fmt._BULK_MIN <= 20


def test_few_chunk_overlap_is_refused_by_both_paths(monkeypatch):
    doc = _doc(per=3)
    chunks = doc["tensors"]["w0"]["chunks"]
    chunks[1]["offsets"] = [chunks[0]["offsets"][0] + 1, 0]
    chunks[2]["offsets"] = [0, 0]
    fast, slow = _outcome(doc), _slow_outcome(doc, monkeypatch)
    assert fast == slow and fast[0] == "error"


def test_dtype_names_of_native_and_foreign_dtypes():
    assert fmt.dtype_name(np.dtype(np.float32)) == "float32"
    assert fmt.dtype_name(np.float32) == "float32"
    assert fmt.dtype_name(np.dtype(">f4")) == "float32"  # byte order is the writer's business
    with pytest.raises(errors.InvalidArgumentError):
        fmt.dtype_name(np.dtype("U3"))
