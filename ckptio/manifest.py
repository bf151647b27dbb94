"""The manifest: its fields (:class:`Manifest`, :class:`TensorEntry`, :class:`Chunk`), its one
serializer (:meth:`Manifest.to_json`, which every commit goes through: ``save``, the
Checkpointer, the DCP writer, tiered drains and the runner, by way of
:func:`encode_manifest`), and its parser (:func:`parse_manifest`), which validates everything
before it is used. The layout around it (step directories, keys, dtypes, limits, the state
tree) is :mod:`ckptio.format`'s.
"""

from __future__ import annotations

import dataclasses
import gc
import itertools
import json
import math
import operator
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Annotated, Any

import msgspec
import numpy as np

from ckptio import errors
from ckptio.format import (
    DTYPES,
    FORMAT_NAME,
    FORMAT_VERSION,
    FREE_VALUES_PER_TENSOR_BYTE,
    MAX_DEPTH,
    MAX_DIMS,
    MAX_FREE_VALUES,
    MAX_MANIFEST_BYTES,
    MAX_METADATA_BYTES,
    MAX_STEP,
    MAX_TENSOR_BYTES,
    NODE_KINDS,
    step_dir,
)
from ckptio.store import check_key

__all__ = [
    "Chunk",
    "Manifest",
    "TensorEntry",
    "chunks_of",
    "encode_manifest",
    "json_values",
    "metadata_problem",
    "parse_manifest",
]


_MAX_INT = 1 << 62
"""The largest offset, extent or length a manifest may hold: a sum of two fits an int64, so
the bulk checks (numpy) stay exact."""
_U62 = Annotated[int, msgspec.Meta(ge=0, le=_MAX_INT)]
_DIMS = Annotated[tuple[_U62, ...], msgspec.Meta(max_length=MAX_DIMS)]
_U32 = Annotated[int, msgspec.Meta(ge=0, le=0xFFFFFFFF)]
# Chunks and tensor entries are msgspec structs: their annotations are the manifest's type and
# range checks, which msgspec applies at C speed as it builds them (see _decode_fast).


class Chunk(msgspec.Struct, frozen=True, gc=False, forbid_unknown_fields=True):
    """One stored piece of a tensor: a box of the global tensor, stored contiguously
    (C order) at ``offset`` in object ``key``."""

    offsets: _DIMS
    """Start of the box in each dimension of the global tensor."""
    shape: _DIMS
    """Extent of the box in each dimension."""
    key: str
    """Object key, relative to the step directory (``data/rank-00000-000.bin``)."""
    offset: _U62
    """Byte offset of the chunk inside the object (a multiple of :data:`ALIGNMENT`)."""
    length: _U62
    """Bytes: ``prod(shape) * itemsize``."""
    crc32c: _U32
    """CRC32C (Castagnoli) of the chunk's bytes."""

    def as_json(self) -> dict[str, Any]:
        return {
            "offsets": list(self.offsets),
            "shape": list(self.shape),
            "key": self.key,
            "offset": self.offset,
            "length": self.length,
            "crc32c": self.crc32c,
        }


class TensorEntry(msgspec.Struct, frozen=True, gc=False, forbid_unknown_fields=True):
    dtype: str
    shape: _DIMS
    chunks: tuple[Chunk, ...]

    @property
    def np_dtype(self) -> np.dtype[Any]:
        return DTYPES[self.dtype]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.np_dtype.itemsize


