"""PyTorch: tensors in ckptio checkpoints, and ckptio as a ``torch.distributed.checkpoint``
storage layer.

Tensors in ``ckptio.save`` / ``ckptio.load`` (no pickle anywhere)::

    ckptio.save({"model": model.state_dict()}, "s3://bucket/run", step=100)   # numpy inside
    from ckptio import torch as ct
    state = ct.load("s3://bucket/run", device="cpu")     # ckptio's loader: torch tensors, no pickle

    # optimizer state dicts have integer keys; encode() makes them storable, load() undoes it
    with ckptio.torch.Checkpointer("file:///ckpt/run", async_save=True) as ck:
        ck.save({"model": model.state_dict(), "optim": opt.state_dict()}, step=100)

- CPU tensors of every dtype ckptio stores (``ckptio.format.DTYPES``: bool, (u)int8..64,
  float16/32/64, complex64/128, bfloat16, float8_e4m3fn, float8_e5m2) become numpy arrays
  *without a copy* (:func:`to_numpy`); bfloat16 and float8 go through a same-size integer view
  because numpy has no such dtypes of its own (ml_dtypes supplies them).
- CUDA tensors are staged through pinned (page-locked) host memory: one
  ``torch.empty(..., pin_memory=True)`` per tensor, ``copy_(non_blocking=True)``, then the
  device's current stream is synchronised before the array is used. Other accelerators use a
  plain blocking ``.cpu()``.
- ``encode`` / ``decode``: dicts with integer keys (``optimizer.state_dict()["state"]``) are
  stored as ``{"__ckptio_items__": [[key, value], ...]}`` and restored on load.

``torch.distributed.checkpoint`` over any ckptio store: :class:`StorageWriter` and
:class:`StorageReader` (see their docstrings)::

    dcp.save(state_dict, storage_writer=StorageWriter("s3://bucket/run/step-100"))
    dcp.load(state_dict, storage_reader=StorageReader("s3://bucket/run/step-100", allow_pickle=True))
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import logging
import os
import secrets
import uuid
import warnings
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.distributed.checkpoint import storage as _dcp_storage
from torch.distributed.checkpoint.metadata import (
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    LoadPlanner,
    SavePlan,
    SavePlanner,
    WriteItemType,
)
from torch.distributed.checkpoint.staging import BlockingAsyncStager
from torch.futures import Future

from ckptio import checkpoint as _ck
from ckptio import errors
from ckptio import format as fmt
from ckptio import manifest as mf
from ckptio.arrays import Target, contiguous_le
from ckptio.checkpoint.facade import refuse_load_options
from ckptio.checkpoint.write import RankWriter, WriteOptions
from ckptio.checkpoint.write import SavePlan as CkptioPlan
from ckptio.dcp_metadata import (
    dtype_name,
    metadata_from_json,
    metadata_to_json,
    reopen_store,
    split_checkpoint_url,
    sync_options,
    valid_checkpoint_id,
    want,
)
from ckptio.lease import RETIRE_GRACE_SECONDS, SaveLease
from ckptio.registry import open_store
from ckptio.store import Store, option_int
from ckptio.units import parse_size

log = logging.getLogger(__name__)

__all__ = [
    "Checkpointer",
    "StorageReader",
    "StorageWriter",
    "TorchCodec",
    "convert_dcp",
    "decode",
    "encode",
    "from_numpy",
    "load",
    "save",
    "to_numpy",
    "to_torch",
]

# -- tensors <-> numpy ------------------------------------------------------------------------

#: torch dtypes numpy cannot hold natively -> (same-size integer torch dtype, ml_dtypes name).
#: By name, so that ml_dtypes (slow to import) is imported only for a tensor of such a dtype.
_VIEWED: dict[torch.dtype, tuple[torch.dtype, str]] = {
    torch.bfloat16: (torch.int16, "bfloat16"),
    torch.float8_e4m3fn: (torch.uint8, "float8_e4m3fn"),
    torch.float8_e5m2: (torch.uint8, "float8_e5m2"),
}
#: ml_dtypes name -> (same-size integer numpy dtype, torch dtype)
_NP_TO_VIEWED: dict[str, tuple[Any, torch.dtype]] = {
    "bfloat16": (np.int16, torch.bfloat16),
    "float8_e4m3fn": (np.uint8, torch.float8_e4m3fn),
    "float8_e5m2": (np.uint8, torch.float8_e5m2),
}


def _is_cuda(t: torch.Tensor) -> bool:
    return t.device.type == "cuda"


def _pinned_empty(t: torch.Tensor) -> torch.Tensor:
    """A page-locked host tensor shaped like ``t`` (DMA target of a non-blocking copy)."""
    return torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=True)


def _synchronize(device: torch.device) -> None:
    torch.cuda.current_stream(device).synchronize()


def stage_to_host(t: torch.Tensor) -> torch.Tensor:
    """``t`` in host memory. CPU tensors are returned as they are (no copy). CUDA tensors are
    copied into pinned host memory with a non-blocking copy on the current stream, which is
    then synchronised (so the host copy is complete when this returns); other devices use a
    blocking ``.cpu()``."""
    if t.device.type == "cpu" and not _is_cuda(t):
        return t
    if _is_cuda(t):
        host = _pinned_empty(t)
        host.copy_(t, non_blocking=True)
        _synchronize(t.device)
        return host
    return t.cpu()


def _check_plain(t: torch.Tensor, where: str) -> None:
    if t.layout != torch.strided:
        raise errors.InvalidArgumentError(
            f"{where}: {t.layout} tensors cannot be checkpointed; convert with .to_dense()"
        )
    if t.is_quantized:
        raise errors.InvalidArgumentError(
            f"{where}: quantized tensors cannot be checkpointed; dequantize() first"
        )
    if t.device.type == "meta":
        raise errors.InvalidArgumentError(
            f"{where}: a tensor on the meta device has no data to save"
        )
    if type(t).__name__ == "DTensor":
        raise errors.InvalidArgumentError(
            f"{where}: a DTensor; save it with dcp.save(..., storage_writer=ckptio.torch.StorageWriter(url)) "
            "or pass ckptio.Shard(t.to_local(), global_shape, offsets)"
        )


def to_numpy(obj: Any) -> np.ndarray | None:
    """A torch tensor as a numpy array in host memory, or None if ``obj`` is not a tensor.

    CPU tensors are not copied: the array shares the tensor's memory (and keeps it alive).
    Autograd is detached; conjugate/negative bits are resolved. CUDA tensors are staged
    through pinned memory (:func:`stage_to_host`).
    """
    if not isinstance(obj, torch.Tensor):
        return None
    _check_plain(obj, "tensor")
    t = stage_to_host(obj.detach()).resolve_conj().resolve_neg()
    dtype_name(t.dtype)  # refuse unsupported dtypes with the list of valid ones
    return _numpy_view(t)


def _numpy_view(t: torch.Tensor) -> np.ndarray:
    """A CPU tensor as a numpy array sharing its memory (bfloat16 and float8 as ml_dtypes)."""
    viewed = _VIEWED.get(t.dtype)
    if viewed is not None:
        as_int, name = viewed
        np_dtype = fmt.DTYPES[name]
        if t.dim() == 0:
            t = t.reshape(1)
            return t.view(as_int).numpy().view(np_dtype).reshape(())
        return t.view(as_int).numpy().view(np_dtype)
    return t.numpy()


def to_target(obj: Any, path: str) -> Target | None:
    """A tensor that ``ckptio.load(..., into=state)`` fills in place, or None if ``obj`` is not
    a tensor. CPU tensors are read into their own memory; others (CUDA) through host memory
    (pinned for CUDA), then copied to the device."""
    if not isinstance(obj, torch.Tensor):
        return None
    where = f"into= at {path!r}"
    _check_plain(obj, where)
    if obj.is_conj() or obj.is_neg():
        raise errors.InvalidArgumentError(
            f"{where}: a conjugate or negative view cannot be filled in place"
        )
    dtype_name(obj.dtype)
    t = obj.detach()  # the same memory, without autograd
    if not _is_cuda(t) and t.device.type == "cpu":
        return Target(obj, _numpy_view(t))
    host = _pinned_empty(t) if _is_cuda(t) else torch.empty(t.shape, dtype=t.dtype)
    return Target(obj, _numpy_view(host), lambda: t.copy_(host))


def from_numpy(array: np.ndarray, *, device: str | torch.device | None = None) -> torch.Tensor:
    """A numpy array as a torch tensor; on the CPU it shares the array's memory (a read-only
    array is copied, since torch tensors are always writable)."""
    if not array.flags.writeable:
        array = array.copy()
    viewed = _NP_TO_VIEWED.get(array.dtype.name)
    # matched by name, then checked: an array of an ml_dtypes dtype means ml_dtypes is imported
    if viewed is not None and array.dtype == fmt.DTYPES[array.dtype.name]:
        as_int, torch_dtype = viewed
        t = torch.from_numpy(array.reshape(-1).view(as_int)).view(torch_dtype).reshape(array.shape)
    else:
        t = torch.from_numpy(array)
    if device is not None and torch.device(device).type != "cpu":
        t = t.to(device)
    return t


def to_torch(state: Any, *, device: str | torch.device | None = None) -> Any:
    """``state`` with every numpy array (not numpy scalars) replaced by a torch tensor."""
    if isinstance(state, np.ndarray):
        return from_numpy(state, device=device)
    if isinstance(state, Mapping):
        return {k: to_torch(v, device=device) for k, v in state.items()}
    if isinstance(state, list):
        return [to_torch(v, device=device) for v in state]
    if isinstance(state, tuple):
        return tuple(to_torch(v, device=device) for v in state)
    return state


# -- integer-keyed dicts (optimizer state) ----------------------------------------------------

ITEMS_MARKER = "__ckptio_items__"
"""A dict with a non-string key is stored as ``{ITEMS_MARKER: [[key, value], ...]}``."""


def encode(state: Any) -> Any:
    """``state`` made storable by ckptio: dicts with integer keys (``optimizer.state_dict()``
    uses them) become ``{"__ckptio_items__": [[key, value], ...]}``. Tensors are kept as they
    are (no copy). :func:`decode` is the inverse."""
    if isinstance(state, Mapping):
        if all(isinstance(k, str) for k in state):
            if ITEMS_MARKER in state:
                raise errors.InvalidArgumentError(
                    f"state keys must not be {ITEMS_MARKER!r} (reserved)"
                )
            return {k: encode(v) for k, v in state.items()}
        bad = [k for k in state if not isinstance(k, str | int) or isinstance(k, bool)]
        if bad:
            raise errors.InvalidArgumentError(
                f"dict keys must be str or int; found {bad[0]!r} ({type(bad[0]).__name__})"
            )
        return {ITEMS_MARKER: [[k, encode(v)] for k, v in state.items()]}
    if isinstance(state, list):
        return [encode(v) for v in state]
    if isinstance(state, tuple) and not isinstance(state, torch.Size):
        return tuple(encode(v) for v in state)
    if isinstance(state, torch.Size):
        return tuple(int(x) for x in state)
    return state


def decode(state: Any) -> Any:
    """Inverse of :func:`encode`. A loaded checkpoint may be damaged or hostile: an
    ``{"__ckptio_items__": ...}`` node that is not what :func:`encode` writes (not a list of
    ``[key, value]`` pairs, a key that is not a str or int, a key given twice, the marker
    beside other keys) is refused with :class:`~ckptio.errors.ManifestError` naming where in
    the tree it lies."""
    return _decode(state, ())


def _decode(state: Any, path: tuple[Any, ...]) -> Any:
    if isinstance(state, Mapping):
        if ITEMS_MARKER in state:
            return _decode_items(state, path)
        return {k: _decode(v, (*path, k)) for k, v in state.items()}
    if isinstance(state, list):
        return [_decode(v, (*path, i)) for i, v in enumerate(state)]
    if isinstance(state, tuple):
        return tuple(_decode(v, (*path, i)) for i, v in enumerate(state))
    return state


def _decode_items(node: Mapping[str, Any], path: tuple[Any, ...]) -> dict[Any, Any]:
    """The dict an ``{ITEMS_MARKER: [[key, value], ...]}`` node stands for, checked."""
    where = "tree" + "".join(f"[{k!r:.60}]" for k in (*path, ITEMS_MARKER))

    def refuse(message: str, at: str = "") -> errors.ManifestError:
        return errors.ManifestError(message, field=where + at)

    if len(node) != 1:
        others = sorted(str(k) for k in node if k != ITEMS_MARKER)
        raise refuse(f"beside other keys ({', '.join(others)[:80]}); encode() writes it alone")
    items = node[ITEMS_MARKER]
    if not isinstance(items, list | tuple):
        raise refuse(f"expected a list of [key, value] pairs, got {_kind(items)}")
    out: dict[Any, Any] = {}
    for i, item in enumerate(items):
        if not isinstance(item, list | tuple) or len(item) != 2:
            raise refuse(f"expected [key, value], got {_kind(item)}", f"[{i}]")
        key, value = item
        if not isinstance(key, str | int) or isinstance(key, bool):
            raise refuse(f"key {key!r:.60} ({type(key).__name__}): keys are str or int", f"[{i}]")
        if key in out:
            raise refuse(f"key {key!r:.60} given twice", f"[{i}]")
        out[key] = _decode(value, (*path, key))
    return out


def _kind(value: Any) -> str:
    """What ``value`` is, for an error message: its type, and its length if it has one."""
    if isinstance(value, list | tuple | Mapping | str):
        return f"a {type(value).__name__} of {len(value)}"
    return f"a {type(value).__name__}"


def save(
    state: Any, url: str | os.PathLike[str] | Store, step: int, **options: Any
) -> _ck.SaveHandle:
    """:func:`ckptio.save` of :func:`encode` (``state``): torch state dicts as they come."""
    return _ck.save(encode(state), url, step, **options)


def load(
    url: str | os.PathLike[str] | Store,
    step: int | None = None,
    *,
    device: str | torch.device | None = None,
    select: Mapping[str, Any] | None = None,
    into: Any = None,
    **options: Any,
) -> Any:
    """:func:`ckptio.load`, with tensors as torch tensors on ``device`` (default CPU, sharing
    the memory ckptio read into) and integer-keyed dicts restored (:func:`decode`). ``into``:
    a state dict (``model.state_dict()``, integer keys included) whose tensors are filled
    in place."""
    into = None if into is None else encode(into)
    return decode(to_torch(_ck.load(url, step, select=select, into=into, **options), device=device))


class TorchCodec:
    """How torch state is saved and loaded by a :class:`ckptio.Checkpointer`: state dicts as
    they come (integer keys included: :func:`encode`), tensors back as torch tensors on
    ``device`` (default CPU, sharing the memory ckptio read into); ``into``: a state dict whose
    tensors are filled in place."""

    def __init__(self, device: str | torch.device | None = None) -> None:
        self.device = device

    def encode(self, state: Any) -> Any:
        return encode(state)

    def decode(self, read: Callable[[Any], Any], *, into: Any = None, **how: Any) -> Any:
        refuse_load_options(how, "torch")
        plain = read(None if into is None else encode(into))
        return decode(to_torch(plain, device=self.device))


class Checkpointer(_ck.Checkpointer):
    """:class:`ckptio.Checkpointer` given a :class:`TorchCodec`: ``save`` takes state dicts as
    they come (integer keys included), ``load`` returns torch tensors on ``device``. With
    ``local=...``, tiered as :class:`ckptio.Checkpointer` is."""

    def __init__(
        self,
        url: str | os.PathLike[str] | Store,
        *,
        device: str | torch.device | None = None,
        **options: Any,
    ) -> None:
        super().__init__(url, codec=TorchCodec(device), **options)
        self.device = device


def __getattr__(name: str) -> Any:
    if name == "TieredCheckpointer":  # before the codec, a twin class of Checkpointer
        warnings.warn(
            "ckptio.torch.TieredCheckpointer is deprecated: ckptio.torch.Checkpointer(url, "
            "local=...) is tiered",
            DeprecationWarning,
            stacklevel=2,
        )
        return Checkpointer
    raise AttributeError(f"module 'ckptio.torch' has no attribute {name!r}")


# -- torch.distributed.checkpoint -------------------------------------------------------------

BYTES_PREFIX = "~dcp-bytes/"
"""Manifest tensor path prefix of DCP's byte payloads (``~`` followed by ``d`` never occurs
in an escaped tensor path, so no tensor can collide with it)."""
DCP_EXTRA = "dcp"
"""Key of DCP's metadata in the manifest's ``extra``."""


@dataclass(frozen=True)
class _Stored:
    """Where a write item's bytes went (a WriteResult's ``storage_data``; JSON-able)."""

    path: str
    """Manifest tensor path (``escape(fqn)`` or ``~dcp-bytes/escape(fqn)``)."""
    chunks: tuple[dict[str, Any], ...]
    """ckptio chunks (``Chunk.as_json()``) holding it."""
    objects: tuple[tuple[str, int], ...]
    """Objects (relative key, bytes) those chunks live in."""


def _done(value: Any) -> Future[Any]:
    fut: Future[Any] = Future()
    fut.set_result(value)
    return fut


class StorageWriter(_dcp_storage.StorageWriter, BlockingAsyncStager):
    """``torch.distributed.checkpoint`` writes through any ckptio store; a drop-in for DCP's
    ``FileSystemWriter``.

    ``StorageWriter("s3://bucket/run/step-100")`` or ``StorageWriter("s3://bucket/run",
    step=100)``: the checkpoint is ckptio's step ``100`` under the root ``s3://bucket/run``
    (``<root>/step-0000000100/``), so ``ckptio ls``, ``ckptio verify`` and
    ``ckptio.load`` (tensors as numpy, torch-free) see it like any other. A URL or path that
    names no step (``/ckpt/epoch5``, as DCP users write) is a root holding one checkpoint, its
    step 0: saving to it again replaces it (``overwrite=True``, DCP's default), and
    :class:`StorageReader` of the same URL reads it. A ``checkpoint_id`` given to ``dcp.save``
    (same forms) retargets the writer.

    What happens on the calls DCP makes (``storage.py`` documents the sequence):

    - ``prepare_global_plan`` (coordinator): refuses a step that is already committed when
      ``overwrite=False``; takes the save's lease (``step-<N>/saving-<token>.json``, see
      :mod:`ckptio.lease`) before any rank writes, so gc and retention leave its data alone;
      gives each rank its number.
    - ``write_data`` (every rank): each write item is written raw (tensor bytes, C order, no
      ``torch.save``) into the rank's shard objects ``data/rank-RRRRR-III-<token>.bin``,
      4 KiB-aligned, CRC32C computed while writing. Returns when the objects are durable.
    - ``finish`` (coordinator, after every rank succeeded): writes ckptio's manifest, the
      commit point, atomically and last (with ``overwrite=True`` an existing manifest of the
      step is replaced atomically), then lists the step and withdraws it if a gc fenced the
      step or an object is missing (:func:`ckptio.checkpoint.publish_manifest`). DCP's
      ``Metadata`` is stored inside it as JSON (never pickle); the manifest is validated
      exactly as a reader will before it is published. Then it releases the lease, retires all but the newest ``keep_last``
      checkpoints under the root, and removes debris as ``ckptio gc`` does (objects of the
      replaced or interrupted saves of this step, temp files, dead leases; never a committed
      checkpoint nor a save in flight).

    Until ``finish`` publishes, nothing of the step is visible; a save that fails on any rank
    leaves only unreferenced objects (the next save's sweep or ``ckptio gc`` removes them) and
    never touches an earlier checkpoint. The lease of a save that failed on another rank (DCP
    does not call ``finish`` then) is released by the writer's next ``reset`` (the next save)
    or when the writer is dropped.

    What is and is not pickled: ckptio stores no pickle. ``BytesIOWriteItem`` payloads —
    non-tensor values of the state dict (ints, floats, strings, param_groups, ...) — are
    produced by DCP itself with ``torch.save`` (pickle) and are stored as opaque bytes with a
    CRC32C; DCP's planner unpickles them when ``dcp.load`` asks for them (see
    :class:`StorageReader`, ``allow_pickle``). DCP also pickles plans and results in transit
    between ranks (its object collectives); none of that reaches storage.

    Options (keyword-only):

    - ``step``; ``keep_last`` (int or None) and ``retire_grace`` as in
      :class:`ckptio.Checkpointer` (retention after each commit, applied to every checkpoint
      under the root); ``chunk_size`` and ``max_object_size`` as there.
    - ``FileSystemWriter``'s keywords, with its defaults: ``overwrite`` (True: replace a
      committed checkpoint of the same step, atomically; False: refuse it);
      ``thread_count`` (1): objects of a rank written at the same time;
      ``sync_files`` (True): False turns off fsync on ``file://``/``pfs://`` roots (not
      durable after a crash; no effect on object stores, where an object is durable once its
      upload completes); ``cache_staged_state_dict`` (False): as in DCP, for
      ``dcp.async_save`` (this writer is DCP's ``BlockingAsyncStager``: one CPU copy, kept
      and reused when True); ``single_file_per_rank`` and ``per_thread_copy_ahead``: accepted
      and unused — ckptio always packs a rank's items into objects of at most
      ``max_object_size`` (readers do not depend on how), and stages CUDA tensors whole
      through pinned memory. ``_extensions`` and a ``serialization_format`` other than
      ``TORCH_SAVE`` are refused: ckptio stores raw tensor bytes with CRC32C in its own format.
    - anything else goes to the store (``streams``, ``part_size``, ...).
    """

    def __init__(
        self,
        url: str | os.PathLike[str],
        *,
        step: int | None = None,
        overwrite: bool = True,
        keep_last: int | None = None,
        retire_grace: float = RETIRE_GRACE_SECONDS,
        chunk_size: int | str = _ck.DEFAULT_CHUNK_SIZE,
        max_object_size: int | str = _ck.DEFAULT_MAX_OBJECT_SIZE,
        thread_count: int = 1,
        sync_files: bool = True,
        cache_staged_state_dict: bool = False,
        **options: Any,
    ) -> None:
        # FileSystemWriter's other keywords: accepted as DCP spells them (a caller switching
        # from it changes only the class), not parameters of their own (none changes what
        # ckptio writes); every other name goes to the store, which refuses unknown ones
        single_file_per_rank = options.pop("single_file_per_rank", True)
        per_thread_copy_ahead = options.pop("per_thread_copy_ahead", 10_000_000)
        _extensions: Sequence[Any] | None = options.pop("_extensions", None)
        serialization_format = options.pop("serialization_format", None)
        store_options = options
        _dcp_storage.StorageWriter.__init__(self)
        BlockingAsyncStager.__init__(self, cache_staged_state_dict=cache_staged_state_dict)
        if _extensions:
            raise errors.InvalidArgumentError(
                "StorageWriter takes no _extensions (DCP's stream transforms): ckptio stores raw "
                "tensor bytes with a CRC32C in its own format"
            )
        if (
            serialization_format is not None
            and getattr(serialization_format, "name", None) != "TORCH_SAVE"
        ):
            raise errors.InvalidArgumentError(
                f"serialization_format={serialization_format!r}: ckptio stores raw tensor bytes in "
                "its own format; only the default (SerializationFormat.TORCH_SAVE, for DCP's "
                "non-tensor items) is accepted"
            )
        self.overwrite = bool(overwrite)
        self.keep_last = (
            None if keep_last is None else option_int(keep_last, field="keep_last", minimum=1)
        )
        if not isinstance(retire_grace, int | float) or not 0 <= retire_grace < float("inf"):
            raise errors.InvalidArgumentError(
                f"retire_grace: expected seconds >= 0, got {retire_grace!r}"
            )
        self.retire_grace = float(retire_grace)
        self.chunk_size = parse_size(chunk_size, field="chunk_size")
        self.max_object_size = parse_size(max_object_size, field="max_object_size")
        self.thread_count = option_int(thread_count, field="thread_count", minimum=1)
        self.sync_files = bool(sync_files)
        self.single_file_per_rank = single_file_per_rank
        self.per_thread_copy_ahead = per_thread_copy_ahead
        self._store_options = store_options
        self._lease: SaveLease | None = None
        self._target(os.fspath(url), step)
        self.rank = 0
        self.is_coordinator = True
        self.save_id = uuid.uuid4().hex

    def _target(self, url: str, step: int | None) -> None:
        root, s = split_checkpoint_url(str(url), step)
        self.step = 0 if s is None else s
        fmt.step_dir(self.step)  # validates the step
        options = sync_options(self._store_options, root, self.sync_files)
        self.store: Store = reopen_store(
            getattr(self, "store", None), getattr(self, "root", None), root, options
        )
        self.root = root

    @property
    def checkpoint_id(self) -> str:
        return f"{self.store.url.rstrip('/')}/{fmt.step_dir(self.step)}"

    def __getstate__(self) -> dict[str, Any]:
        # dcp.async_save(async_checkpointer_type=PROCESS) ships the writer to a worker
        # process: the store (clients, pools, locks) is reopened there from root + options;
        # a lease belongs to this process; the staging cache stays here
        state = self.__dict__.copy()
        for name in ("store", "_lease", "state_dict_cache"):
            state.pop(name, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lease = None
        self.state_dict_cache = None
        options = sync_options(self._store_options, self.root, self.sync_files)
        self.store = open_store(self.root, **options)

    def _release(self) -> None:
        lease, self._lease = self._lease, None
        if lease is not None:
            lease.release()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # interpreter shutdown
            self._release()

    # -- the DCP protocol --------------------------------------------------------------------
    def reset(self, checkpoint_id: Any = None) -> None:
        self._release()  # a previous save that failed on another rank never reached finish
        if checkpoint_id:
            self._target(
                os.fspath(checkpoint_id)
                if isinstance(checkpoint_id, os.PathLike)
                else str(checkpoint_id),
                None,
            )
        self.save_id = uuid.uuid4().hex

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self.is_coordinator = is_coordinator
        rank = kwargs.get("rank")
        self.rank = int(rank) if rank is not None else (0 if is_coordinator else self.rank)
        if kwargs.get("use_collectives", True) is False:
            raise errors.InvalidArgumentError(
                "ckptio's StorageWriter commits one manifest for all ranks and needs "
                "use_collectives=True"
            )

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        if not self.overwrite and self.store.exists(fmt.manifest_key(self.step)):
            raise errors.AlreadyExistsError(
                f"{self.checkpoint_id} is already a committed checkpoint; pass overwrite=True "
                "to replace it (atomically)"
            )
        self._release()
        self._lease = SaveLease(self.store, self.step).acquire()  # before any rank writes
        return [dataclasses.replace(p, storage_data={"rank": i}) for i, p in enumerate(plans)]

    def storage_meta(self) -> StorageMeta | None:
        return StorageMeta(checkpoint_id=self.checkpoint_id, save_id=self.save_id)

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[Any]]:
        rank = plan.storage_data["rank"] if isinstance(plan.storage_data, dict) else self.rank
        locals_: list[_ck.LocalTensor] = []
        for item in plan.items:
            data = planner.resolve_data(item)
            if item.type == WriteItemType.BYTE_IO:
                raw = data.getvalue() if isinstance(data, io.BytesIO) else bytes(data)
                payload = np.frombuffer(raw, dtype=np.uint8)
                path = BYTES_PREFIX + fmt.escape(item.index.fqn)
                locals_.append(
                    _ck.LocalTensor(path, payload, payload.shape, (0,), replicated=False)
                )
                continue
            host = to_numpy(data)
            if host is None:
                raise errors.InvalidArgumentError(
                    f"{item.index.fqn}: the planner resolved a {type(data).__name__}, not a tensor"
                )
            arr = contiguous_le(host)
            offsets = tuple(int(x) for x in item.index.offset or ())
            td = item.tensor_data
            gshape = tuple(int(x) for x in td.size) if td is not None else arr.shape
            locals_.append(
                _ck.LocalTensor(
                    fmt.escape(item.index.fqn),
                    arr,
                    gshape,
                    offsets or (0,) * arr.ndim,
                    replicated=False,
                )
            )
        # DCP's planner said what this rank writes; ckptio's writer writes it (one plan type
        # for every save: ckptio.checkpoint.write.SavePlan), the coordinator commits it
        options = WriteOptions("file-per-shard", "flat", self.chunk_size, self.max_object_size)
        writes = CkptioPlan(self.step, secrets.token_hex(4), {}, options)
        try:
            written = RankWriter(self.store, writes, rank).objects(
                locals_, parallel=self.thread_count
            )
        except BaseException:
            self._release()  # the coordinator's own failure: DCP will not call finish
            raise
        objects = written["objects"]
        results = []
        for item, local in zip(plan.items, locals_, strict=True):
            mine = [
                c for c in written["chunks"].get(local.path, []) if _inside(c["offsets"], local)
            ]
            keys = {c["key"] for c in mine}
            stored = _Stored(local.path, tuple(mine), tuple((k, objects[k]) for k in sorted(keys)))
            results.append(
                _dcp_storage.WriteResult(
                    index=item.index, size_in_bytes=local.array.nbytes, storage_data=stored
                )
            )
        return _done(results)

    def finish(self, metadata: Metadata, results: list[list[Any]]) -> None:
        from torch.distributed.checkpoint.filesystem import CURRENT_DCP_VERSION

        metadata.version = CURRENT_DCP_VERSION
        metadata.storage_meta = self.storage_meta()
        metadata.storage_data = {wr.index: wr.storage_data for rs in results for wr in rs}
        objects = {k: n for rs in results for wr in rs for k, n in wr.storage_data.objects}
        prefix = fmt.step_dir(self.step) + "/"
        try:
            data = self._manifest(metadata, results)
            _ck.publish_manifest(self.store, self.step, data, objects, overwrite=self.overwrite)
        except BaseException:
            _ck.discard_objects(self.store, sorted(prefix + k for k in objects))
            raise
        finally:
            self._release()
        try:  # retention must not fail a committed save
            _ck.retain(self.store, self.step, self.keep_last, grace=self.retire_grace)
        except Exception as err:
            log.warning("retention after %s failed: %s", self.checkpoint_id, err)

    def _manifest(self, metadata: Metadata, results: list[list[Any]]) -> bytes:
        chunks: dict[str, list[dict[str, Any]]] = {}
        objects: dict[str, int] = {}
        for rs in results:
            for wr in rs:
                st: _Stored = wr.storage_data
                objects.update(dict(st.objects))
                chunks.setdefault(st.path, []).extend(st.chunks)
        tensors: dict[str, mf.TensorEntry] = {}
        tree: dict[str, Any] = {}
        for fqn, sm in metadata.state_dict_metadata.items():
            if isinstance(sm, TensorStorageMetadata):
                path = fmt.escape(fqn)
                tensors[path] = mf.TensorEntry(
                    dtype_name(sm.properties.dtype),
                    tuple(int(x) for x in sm.size),
                    mf.chunks_of(chunks.get(path, [])),
                )
                tree[fqn] = {"t": path}
            else:
                path = BYTES_PREFIX + fmt.escape(fqn)
                cs = mf.chunks_of(chunks.get(path, []))
                tensors[path] = mf.TensorEntry("uint8", (sum(c.length for c in cs),), cs)
        manifest = mf.Manifest(
            step=self.step,
            world_size=len(results),
            tensors=tensors,
            objects=objects,
            tree={"d": tree},
            layout={
                "kind": "file-per-shard",
                "key_layout": "flat",
                "writer": "torch.distributed.checkpoint",
            },
            extra={DCP_EXTRA: metadata_to_json(metadata)},
        )
        return mf.encode_manifest(manifest)  # never publishes what load would refuse

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Any) -> bool:
        return valid_checkpoint_id(checkpoint_id)


def convert_dcp(
    path: str | os.PathLike[str],
    url: str | os.PathLike[str],
    *,
    step: int | None = None,
    allow_pickle: bool = False,
    **options: Any,
) -> str:
    """Convert the DCP checkpoint that DCP's ``FileSystemWriter`` wrote in the local
    directory ``path`` (``.metadata``, ``*.distcp``) into a ckptio one at ``url`` (``step``,
    or the step the URL names, or 0), written through :class:`StorageWriter`; returns its
    ``checkpoint_id``. ``options`` go to :class:`StorageWriter`.

    DCP's ``.metadata`` is a pickle, and its tensor items are ``torch.save`` blobs: reading
    them can run code, so this refuses unless ``allow_pickle=True`` (for a directory you
    trust). Then the whole checkpoint is read once into host memory by DCP itself (its
    ``FileSystemReader``, as ``torch.distributed.checkpoint.format_utils.dcp_to_torch_save``
    does, in this process) and saved as one ckptio checkpoint: the result needs host memory
    for the whole state. Read the result with :class:`StorageReader` (``dcp.load``, any
    number of ranks) or :func:`load`; its non-tensor values stay DCP's pickles, as for any
    checkpoint :class:`StorageWriter` writes."""
    import torch.distributed.checkpoint as dcp

    # what torch.distributed.checkpoint.format_utils.dcp_to_torch_save uses (both private):
    # dcp.load keeps only the keys its state_dict had, and this one starts empty
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    source = os.fspath(path)
    if not allow_pickle:
        raise errors.InvalidArgumentError(
            f"{source}: a DCP FileSystemWriter checkpoint's .metadata is a pickle and its "
            "tensors are torch.save blobs (loading them can run code); pass "
            "convert_dcp(..., allow_pickle=True) for a directory you trust"
        )
    if not os.path.isfile(os.path.join(source, ".metadata")):
        raise errors.NotFoundError(
            f"{source}: no .metadata there: not a checkpoint DCP's FileSystemWriter wrote"
        )
    state: dict[str, Any] = {}
    _load_state_dict(
        state,
        storage_reader=dcp.FileSystemReader(source),
        planner=_EmptyStateDictLoadPlanner(),
        no_dist=True,
    )
    writer = StorageWriter(url, step=step, **options)
    dcp.save(state, storage_writer=writer, no_dist=True)
    return writer.checkpoint_id


def _inside(offsets: Sequence[int], local: _ck.LocalTensor) -> bool:
    """Is a chunk (by its global offsets) part of this local piece? (two write items of one
    rank never share a path and box start, so the start decides)."""
    return all(
        o <= c < o + n for c, o, n in zip(offsets, local.offsets, local.array.shape, strict=True)
    )


class StorageReader(_dcp_storage.StorageReader):
    """``torch.distributed.checkpoint`` reads through any ckptio store.

    ``StorageReader("s3://bucket/run/step-100")``, ``StorageReader(root, step=100)``, or
    ``StorageReader(root)`` for the newest committed checkpoint under ``root`` — so a URL or
    path that names no step (``/ckpt/epoch5``) reads what ``StorageWriter`` of the same URL
    wrote, as DCP's ``FileSystemReader`` does. It reads checkpoints written by
    :class:`StorageWriter`.

    ``read_metadata`` validates the manifest and rebuilds DCP's ``Metadata`` from its JSON
    (no pickle). ``read_data`` reads each item's box of the stored tensor — any box, which is
    what resharding needs (a checkpoint saved by 2 ranks loads in 1, or in 8) — checking the
    CRC32C of every chunk it reads, in ``readers`` threads, and copies it into the tensor DCP
    resolves (any device).

    ``allow_pickle`` (default False): byte payloads (the state dict's non-tensor values) are
    pickles that DCP wrote with ``torch.save``, and DCP's planner would unpickle them (which
    can run code). By default the reader refuses such items with an error naming them, so
    loading a checkpoint never runs code; tensors load either way. Pass ``allow_pickle=True``
    only for checkpoints from storage you trust. ckptio's own ``ckptio.load`` never unpickles
    them: it returns tensors only.
    """

    def __init__(
        self,
        url: str | os.PathLike[str],
        *,
        step: int | None = None,
        allow_pickle: bool = False,
        readers: int = 8,
        **store_options: Any,
    ) -> None:
        super().__init__()
        self.allow_pickle = allow_pickle
        self.readers = readers
        self._store_options = store_options
        self._target(os.fspath(url), step)
        self._reader: _ck.CheckpointReader | None = None
        self._index: dict[MetadataIndex, str] = {}

    def _target(self, url: str, step: int | None) -> None:
        root, s = split_checkpoint_url(url, step)  # no step named: the newest committed one
        self.store: Store = reopen_store(
            getattr(self, "store", None), getattr(self, "root", None), root, self._store_options
        )
        self.root = root
        self.step: int | None = s

    @property
    def checkpoint_id(self) -> str:
        return (
            self.store.url
            if self.step is None
            else f"{self.store.url.rstrip('/')}/{fmt.step_dir(self.step)}"
        )

    def reset(self, checkpoint_id: Any = None) -> None:
        if checkpoint_id:
            self._target(str(checkpoint_id), None)
        self._reader = None

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        reader = _ck.open_checkpoint(self.store, self.step)
        doc = reader.manifest.extra.get(DCP_EXTRA)
        if doc is None:
            raise errors.ManifestError(
                f"{self.store.url}/{fmt.step_dir(reader.step)} was not written by "
                "torch.distributed.checkpoint; read it with ckptio.load / ckptio.torch.load",
                field="extra.dcp",
            )
        md = metadata_from_json(doc)
        index: dict[MetadataIndex, str] = {}
        for fqn, sm in md.state_dict_metadata.items():
            if isinstance(sm, TensorStorageMetadata):
                path = fmt.escape(fqn)
                entry = reader.manifest.tensors.get(path)
                want(
                    entry is not None
                    and entry.shape == tuple(sm.size)
                    and entry.dtype == dtype_name(sm.properties.dtype),
                    f"state_dict_metadata[{fqn!r:.80}]",
                    "disagrees with the manifest's tensor of that name",
                )
                for c in sm.chunks:
                    index[MetadataIndex(fqn, c.offsets)] = path
            else:
                path = BYTES_PREFIX + fmt.escape(fqn)
                want(
                    path in reader.manifest.tensors,
                    f"state_dict_metadata[{fqn!r:.80}]",
                    "its bytes are not in the manifest",
                )
                index[MetadataIndex(fqn)] = path
        md.storage_data = index
        self._reader, self._index, self.step = reader, index, reader.step
        return md

    def set_up_storage_reader(
        self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any
    ) -> None:
        if self._reader is None:  # DCP reads metadata on every rank first; tolerate re-use
            self.read_metadata()
        self.is_coordinator = is_coordinator

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        reader = self._reader
        assert reader is not None, "read_metadata was not called"
        byte_items = [r for r in plan.items if r.type == LoadItemType.BYTE_IO]
        tensor_items = [r for r in plan.items if r.type != LoadItemType.BYTE_IO]
        if byte_items and not self.allow_pickle:
            raise errors.InvalidArgumentError(
                f"{self.checkpoint_id}: {len(byte_items)} item(s) ({byte_items[0].storage_index.fqn!r}, ...) are "
                "pickles written by DCP's torch.save; refused because allow_pickle=False (loading them "
                "can run code): pass "
                "StorageReader(..., allow_pickle=True) for a checkpoint from storage you trust"
            )

        def read_tensor(req: Any) -> tuple[Any, np.ndarray]:
            path = self._lookup(req.storage_index)
            start = req.storage_index.offset or ()
            box = tuple(
                slice(s + o, s + o + n)
                for s, o, n in zip(start, req.storage_offsets, req.lengths, strict=True)
            )
            return req, reader.read(path, box)

        def copy_in(req: Any, arr: np.ndarray) -> None:
            target = planner.resolve_tensor(req).detach()
            src = from_numpy(arr)
            if tuple(target.shape) != tuple(src.shape):
                raise errors.CorruptCheckpointError(
                    f"{req.storage_index.fqn}: read {tuple(src.shape)} for a destination of {tuple(target.shape)}"
                )
            target.copy_(src)
            planner.commit_tensor(req, target)

        if len(tensor_items) > 1 and self.readers > 1:
            with ThreadPoolExecutor(
                min(self.readers, len(tensor_items)), thread_name_prefix="ckptio-dcp-read"
            ) as pool:
                for req, arr in pool.map(read_tensor, tensor_items):
                    copy_in(req, arr)
        else:
            for req in tensor_items:
                copy_in(*read_tensor(req))
        for req in byte_items:
            raw = reader.read(self._lookup(req.storage_index))
            planner.load_bytes(req, io.BytesIO(raw.tobytes()))
        return _done(None)

    def _lookup(self, index: MetadataIndex) -> str:
        path = self._index.get(index)
        if path is None:
            raise errors.NotFoundError(
                f"{self.checkpoint_id}: no stored item {index.fqn!r} at {index.offset}"
            )
        return path

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Any) -> bool:
        return valid_checkpoint_id(checkpoint_id)
