"""Property-based tests (hypothesis), 1,350 examples in all:

- any mutation of a valid manifest (a value replaced by random JSON, a key dropped or added,
  bytes flipped, inserted or cut) either validates or raises ManifestError; and when it does
  validate, loading it raises nothing but CorruptCheckpointError / NotFoundError;
- random nested states (dicts, lists, tuples, arrays of every allowed dtype and of random
  shapes including empty ones, numpy scalars, JSON values) survive save/load exactly, with
  random chunk and object sizes;
- loading a box of a tensor stored in many chunks equals numpy indexing (resharding).

Runs on ``memory://`` stores; ``deadline=None`` because the machine is shared.
"""

from __future__ import annotations

import contextlib
import json
import math
import uuid

import numpy as np
import pytest
from ckptio.backends import memory
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import ckptio
from ckptio import errors
from ckptio import format as fmt
from ckptio import manifest as mf
from ckptio.checkpoint import CheckpointReader
from ckptio.registry import open_store

SETTINGS = dict(deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])

# -- one valid checkpoint to mutate -------------------------------------------------------------

_BASE_URL = f"memory://props-base-{uuid.uuid4().hex[:8]}"
_BASE_STATE = {
    "w": np.arange(600, dtype=np.float32).reshape(20, 30),
    "opt": [{"m": np.ones((3, 4, 5), dtype=np.float16)}, (np.int64(5), 0.5)],
    "mask": np.array([True, False, True]),
    "name": "run",
}


def _base() -> tuple[bytes, dict]:
    ckptio.save(_BASE_STATE, _BASE_URL, step=3, chunk_size=256, max_object_size=4096)
    with open_store(_BASE_URL) as store:
        raw = store.get(fmt.manifest_key(3))
    return raw, json.loads(raw)


BASE_RAW, BASE_DOC = _base()

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
    | st.sampled_from([0, -1, 1 << 62, 1 << 63, 4096, "data/../x", "/etc/passwd", "float32", "O"]),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=12,
)


def _paths(node, prefix=()):
    """Every (path) into a JSON document, containers included."""
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, (*prefix, i))


ALL_PATHS = [p for p in _paths(BASE_DOC) if p]


@st.composite
def mutated_docs(draw):
    doc = json.loads(json.dumps(BASE_DOC))
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(ALL_PATHS))
        parent = doc
        try:
            for p in path[:-1]:
                parent = parent[p]
            last = path[-1]
            parent[last]  # still there after earlier mutations?
        except (KeyError, IndexError, TypeError):
            continue
        action = draw(st.sampled_from(["replace", "delete", "add", "nudge"]))
        if action == "replace":
            parent[last] = draw(json_values)
        elif action == "delete":
            del parent[last]
        elif action == "add" and isinstance(parent, dict):
            parent[draw(st.text(max_size=8))] = draw(json_values)
        elif (
            action == "nudge"
            and isinstance(parent[last], int)
            and not isinstance(parent[last], bool)
        ):
            parent[last] += draw(st.sampled_from([-4097, -1, 1, 4096, 1 << 40]))
    return doc


def _check_load(raw: bytes) -> None:
    """parse_manifest accepts or raises ManifestError; if it accepts, reading the data
    behind it raises only CorruptCheckpointError / NotFoundError (never anything else)."""
    try:
        manifest = mf.parse_manifest(raw, expect_step=3)
    except errors.ManifestError:
        event("refused")
        return
    event("validated, then loaded")
    with open_store(_BASE_URL) as store:
        reader = CheckpointReader(store, 3, manifest)
        with contextlib.suppress(errors.CorruptCheckpointError, errors.NotFoundError):
            reader.state()
        with contextlib.suppress(errors.CorruptCheckpointError, errors.NotFoundError):
            assert all(isinstance(p, str) for p in reader.verify())


@settings(max_examples=400, **SETTINGS)
@given(mutated_docs())
def test_mutated_manifest_validates_or_raises_manifest_error(doc):
    _check_load(json.dumps(doc).encode())


@st.composite
def mutated_bytes(draw):
    raw = bytearray(BASE_RAW)
    for _ in range(draw(st.integers(1, 4))):
        action = draw(st.sampled_from(["flip", "insert", "cut", "truncate"]))
        pos = draw(st.integers(0, len(raw) - 1)) if raw else 0
        if action == "flip" and raw:
            raw[pos] = draw(st.integers(0, 255))
        elif action == "insert":
            raw[pos:pos] = draw(st.binary(min_size=1, max_size=8))
        elif action == "cut" and raw:
            del raw[pos : pos + draw(st.integers(1, 16))]
        elif action == "truncate":
            del raw[pos:]
    return bytes(raw)


@settings(max_examples=300, **SETTINGS)
@given(mutated_bytes())
def test_mutated_manifest_bytes_validate_or_raise_manifest_error(raw):
    _check_load(raw)


def test_the_mutation_base_is_valid():
    assert mf.parse_manifest(BASE_RAW, expect_step=3).step == 3
    assert ckptio.load(_BASE_URL, step=3)["name"] == "run"


# -- save/load round trips ----------------------------------------------------------------------

DTYPE_NAMES = sorted(fmt.DTYPES)