@dataclass(frozen=True, slots=True)
class Manifest:
    step: int
    world_size: int
    tensors: Mapping[str, TensorEntry]
    """Tensor path (JSON-pointer-like, ``model/layers/0/w``) -> entry."""
    objects: Mapping[str, int]
    """Object key (relative to the step directory) -> size in bytes."""
    tree: Any
    """The state's structure, leaves encoded (see :func:`encode_tree`)."""
    metadata: Any = None
    """The user's JSON metadata."""
    layout: Mapping[str, Any] = field(default_factory=dict)
    """How the data was laid out: ``{"kind": "file-per-shard", "key_layout": "flat", ...}``."""
    created: str = ""
    """UTC time of the commit, ISO 8601."""
    extra: Mapping[str, Any] = field(default_factory=dict)
    """Opaque fields of integrations (e.g. the PyTorch DCP plan), JSON only."""

    @property
    def nbytes(self) -> int:
        return sum(self.objects.values())

    def to_json(self) -> bytes:
        """Compact JSON, UTF-8 unescaped. The tensor entries (nearly all of a large manifest)
        are encoded by msgspec from the structs, not through dicts and json (the slower way); the
        values of free form (tree, metadata, layout, extra) by json, which refuses NaN
        (msgspec would write ``null``). A lone surrogate in a string, which UTF-8 cannot hold,
        makes it all json's, escaped to ASCII."""
        doc = {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "step": self.step,
            "world_size": self.world_size,
            "created": self.created,
            "layout": dict(self.layout),
            "metadata": self.metadata,
            "objects": dict(self.objects),
            "tensors": self.tensors,
            "tree": self.tree,
            "extra": dict(self.extra),
        }
        free = ("layout", "metadata", "tree", "extra")
        try:
            return msgspec.json.encode(
                {
                    k: msgspec.Raw(_json(v, ascii_only=False)) if k in free else v
                    for k, v in doc.items()
                }
            )
        except UnicodeEncodeError:
            return _json(msgspec.to_builtins(doc), ascii_only=True)


def _json(value: Any, *, ascii_only: bool) -> bytes:
    return json.dumps(
        value, allow_nan=False, ensure_ascii=ascii_only, separators=(",", ":")
    ).encode()


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)  # C speed; the slow search below runs only when a key repeats
    if len(out) != len(pairs):
        seen: set[str] = set()
        for k, _ in pairs:
            if k in seen:
                raise errors.ManifestError(f"duplicate key {k!r} in a JSON object", field=k)
            seen.add(k)
    return out


def _reject_constant(name: str) -> Any:
    raise errors.ManifestError(f"non-standard JSON constant {name}")


def chunks_of(chunks: Sequence[Mapping[str, Any]]) -> tuple[Chunk, ...]:
    """The :class:`Chunk` structs of chunk records as writers report them (``offsets``,
    ``shape``, ``key``, ``offset``, ``length``, ``crc32c``), in the order of their offsets."""
    return msgspec.convert(sorted(chunks, key=_RECORD_OFFSETS), tuple[Chunk, ...])


_RECORD_OFFSETS = operator.itemgetter("offsets")


def encode_manifest(manifest: Manifest) -> bytes:
    """The bytes to publish for ``manifest``: the one serializer of the manifest (its
    ``created`` time stamped now if empty), and the result validated exactly as a reader will
    validate it (:func:`parse_manifest`), so a commit never publishes a manifest that load would
    refuse. Every writer of a manifest comes here (:func:`ckptio.checkpoint.commit.build_manifest`
    for ``save``, the Checkpointer, tiered saves and the runner; the DCP writer; a tiered drain
    publishes the fast tier's bytes as they are)."""
    if not manifest.created:
        now = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        manifest = dataclasses.replace(manifest, created=now)
    data = manifest.to_json()
    parse_manifest(data, expect_step=manifest.step)
    return data


def parse_manifest(data: bytes, *, expect_step: int | None = None) -> Manifest:
    """Decode and validate a manifest; raise :class:`ManifestError` naming the bad field.

    The cyclic garbage collector is paused meanwhile: a manifest is millions of small
    acyclic objects, and the collections their creation triggers would add to the time for
    nothing (the ``manifest-100k`` case of ``benchmarks/run.py`` times this parse)."""
    paused = gc.isenabled()
    gc.disable()
    try:
        return _parse_manifest(data, expect_step)
    finally:
        if paused:
            gc.enable()


def _parse_manifest(data: bytes, expect_step: int | None) -> Manifest:
    if len(data) > MAX_MANIFEST_BYTES:
        raise errors.ManifestError(f"manifest is {len(data)} bytes, more than {MAX_MANIFEST_BYTES}")
    if not data.isascii():  # (ASCII is UTF-8; the check allocates nothing)
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as err:
            raise errors.ManifestError(f"manifest is not valid UTF-8 ({err})") from None
    fast = _decode_fast(data)
    if fast is not None:
        manifest = _validate(fast[0], expect_step, fast[1])
        if manifest is not None:
            return manifest
    # json's decoding, for the per-field checks that find a bad field and name it; bounded
    # first, for json builds every value of the text
    _bound_json(data)
    manifest = _validate(_decode(data.decode("utf-8")), expect_step)
    assert manifest is not None
    return manifest


