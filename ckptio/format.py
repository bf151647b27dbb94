"""The on-storage format: step directories, object naming, dtypes, limits, the state tree.
The manifest (its fields, its one serializer, its parser and validation) is
:mod:`ckptio.manifest`.

::

    <root>/step-<step:010d>/manifest.json         the commit point: written last, atomically
    <root>/step-<step:010d>/data/<...>            shard objects
    <root>/step-<step:010d>/saving-<token>.json   the lease of a save in flight
    <root>/step-<step:010d>/fence-<token>.json    a gc deleting under the step (for a moment)
    <root>/step-<step:010d>/retired.json          retention removed the step; data kept a while

A checkpoint exists when, and only when, its manifest exists and validates. Data without a
manifest is garbage only once no save owns it: a live lease keeps everything under its step
from gc and retention, gc fences a step before it deletes there, a save withdraws its manifest
if it finds a fence or a missing object when it lists its step after publishing, and
retention removes a manifest before its data (see
:mod:`ckptio.lease` for the protocol, the same on POSIX and object stores). The manifest is
JSON (never pickle). Everything read back is validated before it is used: a bad manifest
raises :class:`~ckptio.errors.ManifestError` naming the field; nothing outside the root is
ever addressed, and no allocation exceeds the validated sizes. Free-form JSON (metadata, the
tree, integrations' extras) is counted on the raw text before it is decoded
(:data:`MAX_METADATA_BYTES`, :data:`MAX_FREE_VALUES`), so a manifest cannot make a reader
build far more Python objects than a real one of its tensors would.
"""

from __future__ import annotations

import hashlib
import math
import operator
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ckptio import errors

__all__ = [
    "ALIGNMENT",
    "DTYPES",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "FREE_VALUES_PER_TENSOR_BYTE",
    "KEY_LAYOUTS",
    "MANIFEST_NAME",
    "MAX_DEPTH",
    "MAX_DIMS",
    "MAX_FREE_VALUES",
    "MAX_MANIFEST_BYTES",
    "MAX_METADATA_BYTES",
    "MAX_STEP",
    "MAX_TENSOR_BYTES",
    "NODE_KINDS",
    "Leaf",
    "align_up",
    "as_step",
    "decode_tree",
    "dtype_name",
    "encode_tree",
    "escape",
    "foreign_checkpoint",
    "join_path",
    "manifest_key",
    "parse_step_dir",
    "shard_key",
    "step_dir",
    "tree_tensor_paths",
]

FORMAT_NAME = "ckptio"
FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
ALIGNMENT = 4096
"""Bytes: every chunk starts at a multiple of this inside its shard object (O_DIRECT, ranged
GETs aligned to pages)."""

MAX_MANIFEST_BYTES = 1 << 30
"""A manifest larger than 1 GiB is refused unread (about 5 million chunks)."""
MAX_METADATA_BYTES = 16 << 20
"""The user's free-form ``metadata`` (run configs, counters, a tokenizer's vocabulary) may be
at most 16 MiB of JSON: far more than any real run stores there, and small enough that a
hostile manifest cannot make a reader hold much of it."""
MAX_FREE_VALUES = 1_000_000
"""JSON values and keys (counted by :func:`json_values`) that ``metadata`` may hold, and that
the other values besides the tensor table (``tree``, ``objects``, ``extra``, ``layout``) may
hold together beyond :data:`FREE_VALUES_PER_TENSOR_BYTE`'s share. Decoded by json, each costs
at most ~85 bytes of memory (a one-key object), so 1 million cost at most ~85 MiB, while
JSON such as ``[[],[],...]`` costs ~28x its size: the counts are checked on the raw text,
before anything is decoded."""
FREE_VALUES_PER_TENSOR_BYTE = 1 / 4
"""What ``tree``, ``objects`` and ``extra`` (PyTorch DCP's plan) may hold beyond
:data:`MAX_FREE_VALUES`, per byte of the tensor table: they grow with the tensors and chunks
(ckptio writes ~2 values per object, ~7 per tree leaf and ~35 for DCP per tensor, against
~190 bytes of the table per tensor), so a large checkpoint is never refused for them."""
MAX_TENSOR_BYTES = 1 << 46
"""64 TiB: the largest single tensor a manifest may declare (a memory-bomb bound)."""
MAX_DIMS = 32
"""numpy's own limit on dimensions is 64; real tensors have a handful."""
MAX_DEPTH = 64
"""Deepest nesting of the state tree that is accepted."""
MAX_STEP = 10**10 - 1
"""Steps are written with 10 digits."""

_STEP_DIR = re.compile(r"^step-(\d{10})$")

_NUMPY_DTYPES = (
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "float32",
    "float64",
    "complex64",
    "complex128",
)
_ML_DTYPES = ("bfloat16", "float8_e4m3fn", "float8_e5m2")


_NUMPY_TABLE: dict[str, np.dtype[Any]] = {name: np.dtype(name) for name in _NUMPY_DTYPES}
_NAME_OF: dict[np.dtype[Any], str] = {dt: name for name, dt in _NUMPY_TABLE.items()}
_DTYPE_TYPES: set[type] = {type(dt) for dt in _NUMPY_TABLE.values()}
_ml_table: dict[str, np.dtype[Any]] = {}


