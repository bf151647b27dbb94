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

The names below are the package's API; private helpers are imported from their module.
"""

from ckptio.checkpoint.checkpointer import FORK_OBJECT_BYTES, SaveHandle, save
from ckptio.checkpoint.commit import (
    SaveResult,
    build_manifest,
    commit_step,
    discard_objects,
    publish_manifest,
)
from ckptio.checkpoint.facade import Checkpointer, Codec, PlainCodec
from ckptio.checkpoint.read import (
    COALESCE_CHUNK_BYTES,
    COALESCE_REQUEST_BYTES,
    VERIFY_BLOCK_BYTES,
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
from ckptio.checkpoint.snapshot import (
    PAGE,
    PAGE_ALIGNED_MIN,
    SNAPSHOTS,
    LocalTensor,
    PreparedState,
    Shard,
    SnapshotBuffers,
    aligned_empty,
    cpu_pool,
    crc32c,
    refuse_empty,
)
from ckptio.checkpoint.tiered import TieredSaveHandle
from ckptio.checkpoint.write import (
    CRC_BATCH_BYTES,
    DEFAULT_CHUNK_SIZE,
    DEFAULT_MAX_OBJECT_SIZE,
    LAYOUTS,
    PARALLEL_OBJECTS,
    PARALLEL_OBJECTS_MIN,
    Piece,
    SharedRegion,
    WriteProgress,
    pack_pieces,
    place_shared_region,
    pwrite_pieces,
    write_rank_shards,
)

__all__ = [
    "COALESCE_CHUNK_BYTES",
    "COALESCE_REQUEST_BYTES",
    "CRC_BATCH_BYTES",
    "DEFAULT_CHUNK_SIZE",
    "DEFAULT_MAX_OBJECT_SIZE",
    "FORK_OBJECT_BYTES",
    "LAYOUTS",
    "PAGE",
    "PAGE_ALIGNED_MIN",
    "PARALLEL_OBJECTS",
    "PARALLEL_OBJECTS_MIN",
    "SNAPSHOTS",
    "VERIFY_BLOCK_BYTES",
    "CheckpointReader",
    "Checkpointer",
    "Codec",
    "Index",
    "LocalTensor",
    "Piece",
    "PlainCodec",
    "PreparedState",
    "SaveHandle",
    "SaveResult",
    "Shard",
    "SharedRegion",
    "SnapshotBuffers",
    "StepInfo",
    "TieredSaveHandle",
    "WriteProgress",
    "aligned_empty",
    "build_manifest",
    "collect_garbage",
    "commit_step",
    "committed_steps",
    "cpu_pool",
    "crc32c",
    "delete_step",
    "discard_objects",
    "doomed_steps",
    "list_steps",
    "load",
    "open_checkpoint",
    "pack_pieces",
    "place_shared_region",
    "publish_manifest",
    "pwrite_pieces",
    "read_manifest",
    "refuse_empty",
    "retain",
    "save",
    "verify",
    "write_rank_shards",
]