def _decode(text: str) -> Any:
    """JSON as the format reads it: duplicate keys and non-standard constants refused."""
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_reject_constant)
    except errors.ManifestError:
        raise  # a duplicate key or a non-standard constant, named by the hooks
    except RecursionError:
        raise errors.ManifestError("manifest JSON is nested too deeply") from None
    except ValueError as err:  # JSONDecodeError, and integers of more than 4300 digits
        raise errors.ManifestError(f"manifest is not valid JSON ({err})") from None


def _decode_fast(data: bytes) -> tuple[dict[str, Any], dict[str, TensorEntry]] | None:
    """The manifest decoded in one pass, faster than by :func:`_decode` and msgspec.convert
    (the ``manifest-100k`` case of ``benchmarks/run.py`` times it), where it is as ckptio
    writes it: msgspec builds the tensor entries straight from the JSON, checking every field's type
    and range, and the other top-level values are decoded by :func:`_decode`.

    msgspec keeps the last of duplicate keys, which the format refuses (msgspec/msgspec#648),
    so the keys are counted: the JSON's (:func:`_key_count`) must equal those decoded, or a
    key was repeated. Returns the other values and the entries, or None for json's decoding:
    where anything is off, or the text has escapes or whitespace after a string."""
    if b"\\" in data:
        return None
    try:
        top = _TOP_DECODER.decode(data)
        data_tensors = top.pop("tensors")
        entries = _TENSORS_DECODER.decode(data_tensors)
    except (msgspec.DecodeError, KeyError):  # ValidationError is a DecodeError
        return None
    counts = [_key_count(data), *map(_key_count, top.values())]
    if None in counts:
        return None
    chunks = sum(map(len, map(_CHUNKS, entries.values())))
    decoded = (
        len(top)
        + 1
        + len(entries) * (1 + len(TensorEntry.__struct_fields__))
        + chunks * len(Chunk.__struct_fields__)
    )
    if counts[0] != decoded + sum(c or 0 for c in counts[1:]):
        return None  # a repeated key: json's decoding names it
    # no key repeats, so ``top`` is all of the text besides the tensor table
    _check_free_values(top, sum(map(json_values, top.values())), len(data_tensors))
    return {k: _decode(bytes(v).decode("utf-8")) for k, v in top.items()}, entries


_JSON_ERROR_BYTES = 1 << 20
"""An invalid manifest up to this size is decoded by json for its error message (json builds
the values before the error: at most ~28x this); a larger one gets msgspec's message."""
_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def _bound_json(data: bytes) -> None:
    """Refuse, before json decodes it, a text whose values besides the tensor table hold more
    than :func:`_check_free_values` allows. Counted on the whole text, so values of a
    repeated key (which msgspec drops) count too."""
    try:
        top = _TOP_DECODER.decode(data)
    except msgspec.DecodeError as err:
        # lone surrogates (``"\\ud800"``, which json reads and msgspec refuses) are masked
        # with escapes of the same length: the structure, all that is counted, is unchanged
        try:
            data = _SURROGATE.sub(rb"\\u0041", data) if b"\\u" in data else data
            top = _TOP_DECODER.decode(data)
        except msgspec.DecodeError:
            if len(data) > _JSON_ERROR_BYTES:
                raise errors.ManifestError(f"manifest is not a valid JSON object ({err})") from None
            return  # json's decoding fails on it, naming the problem
    tensors = top.pop("tensors", b"")
    _check_free_values(top, json_values(data) - json_values(tensors) + 1, len(tensors))


def metadata_problem(raw: Any) -> str | None:
    """What makes ``raw`` (the JSON of a manifest's ``metadata``) too large, or None: more
    than :data:`MAX_METADATA_BYTES` or :data:`MAX_FREE_VALUES`. Checked by saves and loads."""
    if len(raw) > MAX_METADATA_BYTES:
        return f"{len(raw)} bytes of JSON, more than the limit of {MAX_METADATA_BYTES}"
    n = json_values(raw)
    if n > MAX_FREE_VALUES:
        return f"holds {n} JSON values and keys, more than the limit of {MAX_FREE_VALUES}"
    return None