def _ml_dtypes_table() -> dict[str, np.dtype[Any]]:
    """ml_dtypes' dtypes by name, imported on first need (it costs over half a second)."""
    if not _ml_table:
        import ml_dtypes

        table = {name: np.dtype(getattr(ml_dtypes, name)) for name in _ML_DTYPES}
        _NAME_OF.update({dt: name for name, dt in table.items()})
        _DTYPE_TYPES.update(type(dt) for dt in table.values())
        _ml_table.update(table)
    return _ml_table


class _DtypeTable(Mapping[str, "np.dtype[Any]"]):
    """dtype name -> numpy dtype; the allow-list. Nothing else is ever interpreted as a dtype
    on load. ml_dtypes (bfloat16, float8) is imported only when one of its names is looked up,
    that is when a state or a manifest holds one of its dtypes: an array cannot have an
    ml_dtypes dtype unless ml_dtypes was imported, and a manifest's dtypes are looked up when
    it is parsed. Membership and iteration give names and import nothing."""

    def __getitem__(self, name: str) -> np.dtype[Any]:
        dt = _NUMPY_TABLE.get(name)
        if dt is not None:
            return dt
        if name in _ML_DTYPES:
            return _ml_dtypes_table()[name]
        raise KeyError(name)

    def __contains__(self, name: object) -> bool:
        return name in _NUMPY_TABLE or name in _ML_DTYPES

    def __iter__(self) -> Iterator[str]:
        return iter((*_NUMPY_DTYPES, *_ML_DTYPES))

    def __len__(self) -> int:
        return len(_NUMPY_DTYPES) + len(_ML_DTYPES)


DTYPES: Mapping[str, np.dtype[Any]] = _DtypeTable()


def dtype_name(dtype: np.dtype[Any]) -> str:
    """The manifest name of a numpy dtype; raises for dtypes ckptio does not store."""
    if type(dtype) in _DTYPE_TYPES:  # a native-order dtype object: one dict lookup
        known = _NAME_OF.get(dtype)
        if known is not None:
            return known
    dt = np.dtype(dtype)
    name = dt.name
    # an ml_dtypes name is looked up (importing ml_dtypes) only for a dtype of that name
    if name not in DTYPES or DTYPES[name] != dt.newbyteorder("="):
        raise errors.InvalidArgumentError(
            f"dtype {dt} cannot be checkpointed; supported: {', '.join(DTYPES)}"
        )
    return name


# -- naming -----------------------------------------------------------------------------------


def as_step(step: Any) -> int:
    """``step`` as a Python int, or :class:`~ckptio.errors.InvalidArgumentError` in one line.

    Any integral is a step: ``int``, numpy integer scalars (``np.int64(7)``), torch integer
    scalars (``torch.tensor(7)``, ``t.item()``), anything with ``__index__``. Refused: bools
    (``True`` is an int to Python, never a step to a user) and floats, ``7.0`` too (a float
    step comes from arithmetic such as ``step / 2``; truncating it would save under another
    number than the caller computed)."""
    kind = type(step).__name__
    shown = repr(step)[:40] if isinstance(step, str) else str(step)[:40]
    if isinstance(step, bool | np.bool_) or str(getattr(step, "dtype", "")).endswith("bool"):
        raise errors.InvalidArgumentError(f"step must be an integer, got {shown} (a bool)")
    try:
        n = operator.index(step)
    except TypeError:
        hint = " (pass int(step) if it is a whole number)" if isinstance(step, float) else ""
        raise errors.InvalidArgumentError(
            f"step must be an integer in [0, {MAX_STEP}], got {shown} ({kind}){hint}"
        ) from None
    if not 0 <= n <= MAX_STEP:
        raise errors.InvalidArgumentError(f"step must be an integer in [0, {MAX_STEP}], got {n}")
    return n


def step_dir(step: int) -> str:
    return f"step-{as_step(step):010d}"


def manifest_key(step: int) -> str:
    return f"{step_dir(step)}/{MANIFEST_NAME}"


def parse_step_dir(name: str) -> int | None:
    m = _STEP_DIR.match(name)
    return int(m.group(1)) if m else None


KEY_LAYOUTS = ("flat", "hashed")


def foreign_checkpoint(keys: Sequence[str]) -> str | None:
    """What a root that holds no ckptio checkpoint holds instead, from the keys listed under
    it, and what reads it; None when nothing known is there. Only the names are looked at
    (nothing is opened): an error message's hint, not a validation."""
    names = {k for k in keys if "/" not in k}
    if ".metadata" in names and any(k.endswith(".distcp") for k in names):
        return (
            "it holds a torch.distributed.checkpoint (DCP) checkpoint written by DCP's "
            "FileSystemWriter (.metadata, *.distcp), not a ckptio one: read it with "
            "dcp.load(..., storage_reader=FileSystemReader(path)), or convert it once with "
            "ckptio.torch.convert_dcp(path, url, allow_pickle=True) (its .metadata is a pickle: "
            "only for storage you trust)"
        )
    return None


