"""The manifest's three validation paths accept and refuse exactly the same manifests, and name
the same field when they refuse:

- fast: msgspec decodes the JSON, the tensor entries straight into structs, with duplicate keys
  found by counting them (``_decode_fast``), then numpy checks across fields (``_tensors_checked``);
- bulk: json decodes it, ``msgspec.convert`` builds the entries, the same numpy checks;
- per field: ``_validate_tensor``, the path that names a bad field.
"""

from __future__ import annotations

import copy
import itertools
import json
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckptio import errors
from ckptio import format as fmt
from ckptio import manifest as mf


def _doc(ntensors: int = 3, per: int = 20, rows: int = 8) -> dict[str, Any]:
    objects = {f"data/rank-{r:05d}-000-ab.bin": 1 << 30 for r in range(per)}
    tensors = {}
    for t in range(ntensors):
        chunks = [
            mf.Chunk(
                (c * rows, 0),
                (rows, 16),
                f"data/rank-{c:05d}-000-ab.bin",
                t * 4096,
                rows * 16 * 4,
                7 + c,
            ).as_json()
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


PATHS = ("fast", "bulk", "field")


def _outcome(data: Any, path: str = "fast", monkeypatch: pytest.MonkeyPatch | None = None) -> Any:
    """parse_manifest's result (or error: field and type) along one of the three paths."""
    if not isinstance(data, bytes):
        data = json.dumps(data, separators=(",", ":")).encode()
    with pytest.MonkeyPatch.context() as m:
        if path in ("bulk", "field"):
            m.setattr(mf, "_decode_fast", lambda *a: None)
        if path == "field":
            m.setattr(mf, "_tensors_checked", lambda *a: None)
        try:
            man = mf.parse_manifest(data)
        except errors.ManifestError as err:
            return ("error", err.field if hasattr(err, "field") else None, type(err), str(err))
    return (
        "ok",
        {p: (t.dtype, t.shape, t.chunks) for p, t in man.tensors.items()},
        man.tree,
        man.metadata,
    )


def _same_on_every_path(data: Any) -> Any:
    outcomes = {path: _outcome(data, path) for path in PATHS}
    assert outcomes["fast"] == outcomes["bulk"] == outcomes["field"], outcomes
    return outcomes["fast"]


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
    ("shape:1", 1 << 70),
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


@pytest.mark.parametrize("per", [3, 20])
@pytest.mark.parametrize(("field", "value"), MUTATIONS)
def test_every_path_refuses_what_the_field_checks_refuse(field, value, per):
    outcome = _same_on_every_path(_set(_doc(per=per), field, value))
    assert outcome[0] == "error"


@pytest.mark.parametrize("per", [0, 1, 3, 20])
def test_every_path_accepts_what_the_field_checks_accept(per):
    assert _same_on_every_path(_doc(per=per))[0] == "ok"


def test_the_fast_path_is_the_one_taken_for_what_ckptio_writes(monkeypatch):
    taken = []
    real = mf._decode_fast
    monkeypatch.setattr(mf, "_decode_fast", lambda data: taken.append(real(data)) or taken[-1])
    monkeypatch.setattr(mf, "_validate_tensor", lambda *a: pytest.fail("the per-field checks ran"))
    data = json.dumps(_doc(), separators=(",", ":")).encode()
    mf.parse_manifest(data)
    assert taken[-1] is not None
    mf.parse_manifest(json.dumps(_doc()).encode())  # json.dumps's default separators too
    assert taken[-1] is not None


@pytest.mark.parametrize(
    "text",
    [
        lambda doc: json.dumps(
            doc, indent=2
        ),  # whitespace after strings: the keys cannot be counted
        lambda doc: json.dumps(doc).replace('"tensors"', '"tens\\u006frs"'),  # an escape
    ],
)
def test_what_the_fast_path_cannot_count_is_decoded_by_json(text):
    data = text(_doc()).encode()
    assert mf._decode_fast(data) is None
    assert _same_on_every_path(data)[0] == "ok"


DUPLICATES = [  # (old, new) in the compact JSON of _doc(): one key repeated, at every level
    ('"world_size":1', '"world_size":1,"world_size":2'),
    ('"step":1', '"step":1,"step":1'),  # the same value twice is refused as well
    ('"dtype":"float32"', '"dtype":"float32","dtype":"int8"'),
    ('"crc32c":9', '"crc32c":9,"crc32c":10'),
    ('"offset":4096', '"offset":4096,"offset":8192'),
    ('"tensors":{', '"tensors":{"w2":{"dtype":"int8","shape":[0],"chunks":[]},'),
    ('"objects":{', '"objects":{"data/rank-00001-000-ab.bin":5,'),
    ('"tree":{"d":{', '"tree":{"d":{"w0":{"t":"w1"},'),
    ('"tree":{', '"metadata":{"a":1,"a":1},"tree":{'),
    ('"tree":{', '"tensors":{},"tree":{'),  # the key whose value msgspec decodes itself
    ('"chunks":[{', '"chunks":[{"key":"data/rank-00000-000-ab.bin",'),
    ('"shape":[160,16],', '"shape":[160,16],"shape":[160,16],'),
]


@pytest.mark.parametrize(("old", "new"), DUPLICATES)
def test_a_repeated_key_is_refused_on_every_path(old, new):
    text = json.dumps(_doc(), separators=(",", ":"))
    assert old in text
    outcome = _same_on_every_path(text.replace(old, new, 1).encode())
    assert outcome[0] == "error" and "duplicate key" in outcome[3], outcome


def test_an_escaped_twin_of_a_key_is_refused():
    # "off\u0073et" decodes to "offset": a count of the text's keys would see two names
    text = json.dumps(_doc(), separators=(",", ":")).replace(
        '"offset":4096', '"offset":4096,"off\\u0073et":0', 1
    )
    outcome = _same_on_every_path(text.encode())
    assert outcome[0] == "error" and "duplicate key 'offset'" in outcome[3]


def test_unknown_fields_are_ignored_on_every_path():
    doc = _doc()
    doc["tensors"]["w1"]["chunks"][2]["comment"] = "x"
    doc["tensors"]["w0"]["note"] = {"k": [1]}
    doc["future"] = {"y": 1}
    assert _same_on_every_path(doc)[0] == "ok"


def test_overlapping_chunks_are_refused_by_every_path():
    doc = _doc()
    chunks = doc["tensors"]["w0"]["chunks"]
    chunks[3]["offsets"] = [chunks[2]["offsets"][0] + 1, 0]  # overlaps its neighbour...
    chunks[4]["offsets"] = [0, 0]  # ...and the volume still adds up only if overlap is missed
    assert _same_on_every_path(doc)[0] == "error"


def test_chunks_sharing_object_bytes_are_refused():
    doc = _doc()
    doc["tensors"]["w1"]["chunks"][0]["offset"] = doc["tensors"]["w0"]["chunks"][0]["offset"] + 8
    outcome = _same_on_every_path(doc)
    assert outcome[0] == "error" and "share bytes" in outcome[3]


def test_built_chunks_equal_and_hash_like_constructed_ones():
    m = mf.parse_manifest(json.dumps(_doc()).encode())
    c = m.tensors["w2"].chunks[1]
    twin = mf.Chunk(c.offsets, c.shape, c.key, c.offset, c.length, c.crc32c)
    assert c == twin and hash(c) == hash(twin) and repr(c) == repr(twin)
    assert type(c.offsets) is tuple and type(m.tensors["w2"].chunks) is tuple
    with pytest.raises(AttributeError):
        c.offset = 0  # still frozen


def test_a_scalar_node_with_a_non_string_dtype_is_a_manifest_error():
    doc = _doc()
    doc["tree"]["d"]["x"] = {"s": [[], "05"]}
    with pytest.raises(errors.ManifestError, match="bad scalar"):
        mf.parse_manifest(json.dumps(doc).encode())


def test_few_chunk_overlap_is_refused_by_every_path():
    doc = _doc(per=3)
    chunks = doc["tensors"]["w0"]["chunks"]
    chunks[1]["offsets"] = [chunks[0]["offsets"][0] + 1, 0]
    chunks[2]["offsets"] = [0, 0]
    assert _same_on_every_path(doc)[0] == "error"


# -- random manifests: tensors of 0-3 dimensions, empty ones, splits along one or two dimensions,
#    then one field of one chunk set to a value drawn from the troublesome ones


@st.composite
def _manifests(draw: Any) -> dict[str, Any]:
    objects: dict[str, int] = {}
    tensors = {}
    for t in range(draw(st.integers(1, 4))):
        nd = draw(st.integers(0, 3))
        shape = [draw(st.integers(0, 6)) for _ in range(nd)]
        dims = (
            draw(st.sampled_from([[], [0], [0, 1]]))
            if nd >= 2
            else ([0] if nd and draw(st.booleans()) else [])
        )
        boxes = [([0] * nd, list(shape))]
        for d in dims:  # split every box along d at the drawn cuts
            cuts = sorted(
                set(draw(st.lists(st.integers(0, shape[d]), min_size=1, max_size=3)))
                | {0, shape[d]}
            )
            boxes = [
                ([*o[:d], a, *o[d + 1 :]], [*e[:d], b - a, *e[d + 1 :]])
                for o, e in boxes
                for a, b in itertools.pairwise(cuts)
            ]
        chunks = []
        for c, (offs, ext) in enumerate(boxes):
            key = f"data/rank-{draw(st.integers(0, 2)):05d}-000-ab.bin"
            length = int(np.prod(ext, dtype=np.int64)) * 2
            chunks.append(
                {
                    "offsets": offs,
                    "shape": ext,
                    "key": key,
                    "offset": objects.get(key, 0),
                    "length": length,
                    "crc32c": c,
                }
            )
            objects[key] = objects.get(key, 0) + -(-length // 4096) * 4096
        tensors[f"t{t}"] = {"dtype": "float16", "shape": shape, "chunks": chunks}
    objects = {k: v + draw(st.integers(0, 8192)) for k, v in objects.items()}
    return {
        "format": "ckptio",
        "version": 1,
        "step": 1,
        "world_size": 1,
        "objects": objects,
        "tensors": tensors,
        "tree": {"d": {p: {"t": p} for p in tensors}},
    }


_VALUES = st.sampled_from(
    [
        0,
        1,
        2,
        3,
        6,
        7,
        4096,
        -1,
        1 << 62,
        (1 << 62) + 1,
        1 << 64,
        True,
        1.0,
        None,
        "0",
        [],
        [0],
        [1, 1],
    ]
)
_FIELDS = st.sampled_from(
    [
        "offsets",
        "shape",
        "offset",
        "length",
        "crc32c",
        "key",
        "offsets.0",
        "shape.0",
        "offsets.1",
        "shape.1",
        "like",
    ]
)
"""A chunk's field, or an element of its offsets or shape; "like": another chunk's offsets and
shape (an overlap that keeps the volume), or its offset (shared bytes)."""


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=_manifests(), mutate=st.booleans(), data=st.data())
def test_random_manifests_get_the_same_outcome_on_every_path(doc, mutate, data):
    chunks = [c for t in doc["tensors"].values() for c in t["chunks"]]
    if mutate and chunks:
        chunk = data.draw(st.sampled_from(chunks))
        field, value = data.draw(_FIELDS), data.draw(_VALUES)
        name, _, i = field.partition(".")
        if name == "like":
            other = data.draw(st.sampled_from(chunks))
            for f in data.draw(st.sampled_from([("offsets",), ("offsets", "shape"), ("offset",)])):
                chunk[f] = copy.deepcopy(other[f])
        elif not i:
            chunk[name] = value
        elif int(i) < len(chunk[name]):
            chunk[name][int(i)] = value
    _same_on_every_path(doc)


def test_dtype_names_of_native_and_foreign_dtypes():
    assert fmt.dtype_name(np.dtype(np.float32)) == "float32"
    assert fmt.dtype_name(np.float32) == "float32"
    assert fmt.dtype_name(np.dtype(">f4")) == "float32"  # byte order is the writer's business
    with pytest.raises(errors.InvalidArgumentError):
        fmt.dtype_name(np.dtype("U3"))


def test_to_json_round_trips_through_the_fast_path():
    chunk = mf.Chunk((0,), (4,), "data/rank-00000-000-ab.bin", 0, 16, 5)
    scalar = mf.Chunk((), (), "data/rank-00000-000-ab.bin", 4096, 8, 6)
    tensors = {
        "modèle/w": mf.TensorEntry("float32", (4,), (chunk,)),
        "step": mf.TensorEntry("int64", (), (scalar,)),
    }
    m = mf.Manifest(
        step=3,
        world_size=1,
        tensors=tensors,
        objects={"data/rank-00000-000-ab.bin": 8192},
        tree={"d": {p: {"t": p} for p in tensors}},
        metadata={"note": "café", "lr": 0.5},
        layout={"kind": "file-per-shard"},
        created="2026-12-03T18:00:00Z",
        extra={"x": [1]},
    )
    data = m.to_json()
    assert mf._decode_fast(data) is not None  # no escapes: UTF-8 is written as it is
    assert mf.parse_manifest(data, expect_step=3) == m
    assert json.loads(data) == json.loads(json.dumps(json.loads(data)))  # plain JSON to any reader


def test_to_json_refuses_non_finite_metadata():
    m = mf.Manifest(
        step=1,
        world_size=1,
        tensors={},
        objects={},
        tree={"d": {}},
        metadata={"loss": float("nan")},
    )
    with pytest.raises(ValueError, match="not JSON compliant"):
        m.to_json()


def test_to_json_escapes_a_lone_surrogate_rather_than_fail():
    tensors = {"w\ud800": mf.TensorEntry("float32", (0,), ())}
    m = mf.Manifest(
        step=1, world_size=1, tensors=tensors, objects={}, tree={"d": {"w\ud800": {"t": "w\ud800"}}}
    )
    data = m.to_json()
    assert data.isascii() and b"\\ud800" in data
    assert mf.parse_manifest(data) == m


@pytest.mark.parametrize("block", [1, 2, 7, 64, 1 << 20])
def test_the_key_count_does_not_depend_on_its_block_size(block, monkeypatch):
    text = json.dumps(_doc(), separators=(",", ":")).encode()
    monkeypatch.setattr(mf, "_COUNT_BLOCK", block)
    assert mf._key_count(text) == text.count(b'":')  # no string here starts with ':'
    assert mf._key_count(b'"a string"') == 0 and mf._key_count(b'{"k":"v" }') is None
    twin = text.replace(b'"step":1', b'"step":1,"step":1', 1)
    assert _same_on_every_path(twin)[0] == "error"