def _check_free_values(top: Mapping[str, Any], free: int, tensor_bytes: int) -> None:
    """Raise unless ``metadata`` (raw JSON in ``top``) is within :data:`MAX_METADATA_BYTES`
    and :data:`MAX_FREE_VALUES`, and the ``free`` values of the text besides the tensor table
    within the allowance of ``tensor_bytes`` bytes of table."""
    metadata = top.get("metadata")
    problem = None if metadata is None else metadata_problem(metadata)
    _want(problem is None, "metadata", str(problem))
    allowed = MAX_FREE_VALUES + int(tensor_bytes * FREE_VALUES_PER_TENSOR_BYTE)
    _want(
        free <= allowed,
        "$",
        f"the values besides the tensor table (tree, objects, metadata, extra, ...) hold {free} JSON values "
        f"and keys, more than the {allowed} allowed with {tensor_bytes} bytes of tensor table",
    )


def json_values(text: Any) -> int:
    """An upper bound of the values and keys in a JSON text: one plus its ``[ { , :`` outside
    strings (each value or key but the first of a container follows one). Counted 1 MiB at a
    time; a block with escapes is counted on a copy without them (so that quotes alternate)."""
    a = np.frombuffer(text, np.uint8)
    count, start = 1, 0
    parity = np.uint8(0)  # 1 inside a string
    while start < len(a):
        stop = min(start + _COUNT_BLOCK, len(a))
        block = a[start:stop]
        if (block == ord("\\")).any():
            raw = block.tobytes()
            if (len(raw) - len(raw.rstrip(b"\\"))) % 2 and stop < len(a):
                stop += 1  # the block ends inside an escape: take its second byte too
                raw = a[start:stop].tobytes()
            block = np.frombuffer(_ESCAPE.sub(b"", raw), np.uint8)
        start = stop
        if not len(block):
            continue
        inside = np.cumsum(block == ord('"'), dtype=np.uint8)  # wraps at 256: the parity stays
        inside += parity
        inside &= 1
        count += int(np.count_nonzero(_STRUCTURAL[block] > inside))
        parity = inside[-1]
    return count


_ESCAPE = re.compile(rb"\\.", re.DOTALL)


def _key_count(text: Any) -> int | None:
    """The keys in a JSON text without escapes: the strings followed by ``:`` (with no
    escapes, quotes alternate between opening and closing a string). None where a string is
    followed by anything but ``: , ] }`` (whitespace), which this count cannot tell apart.

    Counted 1 MiB at a time: numpy advises arrays of 4 MiB and more to transparent huge
    pages, whose first touch (zeroing, compaction) can cost more than the count itself; the
    temporaries of 1 MiB blocks stay below that and their memory is reused from block to
    block."""
    a = np.frombuffer(text, np.uint8)
    keys = quotes = 0
    for start in range(0, len(a), _COUNT_BLOCK):
        at = np.flatnonzero(a[start : start + _COUNT_BLOCK] == ord('"')) + start
        ends = at[(quotes + 1) % 2 :: 2] + 1  # the closing quotes: odd in the whole text
        quotes += len(at)
        after = a[ends[ends < len(a)]]  # a text that is a string ends with its closing quote
        if not _AFTER_STRING[after].all():
            return None
        keys += int(np.count_nonzero(after == ord(":")))
    return keys


_COUNT_BLOCK = 1 << 20
_AFTER_STRING = np.zeros(256, bool)
_AFTER_STRING[list(b":,]}")] = True
_STRUCTURAL = np.zeros(256, np.uint8)
_STRUCTURAL[list(b"[{,:")] = 1
_TOP_DECODER = msgspec.json.Decoder(dict[str, msgspec.Raw])
_TENSORS_DECODER = msgspec.json.Decoder(dict[str, TensorEntry])


def _want(cond: bool, field: str, message: str) -> None:
    if not cond:
        raise errors.ManifestError(message, field=field)


def _int(v: Any, field: str, lo: int = 0, hi: int = _MAX_INT) -> int:
    _want(
        isinstance(v, int) and not isinstance(v, bool), field, f"expected an integer, got {v!r:.80}"
    )
    _want(lo <= v <= hi, field, f"{v} is out of range [{lo}, {hi}]")
    return int(v)


