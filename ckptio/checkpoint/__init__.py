"""The library API: save and load sharded checkpoints on any Store.

::

    import ckptio
    ckptio.save({"model": params, "step": 100}, "s3://bucket/run1", step=100)
    state = ckptio.load("s3://bucket/run1")            # newest complete checkpoint

    with ckptio.Checkpointer("file:///ckpt/run1", keep_last=3, async_save=True) as ck:
        for step in range(...):
            ...
            if step % 1000 == 0:
                ck.save(state, step=step)   # returns after the snapshot; persists in background

Guarantees: ``save`` (blocking) returns only when every shard is durable and the manifest is
committed; until the manifest is published nothing of the step is visible to ``load``. A failed
save (any rank) publishes no manifest and so never damages an earlier checkpoint. Every chunk
is CRC32C-checked on load; a mismatch raises :class:`~ckptio.errors.ChecksumError` naming the
object and byte range.

Multi-rank: every rank calls ``save`` with its own state; ``ckptio.Shard`` leaves say which
box of a global tensor a rank holds; plain arrays are replicated and written once (by the
lowest rank that has them). Rank 0 commits after every rank has succeeded.

The package, by responsibility; each module imports only those before it:

- :mod:`~ckptio.checkpoint.snapshot`: what a rank offers to save, snapshot buffers, CRC32C;
- :mod:`~ckptio.checkpoint.write`: one rank's shard data into objects (or a shared object);
- :mod:`~ckptio.checkpoint.commit`: the collective plan, write, gather and manifest commit;
- :mod:`~ckptio.checkpoint.read`: :class:`CheckpointReader`, manifests, ``load``, ``verify``;
- :mod:`~ckptio.checkpoint.retention`: listing steps, retention, deletion, gc;
- :mod:`~ckptio.checkpoint.checkpointer`: the one-store engine, background saves, ``save``;
- :mod:`~ckptio.checkpoint.drain`, :mod:`~ckptio.checkpoint.fastroot`,
  :mod:`~ckptio.checkpoint.tiered`: the two-tier engine (a fast tier and a durable one);
- :mod:`~ckptio.checkpoint.facade`: :class:`Checkpointer`, an engine and a codec.

The names below are the package's API: what users and the layers above call. Tuning constants
and the writer's building blocks are imported from their module; their old spellings here
still work, with a :class:`DeprecationWarning` naming the module (:data:`MOVED`).
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

from ckptio.checkpoint.checkpointer import SaveHandle, save
from ckptio.checkpoint.commit import SaveResult, commit_step, discard_objects, publish_manifest
from ckptio.checkpoint.facade import Checkpointer, Codec, PlainCodec
from ckptio.checkpoint.read import (
    CheckpointReader,
    Index,
    committed_steps,
    load,
    open_checkpoint,
    read_manifest,
    verify,
)
from ckptio.checkpoint.retention import (
    StepInfo,
    collect_garbage,
    delete_step,
    doomed_steps,
    list_steps,
    retain,
)
from ckptio.checkpoint.snapshot import LocalTensor, PreparedState, Shard, aligned_empty, crc32c
from ckptio.checkpoint.tiered import TieredSaveHandle
from ckptio.checkpoint.write import (
    DEFAULT_CHUNK_SIZE,
    DEFAULT_MAX_OBJECT_SIZE,
    LAYOUTS,
    RankWriter,
    SavePlan,
    WriteOptions,
)

__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "DEFAULT_MAX_OBJECT_SIZE",
    "LAYOUTS",
    "CheckpointReader",
    "Checkpointer",
    "Codec",
    "Index",
    "LocalTensor",
    "PlainCodec",
    "PreparedState",
    "RankWriter",
    "SaveHandle",
    "SavePlan",
    "SaveResult",
    "Shard",
    "StepInfo",
    "TieredSaveHandle",
    "WriteOptions",
    "aligned_empty",
    "collect_garbage",
    "commit_step",
    "committed_steps",
    "crc32c",
    "delete_step",
    "discard_objects",
    "doomed_steps",
    "list_steps",
    "load",
    "open_checkpoint",
    "publish_manifest",
    "read_manifest",
    "retain",
    "save",
    "verify",
]

MOVED = {
    **dict.fromkeys(("FORK_OBJECT_BYTES",), "ckptio.checkpoint.checkpointer"),
    **dict.fromkeys(("build_manifest",), "ckptio.checkpoint.commit"),
    **dict.fromkeys(
        ("COALESCE_CHUNK_BYTES", "COALESCE_REQUEST_BYTES", "VERIFY_BLOCK_BYTES"),
        "ckptio.checkpoint.read",
    ),
    **dict.fromkeys(
        (
            "PAGE",
            "PAGE_ALIGNED_MIN",
            "SNAPSHOTS",
            "SnapshotBuffers",
            "cpu_pool",
            "refuse_empty",
        ),
        "ckptio.checkpoint.snapshot",
    ),
    **dict.fromkeys(
        (
            "CRC_BATCH_BYTES",
            "PARALLEL_OBJECTS",
            "PARALLEL_OBJECTS_MIN",
            "Piece",
            "SharedRegion",
            "WriteProgress",
            "pack_pieces",
            "place_shared_region",
            "pwrite_pieces",
            "write_rank_shards",
        ),
        "ckptio.checkpoint.write",
    ),
}
"""Names this package exported before issue 31 and the module that holds each now."""


def __getattr__(name: str) -> Any:
    module = MOVED.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(
        f"ckptio.checkpoint.{name} moved: import it from {module}",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(importlib.import_module(module), name)
