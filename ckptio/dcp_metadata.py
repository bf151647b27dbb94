"""What ckptio stores for PyTorch's DCP: torch dtypes by their ckptio names, checkpoint ids
(``<root>/step-<N>``) and the stores they open, and DCP's ``Metadata`` as JSON and back: what
:class:`ckptio.torch.StorageWriter` keeps in the manifest's ``extra`` in place of DCP's pickled
``.metadata``, and :class:`ckptio.torch.StorageReader` rebuilds, checking every field (a
damaged or hostile manifest is a :class:`~ckptio.errors.ManifestError` naming the field, never
a crash; nothing is unpickled)."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import torch
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)

from ckptio import errors
from ckptio import format as fmt
from ckptio import manifest as mf
from ckptio.registry import backend_for, load_backend, open_store, split_url
from ckptio.store import Store

__all__ = [
    "TORCH_DTYPES",
    "dtype_name",
    "metadata_from_json",
    "metadata_to_json",
    "reopen_store",
    "split_checkpoint_url",
    "sync_options",
    "valid_checkpoint_id",
    "want",
]

#: every torch dtype ckptio stores, by its ckptio (numpy) name
TORCH_DTYPES: dict[str, torch.dtype] = {
    "bool": torch.bool,
    "int8": torch.int8,
    "int16": torch.int16,
    "int32": torch.int32,
    "int64": torch.int64,
    "uint8": torch.uint8,
    "uint16": torch.uint16,
    "uint32": torch.uint32,
    "uint64": torch.uint64,
    "float16": torch.float16,
    "float32": torch.float32,
    "float64": torch.float64,
    "complex64": torch.complex64,
    "complex128": torch.complex128,
    "bfloat16": torch.bfloat16,
    "float8_e4m3fn": torch.float8_e4m3fn,
    "float8_e5m2": torch.float8_e5m2,
}
DTYPE_NAMES: dict[torch.dtype, str] = {dt: name for name, dt in TORCH_DTYPES.items()}


def dtype_name(dtype: torch.dtype) -> str:
    """The ckptio (manifest) name of a torch dtype; raises for dtypes ckptio does not store."""
    name = DTYPE_NAMES.get(dtype)
    if name is None:
        raise errors.InvalidArgumentError(
            f"torch dtype {dtype} cannot be checkpointed by ckptio; supported: "
            + ", ".join(str(d) for d in TORCH_DTYPES.values())
        )
    return name


_LAYOUTS = {"strided": torch.strided}
_MEMORY_FORMATS = {
    "contiguous_format": torch.contiguous_format,
    "channels_last": torch.channels_last,
    "preserve_format": torch.preserve_format,
}


def _enum_name(table: Mapping[str, Any], value: Any, what: str) -> str:
    for name, v in table.items():
        if v == value:
            return name
    raise errors.InvalidArgumentError(f"{what} {value} cannot be stored; valid: {', '.join(table)}")


def metadata_to_json(md: Metadata) -> dict[str, Any]:
    entries: dict[str, Any] = {}
    for fqn, sm in md.state_dict_metadata.items():
        if isinstance(sm, BytesStorageMetadata):
            entries[fqn] = {"type": "bytes"}
        elif isinstance(sm, TensorStorageMetadata):
            p = sm.properties
            entries[fqn] = {
                "type": "tensor",
                "dtype": dtype_name(p.dtype),
                "size": list(sm.size),
                "layout": _enum_name(_LAYOUTS, p.layout, "tensor layout"),
                "memory_format": _enum_name(_MEMORY_FORMATS, p.memory_format, "memory format"),
                "requires_grad": bool(p.requires_grad),
                "pin_memory": bool(p.pin_memory),
                "chunks": [[list(c.offsets), list(c.sizes)] for c in sm.chunks],
            }
        else:
            raise errors.InvalidArgumentError(
                f"{fqn}: unknown DCP storage metadata {type(sm).__name__}"
            )
    planner_data: Any = None
    if md.planner_data is not None:
        pd = md.planner_data
        if not (
            isinstance(pd, Mapping)
            and all(
                isinstance(k, str)
                and isinstance(v, tuple | list)
                and all(isinstance(x, str | int) and not isinstance(x, bool) for x in v)
                for k, v in pd.items()
            )
        ):
            raise errors.InvalidArgumentError(
                f"DCP planner_data of type {type(pd).__name__} is not a mapping of fqn -> path; "
                "ckptio stores DCP metadata as JSON (no pickle) and cannot store it"
            )
        planner_data = {k: list(v) for k, v in pd.items()}
    sm_json = None
    if md.storage_meta is not None:
        s = md.storage_meta
        sm_json = {
            "checkpoint_id": None if s.checkpoint_id is None else str(s.checkpoint_id),
            "save_id": s.save_id,
            "load_id": s.load_id,
            "modules": list(s.modules),
        }
    return {
        "version": md.version,
        "state_dict_metadata": entries,
        "planner_data": planner_data,
        "storage_meta": sm_json,
    }


def want(cond: bool, field: str, message: str) -> None:
    if not cond:
        raise errors.ManifestError(message, field=f"extra.dcp.{field}")


def metadata_from_json(doc: Any) -> Metadata:
    """Rebuild DCP's Metadata from its JSON form, validating each field (no pickle)."""
    want(isinstance(doc, dict), "", "expected an object")
    entries = doc.get("state_dict_metadata")
    want(isinstance(entries, dict), "state_dict_metadata", "expected an object")
    sdm: dict[str, Any] = {}
    for fqn, e in entries.items():
        f = f"state_dict_metadata[{fqn!r:.80}]"
        want(isinstance(e, dict), f, "expected an object")
        if e.get("type") == "bytes":
            sdm[fqn] = BytesStorageMetadata()
            continue
        want(
            e.get("type") == "tensor",
            f"{f}.type",
            f"expected 'tensor' or 'bytes', got {e.get('type')!r:.40}",
        )
        want(
            e.get("dtype") in TORCH_DTYPES,
            f"{f}.dtype",
            f"unknown dtype {e.get('dtype')!r:.40}; allowed: {', '.join(TORCH_DTYPES)}",
        )
        want(e.get("layout") in _LAYOUTS, f"{f}.layout", f"unknown layout {e.get('layout')!r:.40}")
        want(
            e.get("memory_format") in _MEMORY_FORMATS,
            f"{f}.memory_format",
            f"unknown memory format {e.get('memory_format')!r:.40}",
        )
        size = mf.int_list(e.get("size"), f"extra.dcp.{f}.size")
        chunks = []
        boxes = []  # DCP loads only the boxes listed: they must tile the tensor, as ckptio's do
        cl = e.get("chunks")
        want(isinstance(cl, list), f"{f}.chunks", "expected a list")
        for i, c in enumerate(cl):
            want(
                isinstance(c, list) and len(c) == 2, f"{f}.chunks[{i}]", "expected [offsets, sizes]"
            )
            offs = mf.int_list(c[0], f"extra.dcp.{f}.chunks[{i}].offsets", len(size))
            sizes = mf.int_list(c[1], f"extra.dcp.{f}.chunks[{i}].sizes", len(size))
            want(
                all(o + n <= full for o, n, full in zip(offs, sizes, size, strict=True)),
                f"{f}.chunks[{i}]",
                f"a box of {list(sizes)} at {list(offs)} does not fit the tensor's size {list(size)}",
            )
            chunks.append(ChunkStorageMetadata(torch.Size(offs), torch.Size(sizes)))
            boxes.append(mf.Chunk(offs, sizes, "", 0, 0, 0))
        covered = sum(math.prod(b.shape) for b in boxes)
        want(
            covered == math.prod(size),
            f"{f}.chunks",
            f"the boxes hold {covered} elements, the tensor {math.prod(size)}",
        )
        mf.check_no_overlap(boxes, f"extra.dcp.{f}.chunks")
        for flag in ("requires_grad", "pin_memory"):
            want(isinstance(e.get(flag, False), bool), f"{f}.{flag}", "expected true or false")
        props = TensorProperties(
            dtype=TORCH_DTYPES[e["dtype"]],
            layout=_LAYOUTS[e["layout"]],
            requires_grad=e.get("requires_grad", False),
            memory_format=_MEMORY_FORMATS[e["memory_format"]],
            pin_memory=e.get("pin_memory", False),
        )
        sdm[fqn] = TensorStorageMetadata(props, torch.Size(size), chunks)
    pd = doc.get("planner_data")
    planner_data = None
    if pd is not None:
        want(isinstance(pd, dict), "planner_data", "expected an object")
        planner_data = {}
        for k, v in pd.items():
            want(
                isinstance(v, list)
                and all(isinstance(x, str | int) and not isinstance(x, bool) for x in v),
                f"planner_data[{k!r:.80}]",
                "expected a list of keys",
            )
            planner_data[k] = tuple(v)
    smd = doc.get("storage_meta")
    storage_meta = None
    if smd is not None:
        want(isinstance(smd, dict), "storage_meta", "expected an object")
        mods = smd.get("modules", [])
        want(
            isinstance(mods, list) and all(isinstance(m, str) for m in mods),
            "storage_meta.modules",
            "expected a list of strings",
        )
        for name in ("checkpoint_id", "save_id", "load_id"):
            value = smd.get(name)
            want(
                value is None or isinstance(value, str),
                f"storage_meta.{name}",
                f"expected a string or null, got {type(value).__name__}",
            )
        storage_meta = StorageMeta(
            checkpoint_id=smd.get("checkpoint_id"),
            save_id=smd.get("save_id"),
            load_id=smd.get("load_id"),
            modules=mods,
        )
    version = doc.get("version")
    want(version is None or isinstance(version, str), "version", "expected a string")
    return Metadata(
        state_dict_metadata=sdm,
        planner_data=planner_data,
        storage_meta=storage_meta,
        version=version,
    )


