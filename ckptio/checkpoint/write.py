"""Writing one rank's shard data; nothing written here is visible until a manifest names it.

- Tensors larger than ``chunk_size`` are split along dim 0 into pieces of whole pages where
  rows allow (:func:`_pieces`): page-aligned memory stays page-aligned, so ``O_DIRECT``
  needs no copy on save or load, and CRCs and resharded loads work per chunk.
- :class:`SavePlan` is what each rank writes (rank 0 decides it); :class:`RankWriter` writes
  one rank's share of it, all at once (``save``) or a buffer at a time (the benchmark runner).
- ``file-per-shard``: :func:`write_rank_shards` packs pieces into objects of at most
  ``max_object_size`` (each piece aligned to :data:`ckptio.format.ALIGNMENT`); a rank with at
  least :data:`PARALLEL_OBJECTS_MIN` bytes spreads them over :data:`PARALLEL_OBJECTS` objects
  written at once.
- ``shared-file`` / ``shared-file-per-node``: rank 0 places every rank's byte range in one
  object (:func:`place_shared_region`); each rank writes its pieces there with ``pwrite``
  (:func:`pwrite_pieces`).
- CRC32C runs on :func:`~ckptio.checkpoint.snapshot.cpu_pool` while the bytes are written,
  small pieces batched (:data:`CRC_BATCH_BYTES`): no second pass over the data.
- Object keys carry the save attempt's token, so a failed or losing attempt's data is found
  by that token and never mistaken for another's."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from ckptio import errors
from ckptio import format as fmt
from ckptio import manifest as mf
from ckptio.checkpoint.snapshot import PAGE, LocalTensor, cpu_pool, crc32c
from ckptio.dist import Communicator
from ckptio.store import Store, wait_all

__all__ = [
    "CRC_BATCH_BYTES",
    "DEFAULT_CHUNK_SIZE",
    "DEFAULT_MAX_OBJECT_SIZE",
    "LAYOUTS",
    "PARALLEL_OBJECTS",
    "PARALLEL_OBJECTS_MIN",
    "Piece",
    "RankWriter",
    "SavePlan",
    "SharedRegion",
    "WriteOptions",
    "WriteProgress",
    "pack_pieces",
    "place_shared_region",
    "pwrite_pieces",
    "write_rank_shards",
]

DEFAULT_CHUNK_SIZE = 64 * 2**20
"""Bytes: tensors larger than this are split along their first dimension into chunks of about
this size (parallel CRC, finer-grained resharded loads)."""


DEFAULT_MAX_OBJECT_SIZE = 16 * 2**30
"""Bytes: a rank's shard data is split into objects of at most this size."""


LAYOUTS = ("file-per-shard", "shared-file", "shared-file-per-node")
"""Data layouts: ``file-per-shard`` (N-N) writes one or more objects per rank;
``shared-file`` (N-1) has every rank ``pwrite`` its chunks into one object per checkpoint, at
a byte range rank 0 assigns (aligned to :attr:`Store.positional_alignment`);
``shared-file-per-node`` does the same with one object per host. The manifest format is the
same for all (chunks name an object and a byte offset), so load and verify need no layout.
The shared layouts need ``capabilities.positional_writes`` (file://, pfs://)."""


@dataclass
class Piece:
    path: str
    view: np.ndarray  # C-contiguous slice of the local array
    offsets: tuple[int, ...]  # in the global tensor