def shard_key(step: int, rank: int, index: int, *, key_layout: str = "flat") -> str:
    """Key of shard object ``index`` of ``rank``, relative to the root.

    ``flat``: ``step-…/data/rank-00003-000.bin``. ``hashed``: ``step-…/data/<2 hex>/rank-…`` —
    the two hex digits spread requests over object-store partitions (S3 splits hot prefixes).
    """
    name = f"rank-{rank:05d}-{index:03d}.bin"
    if key_layout == "flat":
        return f"{step_dir(step)}/data/{name}"
    if key_layout == "hashed":
        h = hashlib.blake2s(f"{step}/{rank}/{index}".encode(), digest_size=1).hexdigest()
        return f"{step_dir(step)}/data/{h}/{name}"
    raise errors.InvalidArgumentError(
        f"unknown key_layout {key_layout!r}; valid: {', '.join(KEY_LAYOUTS)}"
    )


def align_up(n: int, alignment: int = ALIGNMENT) -> int:
    return -(-n // alignment) * alignment


# -- the state tree ---------------------------------------------------------------------------
#
# Encoded nodes (one-key objects, so no user key can be mistaken for a marker):
#   {"d": {k: node}}          dict (string keys)
#   {"l": [node, ...]}        list        {"u": [node, ...]}  tuple
#   {"t": "path"}             tensor (an entry of "tensors")
#   {"s": [dtype, "hex"]}     numpy scalar, exact bytes
#   {"v": value}              JSON value: None, bool, int, finite float, str
#   {"f": "nan"|"inf"|"-inf"} non-finite Python float

NODE_KINDS = frozenset("dlutsvf")


def escape(key: str) -> str:
    """JSON-pointer escaping of one path segment (``~`` -> ``~0``, ``/`` -> ``~1``)."""
    return key.replace("~", "~0").replace("/", "~1")


def join_path(parent: str, key: str) -> str:
    return f"{parent}/{escape(key)}" if parent else escape(key)


@dataclass(slots=True)
class Leaf:
    """An array leaf found while encoding a state: its path and the array."""

    path: str
    array: Any


def encode_tree(state: Any, on_array: Any, path: str = "", depth: int = 0) -> Any:
    """Encode ``state``; for every array leaf call ``on_array(path, leaf)`` which returns the
    encoded node (normally ``{"t": path}``). Arrays are recognised by ``on_array`` itself
    returning non-None; see :func:`ckptio.checkpoint` for what counts as an array."""
    if depth > MAX_DEPTH:
        raise errors.InvalidArgumentError(
            f"state nested deeper than {MAX_DEPTH} levels at {path!r}"
        )
    node = on_array(path, state)
    if node is not None:
        return node
    if isinstance(state, Mapping):
        out = {}
        for k, v in state.items():
            if not isinstance(k, str):
                raise errors.InvalidArgumentError(
                    f"state keys must be strings; {path or '<root>'} has key {k!r} ({type(k).__name__})"
                )
            out[k] = encode_tree(v, on_array, join_path(path, k), depth + 1)
        return {"d": out}
    if isinstance(state, list | tuple):
        items = [
            encode_tree(v, on_array, join_path(path, str(i)), depth + 1)
            for i, v in enumerate(state)
        ]
        return {"u": items} if isinstance(state, tuple) else {"l": items}
    if isinstance(state, np.generic):
        return {
            "s": [
                dtype_name(state.dtype),
                np.asarray(state).astype(state.dtype.newbyteorder("<")).tobytes().hex(),
            ]
        }
    if isinstance(state, float) and not math.isfinite(state):
        return {"f": repr(state)}
    if state is None or isinstance(state, bool | int | float | str):
        return {"v": state}
    raise errors.InvalidArgumentError(
        f"cannot checkpoint {type(state).__name__} at {path or '<root>'}: state holds dicts, "
        "lists, tuples, arrays (numpy, torch, jax), numpy scalars and JSON values"
    )


def decode_tree(node: Any, on_tensor: Any) -> Any:
    """Inverse of :func:`encode_tree` for a validated tree; ``on_tensor(path)`` gives arrays."""
    ((kind, val),) = node.items()
    if kind == "d":
        return {k: decode_tree(v, on_tensor) for k, v in val.items()}
    if kind == "l":
        return [decode_tree(v, on_tensor) for v in val]
    if kind == "u":
        return tuple(decode_tree(v, on_tensor) for v in val)
    if kind == "t":
        return on_tensor(val)
    if kind == "s":
        dt = DTYPES[val[0]]
        return np.frombuffer(bytes.fromhex(val[1]), dtype=dt.newbyteorder("<"))[0].astype(dt)[()]
    if kind == "f":
        return float(val)
    return val


def tree_tensor_paths(node: Any) -> Iterator[str]:
    ((kind, val),) = node.items()
    if kind == "t":
        yield val
    elif kind == "d":
        for v in val.values():
            yield from tree_tensor_paths(v)
    elif kind in "lu":
        for v in val:
            yield from tree_tensor_paths(v)