def split_checkpoint_url(url: str, step: int | None) -> tuple[str, int | None]:
    """``(root_url, step)`` from ``<root>/step-<N>`` or from ``url`` + ``step``; ``(url, None)``
    for a URL that names no step (DCP's "any directory" form)."""
    if step is not None:
        return url, fmt.as_step(step)
    parts = urlsplit(url) if "://" in url else None
    path = parts.path if parts is not None else url
    head, _, last = path.rstrip("/").rpartition("/")
    m = re.fullmatch(r"step-(\d{1,10})", last)
    if m is None:
        return url, None
    if parts is None:
        return head or ".", int(m.group(1))
    return urlunsplit((parts.scheme, parts.netloc, head, parts.query, "")), int(m.group(1))


def valid_checkpoint_id(checkpoint_id: Any) -> bool:
    """Whether ``checkpoint_id`` is a URL (or path) of a scheme ckptio serves, with or
    without a step (DCP's ``validate_checkpoint_id``)."""
    try:
        root, _ = split_checkpoint_url(str(checkpoint_id), None)
        load_backend(split_url(root)[0])
    except (errors.CkptioError, ValueError):
        return False
    return True


def reopen_store(
    store: Store | None, old_root: str | None, root: str, options: Mapping[str, Any]
) -> Store:
    """The store for ``root``: the current one if the root is unchanged (a ``checkpoint_id``
    naming another step of the same run), else a new one (the old one is closed)."""
    if store is not None and old_root == root:
        return store
    if store is not None:
        store.close()
    return open_store(root, **options)


def sync_options(options: Mapping[str, Any], root: str, sync_files: bool) -> dict[str, Any]:
    """``options`` for the store at ``root``; without ``sync_files``, the store's switch
    that skips durable flushes set off (:attr:`~ckptio.registry.BackendInfo.flush_option`), where it
    has one and it is not given."""
    out = dict(options)
    flush = backend_for(root).flush_option
    if not sync_files and flush is not None:
        out.setdefault(flush, False)
    return out