@st.composite
def arrays(draw):
    dtype = fmt.DTYPES[draw(st.sampled_from(DTYPE_NAMES))]
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=6))
    n = math.prod(shape)
    raw = draw(st.binary(min_size=n * dtype.itemsize, max_size=n * dtype.itemsize))
    arr = np.frombuffer(raw, dtype=dtype).reshape(shape).copy()  # any bit pattern, NaNs included
    if draw(st.booleans()) and arr.ndim >= 2:
        arr = arr.T  # not C-contiguous
    if draw(st.booleans()) and dtype.itemsize > 1 and dtype.kind in "iuf":
        arr = arr.astype(dtype.newbyteorder(">"))  # big-endian input
    return arr


def _scalar(draw):
    dtype = fmt.DTYPES[draw(st.sampled_from(DTYPE_NAMES))]
    raw = draw(st.binary(min_size=dtype.itemsize, max_size=dtype.itemsize))
    return np.frombuffer(raw, dtype=dtype)[0]


keys = st.text(min_size=0, max_size=8)
leaves = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()  # nan, inf, -inf, -0.0 included
    | st.text(max_size=10)
    | arrays()
    | st.composite(lambda draw: _scalar(draw))()
)
states = st.recursive(
    leaves,
    lambda children: (
        st.lists(children, max_size=4)
        | st.lists(children, max_size=3).map(tuple)
        | st.dictionaries(keys, children, max_size=4)
    ),
    max_leaves=10,
)


def _expected(x):
    """What load returns for saved ``x``: arrays come back C-contiguous, little-endian."""
    if isinstance(x, np.ndarray):
        return x.astype(x.dtype.newbyteorder("<"), order="C")
    if isinstance(x, dict):
        return {k: _expected(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return type(x)(_expected(v) for v in x)
    return x


def _same(a, b, path="") -> None:
    if isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray), path
        assert a.dtype == b.dtype and a.shape == b.shape, (path, a.dtype, b.dtype, a.shape, b.shape)
        assert a.tobytes() == b.tobytes(), path
    elif isinstance(a, np.generic):
        assert type(a) is type(b) and a.tobytes() == b.tobytes(), (path, a, b)
    elif isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b), path
        for k in a:
            _same(a[k], b[k], f"{path}/{k}")
    elif isinstance(a, list | tuple):
        assert type(a) is type(b) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _same(x, y, f"{path}/{i}")
    elif isinstance(a, float) and math.isnan(a):
        assert isinstance(b, float) and math.isnan(b), path
    else:
        assert type(a) is type(b) and a == b, (path, a, b)
        if isinstance(a, float):
            assert math.copysign(1, a) == math.copysign(1, b), path  # -0.0 stays -0.0


def _holds_nothing(x: object) -> bool:
    if isinstance(x, dict):
        return all(map(_holds_nothing, x.values()))
    if isinstance(x, list | tuple):
        return all(map(_holds_nothing, x))
    return x is None


@settings(max_examples=450, **SETTINGS)
@given(
    state=states,
    chunk_size=st.sampled_from([1, 64, 4096, 64 * 2**20]),
    max_object_size=st.sampled_from([1, 5000, 2**30]),
    metadata=json_values,
    blocking=st.booleans(),
)
def test_save_load_round_trip(state, chunk_size, max_object_size, metadata, blocking):
    url = f"memory://props-rt-{uuid.uuid4().hex[:12]}"
    if _holds_nothing(state):  # None, or containers of only None / empty containers
        with pytest.raises(errors.InvalidArgumentError, match="nothing to save"):
            ckptio.save(state, url, step=1, blocking=blocking)
        assert ckptio.Checkpointer(url).steps() == []
        return
    try:
        handle = ckptio.save(
            state,
            url,
            step=1,
            metadata=metadata,
            blocking=blocking,
            chunk_size=chunk_size,
            max_object_size=max_object_size,
        )
        handle.wait()
        back = ckptio.load(url)
        _same(_expected(state), back)
        reader = ckptio.open_checkpoint(url)
        assert reader.metadata == metadata
        assert reader.verify() == []
    finally:
        memory._SPACES.pop(url.split("://", 1)[1], None)


@st.composite
def boxes(draw):
    """An array and a basic index (unit-step slices, negative bounds, ints) into it."""
    arr = draw(arrays().filter(lambda a: a.ndim >= 1))
    index = []
    for n in arr.shape[: draw(st.integers(0, arr.ndim))]:
        if n and draw(st.booleans()):
            index.append(draw(st.integers(-n, n - 1)))
        else:
            index.append(
                slice(
                    draw(st.none() | st.integers(-n - 2, n + 2)),
                    draw(st.none() | st.integers(-n - 2, n + 2)),
                )
            )
    return arr, tuple(index)


@settings(max_examples=200, **SETTINGS)
@given(box=boxes(), chunk_size=st.sampled_from([1, 8, 100, 4096]))
def test_partial_load_equals_numpy_indexing(box, chunk_size):
    """Loading a box of a tensor saved in many chunks (resharding) is numpy indexing."""
    arr, index = box
    url = f"memory://props-box-{uuid.uuid4().hex[:12]}"
    try:
        ckptio.save({"t": arr}, url, step=1, chunk_size=chunk_size)
        got = ckptio.load(url, select={"t": index})["t"]
        # a trailing Ellipsis keeps an all-int index a 0-d *view*: a numpy scalar would
        # canonicalise non-canonical bool bytes (b"\x02" -> b"\x01") that load keeps as stored
        want = _expected(arr)[(*index, ...) if isinstance(index, tuple) else (index, ...)]
        assert got.shape == want.shape and got.dtype == want.dtype
        assert got.tobytes() == np.ascontiguousarray(want).tobytes()
    finally:
        memory._SPACES.pop(url.split("://", 1)[1], None)