def int_list(v: Any, field: str, n: int | None = None) -> tuple[int, ...]:
    _want(isinstance(v, list), field, f"expected a list of integers, got {type(v).__name__}")
    _want(len(v) <= MAX_DIMS, field, f"{len(v)} dimensions, more than {MAX_DIMS}")
    if n is not None:
        _want(len(v) == n, field, f"expected {n} dimensions, got {len(v)}")
    return tuple(_int(x, f"{field}[{i}]") for i, x in enumerate(v))


def _validate(
    doc: Any, expect_step: int | None, entries: dict[str, TensorEntry] | None = None
) -> Manifest | None:
    """The checks of a decoded manifest. ``entries``: the tensors as :func:`_decode_fast`
    built them (else they are in ``doc``); None is returned if their checks fail."""
    _want(isinstance(doc, dict), "$", "manifest is not a JSON object")
    _want(
        doc.get("format") == FORMAT_NAME,
        "format",
        f"expected {FORMAT_NAME!r}, got {doc.get('format')!r:.80}",
    )
    version = _int(doc.get("version"), "version")
    _want(
        version == FORMAT_VERSION,
        "version",
        f"unsupported format version {version}; this ckptio reads {FORMAT_VERSION}",
    )
    step = _int(doc.get("step"), "step", 0, MAX_STEP)
    if expect_step is not None:
        _want(
            step == expect_step,
            "step",
            f"manifest says step {step} but lies in {step_dir(expect_step)}",
        )
    world = _int(doc.get("world_size"), "world_size", 1, 1 << 24)

    objects_doc = doc.get("objects")
    _want(isinstance(objects_doc, dict), "objects", "expected an object of key -> size")
    objects: dict[str, int] = {}
    for key, size in objects_doc.items():
        f = f"objects[{key!r:.80}]"
        _want(
            _safe_key(key),
            f,
            "object key must be a relative key under the step directory (no '..', no absolute path)",
        )
        objects[key] = _int(size, f, 0, 1 << 50)

    if entries is not None:
        tensors = _tensors_checked(entries, objects)
        if tensors is None:
            return None  # the caller checks json's decoding field by field
    else:
        tensors_doc = doc.get("tensors")
        _want(isinstance(tensors_doc, dict), "tensors", "expected an object of path -> tensor")
        try:
            tensors = _tensors_checked(
                msgspec.convert(tensors_doc, dict[str, TensorEntry]), objects
            )
        except msgspec.ValidationError:
            tensors = None
        if tensors is None:  # something is off: the per-field checks find it and name the field
            tensors = {path: _validate_tensor(path, t, objects) for path, t in tensors_doc.items()}
            _check_byte_ranges(tensors)
    tree = doc.get("tree")
    _check_tree(tree, tensors, "tree", 0)
    layout = doc.get("layout", {})
    _want(isinstance(layout, dict), "layout", "expected an object")
    extra = doc.get("extra", {})
    _want(isinstance(extra, dict), "extra", "expected an object")
    created = doc.get("created", "")
    _want(isinstance(created, str), "created", "expected a string")
    return Manifest(
        step=step,
        world_size=world,
        tensors=tensors,
        objects=objects,
        tree=tree,
        metadata=doc.get("metadata"),
        layout=layout,
        created=created,
        extra=extra,
    )


def _check_byte_ranges(tensors: Mapping[str, TensorEntry]) -> None:
    """No two chunks share bytes of an object. With each chunk inside its object, the
    tensors' total size is then at most the objects' total, which a reader confirms against
    the storage before allocating: a small manifest cannot make a reader allocate terabytes
    by pointing many chunks at the same bytes."""
    every = list(itertools.chain.from_iterable(t.chunks for t in tensors.values()))
    codes: dict[str, int] = {}  # a number per object key (the first chunk's index), at C speed
    keys = np.fromiter(
        map(codes.setdefault, map(_KEY, every), itertools.count()), np.int64, len(every)
    )
    starts = np.fromiter(map(_OFFSET, every), np.int64, len(every))
    lengths = np.fromiter(map(_LENGTH, every), np.int64, len(every))
    if not _ranges_clash(keys, starts, lengths):
        return
    spans = sorted(
        (c.key, c.offset, c.offset + c.length, path)
        for path, t in tensors.items()
        for c in t.chunks
        if c.length
    )
    for a, b in itertools.pairwise(spans):
        if a[0] == b[0] and a[2] > b[1]:
            raise errors.ManifestError(
                f"chunks of {a[3]!r:.80} and {b[3]!r:.80} share bytes {b[1]}..{min(a[2], b[2])} of {a[0]!r:.80}",
                field="tensors",
            )