def _pieces(local: LocalTensor, chunk_size: int) -> list[Piece]:
    """Split a local tensor along dim 0 into C-contiguous pieces of about ``chunk_size``;
    where rows allow, every piece holds a whole number of pages (so pieces of page-aligned
    memory stay page-aligned: O_DIRECT without a copy, on save and on load)."""
    arr = local.array
    if arr.ndim == 0 or arr.nbytes <= chunk_size or arr.shape[0] <= 1:
        return [Piece(local.path, arr, local.offsets)]
    row = arr.nbytes // arr.shape[0]
    rows = max(1, chunk_size // max(row, 1))
    per_page = PAGE // math.gcd(row, PAGE) if row else 1  # rows per whole number of pages
    if rows >= per_page:
        rows -= rows % per_page
    out = []
    for r in range(0, arr.shape[0], rows):
        offs = (local.offsets[0] + r, *local.offsets[1:])
        out.append(Piece(local.path, arr[r : r + rows], offs))
    return out


_ZEROS = memoryview(bytes(fmt.ALIGNMENT))


CRC_BATCH_BYTES = 8 << 20
"""Bytes: small pieces are checksummed in batches of about this size (one task, not one per
piece); a larger piece is a batch of its own."""


def _crc_many(datas: Sequence[np.ndarray]) -> list[int]:
    return [crc32c(d) for d in datas]


PARALLEL_OBJECTS = 2
"""Shard objects a rank writes at the same time (when it has enough data)."""


PARALLEL_OBJECTS_MIN = 256 * 2**20
"""Bytes: below this a rank writes one object at a time."""


class WriteProgress(Protocol):
    """What :func:`write_rank_shards` reports as it goes (a fork snapshot's child gives back
    the memory of what it has written: :class:`ckptio.forked.PageReleaser`)."""

    def expect(self, views: Sequence[np.ndarray]) -> None: ...

    def written(self, views: Sequence[np.ndarray]) -> None: ...


def write_rank_shards(
    store: Store,
    step: int,
    rank: int,
    token: str,
    mine: Sequence[LocalTensor],
    *,
    key_layout: str,
    chunk_size: int,
    max_object_size: int,
    first_index: int = 0,
    parallel: int = 1,
    progress: WriteProgress | None = None,
) -> dict[str, Any]:
    """Write this rank's tensors into shard objects, numbered from ``first_index`` (callers
    that write a rank's objects in several calls, like the runner, keep the numbers apart).
    ``parallel``: a rank's data of at least :data:`PARALLEL_OBJECTS_MIN` bytes is spread over
    about this many objects, written at the same time (a local filesystem serialises direct
    writes to one file; object stores take more streams). ``progress`` hears of every piece
    of memory to be written, then of each object's pieces once that object is durable and
    checksummed. Returns the chunk index and objects."""
    pieces = [p for local in mine for p in _pieces(local, chunk_size)]
    if progress is not None:
        progress.expect([p.view for p in pieces])
    total_bytes = sum(p.view.nbytes for p in pieces)
    if parallel > 1 and total_bytes >= PARALLEL_OBJECTS_MIN:
        # each object then gets at least total/parallel bytes, so there are at most `parallel`
        largest = max(p.view.nbytes for p in pieces)
        max_object_size = min(max_object_size, -(-total_bytes // parallel) + fmt.align_up(largest))
    # assign pieces to objects
    objects: list[list[tuple[Piece, int]]] = [[]]
    sizes = [0]
    for p in pieces:
        if sizes[-1] and sizes[-1] + p.view.nbytes > max_object_size:
            objects.append([])
            sizes.append(0)
        objects[-1].append((p, sizes[-1]))
        sizes[-1] = fmt.align_up(sizes[-1] + p.view.nbytes)
    chunks: dict[str, list[dict[str, Any]]] = {}
    object_sizes: dict[str, int] = {}
    prefix = fmt.step_dir(step) + "/"
    pool = cpu_pool()

    def write_object(index: int, members: list[tuple[Piece, int]]) -> tuple[str, int, list[int]]:
        key = fmt.shard_key(step, rank, index, key_layout=key_layout).replace(
            ".bin", f"-{token}.bin"
        )
        total = members[-1][1] + members[-1][0].view.nbytes
        crcs: list[Future[list[int]]] = []  # one CRC job per large piece or batch of small ones
        batch: list[np.ndarray] = []
        batch_bytes = 0
        writer = store.open_writer(key, size_hint=total)
        try:
            pos = 0
            for piece, offset in members:
                if offset > pos:
                    writer.write(_ZEROS[: offset - pos])
                data = piece.view.reshape(-1).view(np.uint8)
                batch.append(data)
                batch_bytes += data.nbytes
                if batch_bytes >= CRC_BATCH_BYTES:
                    crcs.append(pool.submit(_crc_many, batch))
                    batch, batch_bytes = [], 0
                writer.write(data)
                pos = offset + data.nbytes
            if batch:
                crcs.append(pool.submit(_crc_many, batch))
            writer.close()
        except BaseException:
            writer.abort()
            for f in crcs:
                f.cancel()
            raise
        crc_values = [crc for job in crcs for crc in job.result()]
        if progress is not None:
            progress.written([piece.view for piece, _ in members])
        return key[len(prefix) :], total, crc_values

    todo = [(index, members) for index, members in enumerate(objects, start=first_index) if members]
    if len(todo) > 1 and parallel > 1:
        with ThreadPoolExecutor(min(parallel, len(todo)), thread_name_prefix="ckptio-object") as ex:
            done = wait_all([ex.submit(write_object, index, members) for index, members in todo])
    else:
        done = [write_object(index, members) for index, members in todo]
    for (_index, members), (rel, total, crcs) in zip(todo, done, strict=True):
        object_sizes[rel] = total
        for (piece, offset), crc in zip(members, crcs, strict=True):
            chunks.setdefault(piece.path, []).append(
                mf.Chunk(
                    piece.offsets, piece.view.shape, rel, offset, piece.view.nbytes, crc
                ).as_json()
            )
    return {"chunks": chunks, "objects": object_sizes}


def pack_pieces(sizes: Iterable[int]) -> tuple[list[int], int]:
    """Offsets (bytes) of consecutive pieces of ``sizes`` bytes in one region, each starting
    on a :data:`ckptio.format.ALIGNMENT` boundary, and the region's size in bytes (a multiple
    of it, so a direct write's zero-padded tail stays inside the region)."""
    offsets: list[int] = []
    need = 0
    for n in sizes:
        offsets.append(need)
        need = fmt.align_up(need + int(n))
    return offsets, need


@dataclass(frozen=True)
class SharedRegion:
    """This rank's byte range in a shared (N-1) object, as rank 0 placed it."""

    key: str
    """The object, relative to the step directory (``data/shared-<token>.bin``)."""
    start: int
    """Bytes: where this rank's region begins (a multiple of the store's
    ``positional_alignment``)."""
    size: int
    """Bytes: the size of the whole object."""
    owner: bool
    """True on the lowest rank placed in this object (one rank per object says so)."""


def place_shared_region(
    store: Store, step: int, comm: Communicator, token: str, need: int, *, per_node: bool
) -> SharedRegion:
    """N-1 placement, collective: every rank asks for ``need`` bytes; rank 0 places the
    regions one after another in one object per checkpoint (or per host with ``per_node``),
    each aligned to ``store.positional_alignment`` so no two ranks share a stripe/block, and
    creates the objects at their full size. Raises :class:`SaveFailedError` on every rank if
    the creation failed."""
    import socket

    asks = comm.gather(
        {"need": int(need), "host": socket.gethostname() if per_node else ""}, root=0
    )
    prefix = fmt.step_dir(step) + "/"
    placement: dict[str, Any] = {}
    if comm.rank == 0:
        assert asks is not None
        align = max(fmt.ALIGNMENT, int(store.positional_alignment))
        hosts = sorted({a["host"] for a in asks})
        ends = {h: 0 for h in hosts}
        ranks: list[tuple[str, int]] = []
        for a in asks:
            node = hosts.index(a["host"])
            name = f"data/node-{node:05d}-{token}.bin" if per_node else f"data/shared-{token}.bin"
            begin = fmt.align_up(ends[a["host"]], align)
            ranks.append((name, begin))
            if a["need"]:
                ends[a["host"]] = begin + a["need"]
        files = {name: ends[asks[i]["host"]] for i, (name, _) in enumerate(ranks)}
        try:
            for name, size in files.items():
                store.open_positional(prefix + name, size, create=True).close()
            placement = {"ok": True, "ranks": ranks, "files": files}
        except Exception as err:  # every rank learns it from the bcast
            placement = {"ok": False, "error": error_text(err)}
    placement = comm.bcast(placement, root=0)
    if not placement["ok"]:
        raise errors.SaveFailedError(f"cannot create the shared file: {placement['error']}")
    rel, start = placement["ranks"][comm.rank]
    owner = next(i for i, (name, _) in enumerate(placement["ranks"]) if name == rel) == comm.rank
    return SharedRegion(rel, int(start), int(placement["files"][rel]), owner)


def pwrite_pieces(
    store: Store, step: int, region: SharedRegion, placed: Sequence[tuple[Piece, int]]
) -> dict[str, list[dict[str, Any]]]:
    """Open the shared object of ``region``, pwrite each piece at ``region.start`` + its
    offset (CRC32C computed alongside) and close: the pieces are durable when this returns.
    Returns the chunk index (tensor path -> chunk JSON). The pieces' memory must stay
    unchanged until then."""
    prefix = fmt.step_dir(step) + "/"
    crcs: list[Future[int]] = []
    if placed:
        pool = cpu_pool()
        writer = store.open_positional(prefix + region.key, region.size)
        try:
            for piece, offset in placed:
                data = piece.view.reshape(-1).view(np.uint8)
                crcs.append(pool.submit(crc32c, data))
                writer.pwrite(region.start + offset, data)
            writer.close()
        except BaseException:
            writer.abort()
            for f in crcs:
                f.cancel()
            raise
    chunks: dict[str, list[dict[str, Any]]] = {}
    for (piece, offset), crc in zip(placed, crcs, strict=True):
        chunks.setdefault(piece.path, []).append(
            mf.Chunk(
                piece.offsets,
                piece.view.shape,
                region.key,
                region.start + offset,
                piece.view.nbytes,
                crc.result(),
            ).as_json()
        )
    return chunks


@dataclass(frozen=True)
class WriteOptions:
    """How a save lays its data out in objects: one per :class:`ckptio.Checkpointer`, DCP
    writer or benchmark run, checked where it is made."""

    layout: str = "file-per-shard"
    """One of :data:`LAYOUTS`."""
    key_layout: str = "flat"
    """One of :data:`ckptio.format.KEY_LAYOUTS`."""
    chunk_size: int = DEFAULT_CHUNK_SIZE
    max_object_size: int = DEFAULT_MAX_OBJECT_SIZE


@dataclass(frozen=True)
class SavePlan:
    """What each rank writes in one save, as rank 0 decided it (DCP's split: a planner says
    what, the storage writes it): the step, the attempt's token (in every object key and in
    the save's lease), the writer of each tensor (a rank, or -1: every holder its box) and how
    the data is laid out. It travels to every rank as a document (:meth:`doc`, :meth:`of`);
    :class:`RankWriter` writes a rank's share of it, :func:`ckptio.checkpoint.commit.commit_step`
    commits it. ``save``, the Checkpointer, the fast tier, the DCP writer and the benchmark
    runner all write through it."""

    step: int
    token: str
    writers: Mapping[str, int]
    options: WriteOptions = WriteOptions()

    def doc(self) -> dict[str, Any]:
        """The plan as the collectives carry it (JSON)."""
        return {"ok": True, "token": self.token, "writers": dict(self.writers)}

    @classmethod
    def of(cls, doc: Mapping[str, Any], step: int, options: WriteOptions) -> SavePlan:
        """The plan of a document :meth:`doc` made (on rank 0) and a broadcast carried."""
        return cls(step, str(doc["token"]), doc["writers"], options)

    def mine(self, tensors: Mapping[str, LocalTensor], rank: int) -> list[LocalTensor]:
        """What ``rank`` writes of the ``tensors`` it holds."""
        return [t for p, t in tensors.items() if self.writers[p] in (rank, -1)]


class RankWriter:
    """One rank's writer of a :class:`SavePlan`: its tensors into shard objects
    (:meth:`objects`, N-N) or into its byte range of a shared object (:meth:`place`, then
    :meth:`pwrite`, N-1); :meth:`write` does either for a rank's whole share at once (what
    ``save`` does). A caller that streams its data (the benchmark runner, which never holds a
    whole checkpoint) calls :meth:`objects` or :meth:`pwrite` once per buffer it filled."""

    def __init__(self, store: Store, plan: SavePlan, rank: int) -> None:
        self.store, self.plan, self.rank = store, plan, rank

    def objects(
        self,
        tensors: Sequence[LocalTensor],
        *,
        first_index: int = 0,
        parallel: int = 1,
        progress: WriteProgress | None = None,
    ) -> dict[str, Any]:
        """:func:`write_rank_shards` of ``tensors`` under this plan: the chunk index and
        objects written."""
        o = self.plan.options
        return write_rank_shards(
            self.store,
            self.plan.step,
            self.rank,
            self.plan.token,
            tensors,
            key_layout=o.key_layout,
            chunk_size=o.chunk_size,
            max_object_size=o.max_object_size,
            first_index=first_index,
            parallel=parallel,
            progress=progress,
        )

    def place(self, comm: Communicator, sizes: Iterable[int]) -> tuple[SharedRegion, list[int]]:
        """N-1, collective: this rank's region of the shared object, placed by rank 0 for
        pieces of ``sizes`` bytes (:func:`place_shared_region`), and each piece's offset in
        it (:func:`pack_pieces`)."""
        offsets, need = pack_pieces(sizes)
        per_node = self.plan.options.layout == "shared-file-per-node"
        region = place_shared_region(
            self.store, self.plan.step, comm, self.plan.token, need, per_node=per_node
        )
        return region, offsets

    def pwrite(self, region: SharedRegion, placed: Sequence[tuple[Piece, int]]) -> dict[str, Any]:
        """N-1: :func:`pwrite_pieces` of ``placed`` into ``region``, durable on return; the
        chunk index and the shared object."""
        chunks = pwrite_pieces(self.store, self.plan.step, region, placed)
        return {"chunks": chunks, "objects": {region.key: region.size}}

    def write(
        self, comm: Communicator, tensors: Sequence[LocalTensor], *, parallel: int = 1
    ) -> dict[str, Any]:
        """A rank's whole share in one call (collective for the shared layouts): the chunk
        index and objects written."""
        if self.plan.options.layout == "file-per-shard":
            return self.objects(tensors, parallel=parallel)
        pieces = [p for local in tensors for p in _pieces(local, self.plan.options.chunk_size)]
        region, offsets = self.place(comm, (p.view.nbytes for p in pieces))
        return self.pwrite(region, list(zip(pieces, offsets, strict=True)))


def error_text(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}"