def _ranges_clash(keys: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> bool:
    """Whether two byte ranges (object number, start, length; each inside its object, so no
    sum overflows) share a byte: one sort, then neighbours compared."""
    if len(keys) < 2:
        return False
    held = lengths > 0  # empty chunks hold no bytes
    keys, starts, ends = keys[held], starts[held], starts[held] + lengths[held]
    order = np.lexsort((ends, starts, keys))
    keys, starts, ends = keys[order], starts[order], ends[order]
    return bool(((keys[:-1] == keys[1:]) & (ends[:-1] > starts[1:])).any())


_KEY, _OFFSET, _LENGTH = (operator.attrgetter(f) for f in ("key", "offset", "length"))


def _safe_key(key: Any) -> bool:
    if not isinstance(key, str) or not key.startswith("data/"):
        return False
    try:
        check_key(key)
    except errors.InvalidArgumentError:
        return False
    return True


def _validate_tensor(path: str, t: Any, objects: Mapping[str, int]) -> TensorEntry:
    """One tensor's entry, checked field by field (the path that names a bad field)."""
    base = f"tensors[{path!r:.80}]"
    _want(isinstance(t, dict), base, "expected an object")
    dt = t.get("dtype")
    _want(
        isinstance(dt, str) and dt in DTYPES,
        f"{base}.dtype",
        f"unknown dtype {dt!r:.40}; allowed: {', '.join(DTYPES)}",
    )
    itemsize = DTYPES[dt].itemsize
    shape = int_list(t.get("shape"), f"{base}.shape")
    volume = math.prod(shape)
    _want(
        volume * itemsize <= MAX_TENSOR_BYTES,
        f"{base}.shape",
        f"declares {volume * itemsize} bytes, more than the {MAX_TENSOR_BYTES}-byte limit",
    )
    chunks_doc = t.get("chunks")
    _want(isinstance(chunks_doc, list), f"{base}.chunks", "expected a list")
    chunks = []
    covered = 0
    for i, c in enumerate(chunks_doc):
        f = f"{base}.chunks[{i}]"
        _want(isinstance(c, dict), f, "expected an object")
        offs = int_list(c.get("offsets"), f"{f}.offsets", len(shape))
        cshape = int_list(c.get("shape"), f"{f}.shape", len(shape))
        for d, (o, n, full) in enumerate(zip(offs, cshape, shape, strict=True)):
            _want(
                o + n <= full, f"{f}.shape", f"dimension {d}: {o}+{n} exceeds the tensor's {full}"
            )
        key = c.get("key")
        _want(
            _safe_key(key), f"{f}.key", f"{key!r:.80} is not a key under the step's data/ directory"
        )
        _want(key in objects, f"{f}.key", f"{key!r:.80} is not listed in objects")
        offset = _int(c.get("offset"), f"{f}.offset")
        length = _int(c.get("length"), f"{f}.length")
        _want(
            length == math.prod(cshape) * itemsize,
            f"{f}.length",
            f"{length} bytes disagrees with shape {list(cshape)} of {dt} ({math.prod(cshape) * itemsize} bytes)",
        )
        _want(
            offset + length <= objects[key],
            f"{f}.offset",
            f"bytes {offset}..{offset + length} lie past the end of {key} ({objects[key]} bytes)",
        )
        crc = _int(c.get("crc32c"), f"{f}.crc32c", 0, 0xFFFFFFFF)
        covered += math.prod(cshape)
        chunks.append(Chunk(offs, cshape, key, offset, length, crc))
    _want(
        covered == volume,
        f"{base}.chunks",
        f"chunks hold {covered} elements but the shape has {volume}",
    )
    check_no_overlap(chunks, f"{base}.chunks")
    return TensorEntry(dt, shape, tuple(chunks))


def _tensors_checked(
    tensors: dict[str, TensorEntry], objects: Mapping[str, int]
) -> dict[str, TensorEntry] | None:
    """The rest of the checks of :func:`_validate_tensor` and :func:`_check_byte_ranges`, in
    bulk, on entries msgspec built (so every field's type and range is checked): those
    across fields, on numpy columns of all chunks at once.

    Returns the entries, or None when anything is off: the caller then runs the per-field
    checks, which find and name the bad field. Accepts only what those checks accept (it
    may refuse more, in cases no writer produces: the per-field checks then decide)."""
    by_nd: dict[int, list[TensorEntry]] = {}
    for t in tensors.values():
        if (
            t.dtype not in DTYPES
            or math.prod(t.shape) * DTYPES[t.dtype].itemsize > MAX_TENSOR_BYTES
        ):
            return None
        if math.prod(max(n, 1) for n in t.shape) > _MAX_INT:
            return None  # a chunk's product of extents might not fit an int64 (only with empty dimensions)
        by_nd.setdefault(len(t.shape), []).append(t)
    number = {key: i for i, key in enumerate(objects)}
    sizes = np.fromiter(objects.values(), np.int64, len(objects))
    columns = []  # (object numbers, starts, lengths) of each group
    for nd, group in by_nd.items():
        checked = _chunks_checked(nd, group, number, sizes)
        if checked is None:
            return None
        columns.append(checked)
    if columns and _ranges_clash(*(np.concatenate(c) for c in zip(*columns, strict=True))):
        return None
    return tensors


def _chunks_checked(
    nd: int, group: list[TensorEntry], number: Mapping[str, int], sizes: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """The checks across fields of the chunks of tensors of ``nd`` dimensions, whose fields'
    types and ranges msgspec has checked (so every sum below fits an int64). Returns the
    chunks' object numbers, starts and lengths for the byte-range check, or None."""
    chunks = list(itertools.chain.from_iterable(map(_CHUNKS, group)))
    n, counts = len(chunks), np.fromiter(map(len, map(_CHUNKS, group)), np.int64, len(group))
    offs_col, shape_col = list(map(_OFFSETS, chunks)), list(map(_SHAPE, chunks))
    if n and set(map(len, offs_col)) | set(map(len, shape_col)) != {nd}:
        return None
    offs = np.fromiter(itertools.chain.from_iterable(offs_col), np.int64, n * nd).reshape(n, nd)
    ext = np.fromiter(itertools.chain.from_iterable(shape_col), np.int64, n * nd).reshape(n, nd)
    full = np.repeat(
        np.array([t.shape for t in group], np.int64).reshape(len(group), nd), counts, axis=0
    )
    if not ((ext <= full) & (offs <= full - ext)).all():
        return None
    elements = ext.prod(axis=1)  # at most the tensor's volume (checked by the caller)
    itemsizes = np.repeat(
        np.fromiter((DTYPES[t.dtype].itemsize for t in group), np.int64, len(group)), counts
    )
    lengths = np.fromiter(map(_LENGTH, chunks), np.int64, n)
    if not (lengths == elements * itemsizes).all():
        return None
    try:
        keys = np.fromiter(map(number.__getitem__, map(_KEY, chunks)), np.int64, n)
    except KeyError:
        return None  # a key not listed in objects (whose keys are checked to be safe)
    starts = np.fromiter(map(_OFFSET, chunks), np.int64, n)
    if not (starts <= sizes[keys] - lengths).all():
        return None
    # the chunks cover each tensor's volume (summed exactly: the float sum bounds the int64 ones)
    if float(elements.sum(dtype=np.float64)) >= 2.0**62:
        return None
    first = np.cumsum(counts) - counts
    some = counts > 0
    covered = np.zeros(len(group), np.int64)
    if n:
        covered[some] = np.add.reduceat(elements, first[some])
    volumes = np.fromiter((math.prod(t.shape) for t in group), np.int64, len(group))
    if not (covered == volumes).all():
        return None
    # ... and do not overlap. The usual split is along one dimension: sort the chunks on it
    # and compare neighbours, as _check_no_overlap does, for all such tensors at once.
    if nd and n:
        varies = np.zeros((len(group), nd), bool)
        varies[some] = np.logical_or.reduceat(
            offs != offs[np.repeat(first, counts)], first[some], axis=0
        )
        split = varies.sum(axis=1)
        for i in np.flatnonzero((split != 1) & (counts > 1)):  # other tilings: one by one
            try:
                check_no_overlap(group[i].chunks, "")
            except errors.ManifestError:
                return None
        tensor = np.repeat(np.arange(len(group)), counts)
        mine = np.flatnonzero(((split == 1) & (counts > 1))[tensor])
        dim = varies.argmax(axis=1)[tensor[mine]]
        lo, hi, owner = offs[mine, dim], offs[mine, dim] + ext[mine, dim], tensor[mine]
        order = np.lexsort((mine, lo, owner))  # the stable order of sorted(), as the slow check
        lo, hi, owner = lo[order], hi[order], owner[order]
        if ((owner[:-1] == owner[1:]) & (hi[:-1] > lo[1:])).any():
            return None
    return keys, starts, lengths


_CHUNKS, _OFFSETS, _SHAPE = (operator.attrgetter(f) for f in ("chunks", "offsets", "shape"))


def check_no_overlap(chunks: Sequence[Chunk], field: str) -> None:
    """With the volume check above, no overlap means the chunks tile the tensor exactly."""
    if len(chunks) < 2:
        return
    # the common case: a split along one dimension, found by sorting on that dimension
    ordered = sorted(chunks, key=lambda c: c.offsets)
    nd = len(chunks[0].shape)
    split = [d for d in range(nd) if len({c.offsets[d] for c in chunks}) > 1]
    if len(split) == 1:
        d = split[0]
        for a, b in itertools.pairwise(ordered):
            _want(
                a.offsets[d] + a.shape[d] <= b.offsets[d],
                field,
                f"chunks at {list(a.offsets)} and {list(b.offsets)} overlap",
            )
        return
    if len(chunks) > 4096:
        # general N-D tilings this large are not produced by ckptio; refuse rather than spend
        # quadratic time (the volume check already holds)
        raise errors.ManifestError(
            f"{len(chunks)} chunks split along several dimensions", field=field
        )
    for i, a in enumerate(ordered):
        for b in ordered[i + 1 :]:
            if all(
                a.offsets[k] < b.offsets[k] + b.shape[k]
                and b.offsets[k] < a.offsets[k] + a.shape[k]
                for k in range(nd)
            ):
                raise errors.ManifestError(
                    f"chunks at {list(a.offsets)} and {list(b.offsets)} overlap", field=field
                )


def _check_tree(node: Any, tensors: Mapping[str, TensorEntry], field: str, depth: int) -> None:
    _want(depth <= MAX_DEPTH, field, f"state nested deeper than {MAX_DEPTH} levels")
    _want(
        isinstance(node, dict) and len(node) == 1 and next(iter(node)) in NODE_KINDS,
        field,
        "not a valid tree node",
    )
    ((kind, val),) = node.items()
    if kind == "d":
        _want(isinstance(val, dict), field, "expected an object")
        for k, v in val.items():
            _check_tree(v, tensors, f"{field}.{k}", depth + 1)
    elif kind in "lu":
        _want(isinstance(val, list), field, "expected a list")
        for i, v in enumerate(val):
            _check_tree(v, tensors, f"{field}[{i}]", depth + 1)
    elif kind == "t":
        _want(
            isinstance(val, str) and val in tensors, field, f"tensor {val!r:.80} is not in tensors"
        )
    elif kind == "s":
        _want(
            isinstance(val, list)
            and len(val) == 2
            and isinstance(val[0], str)
            and val[0] in DTYPES
            and isinstance(val[1], str),
            field,
            "bad scalar",
        )
        try:
            raw = bytes.fromhex(val[1])
        except ValueError:
            raise errors.ManifestError("scalar bytes are not hex", field=field) from None
        _want(
            len(raw) == DTYPES[val[0]].itemsize,
            field,
            "scalar byte length disagrees with its dtype",
        )
    elif kind == "v":
        _want(
            val is None or isinstance(val, bool | int | float | str),
            field,
            "expected a JSON scalar",
        )
    elif kind == "f":
        _want(val in ("nan", "inf", "-inf"), field, "bad float constant")
