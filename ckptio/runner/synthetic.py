"""The runner's state source: synthetic data, generated as it is written.

A run never holds a checkpoint: :class:`SyntheticState` describes the state the plan's
writing ranks would hold (per logical rank a flat bf16 ``model`` and fp32 ``optim`` tensor:
:meth:`SyntheticState.prepared`, what the commit names) and fills one shard object's worth of
it at a time into a buffer of a fixed ring (:class:`RecycledBuffers`: what bounds a rank's
memory) just before the library's writer writes it (:meth:`SyntheticState.filled`). The
bytes are incompressible and unique per object (:class:`DataGenerator`), so compression and
deduplication gain nothing."""

from __future__ import annotations

import hashlib
import queue
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from ckptio import format as fmt
from ckptio.checkpoint import LocalTensor, PreparedState
from ckptio.workload import ObjectSpec, Plan

__all__ = ["GEN_BLOCK", "DataGenerator", "RecycledBuffers", "SyntheticState", "tensor_path"]

GEN_BLOCK = 1 << 20
"""Bytes generated per call of the keystream (small enough to stay in cache)."""


_ZEROS = bytes(GEN_BLOCK)


class DataGenerator:
    """Fills buffers with incompressible bytes, unique per (run, iteration, rank, object).

    AES-256-CTR keystream (``cryptography``; ~4-7 GB/s per core) with a key derived from the
    object's identity; without ``cryptography``, numpy's PCG64 (~2.8 GB/s per core). Buffers
    must have :data:`SLACK` spare bytes after the part filled (AES ``update_into``)."""

    SLACK = 16

    def __init__(self, seed: str) -> None:
        self.seed = seed.encode()
        try:
            from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
        except ImportError:
            self.name = "pcg64"
            self._cipher = None
        else:
            self.name = "aes-ctr"
            self._cipher = (Cipher, algorithms, modes)

    def fill(self, buf: np.ndarray, nbytes: int, ident: str) -> None:
        """Fill ``buf[:nbytes]`` with the stream of ``ident`` (``buf`` has SLACK more bytes)."""
        view = buf.data
        for _ in self._stream(nbytes, ident, lambda off, k: view[off : off + k + self.SLACK]):
            pass

    def matches(self, buf: np.ndarray, nbytes: int, ident: str) -> bool:
        """Whether ``buf[:nbytes]`` holds the stream of ``ident`` (generated again, a block at
        a time: no second copy of the whole)."""
        scratch = np.empty(GEN_BLOCK + self.SLACK, dtype=np.uint8)
        data = buf.reshape(-1).view(np.uint8)[:nbytes]
        for off, k in self._stream(nbytes, ident, lambda off, k: scratch.data):
            if not np.array_equal(scratch[:k], data[off : off + k]):
                return False
        return True

    def _stream(
        self, nbytes: int, ident: str, place: Callable[[int, int], memoryview]
    ) -> Iterator[tuple[int, int]]:
        """Generate the stream of ``ident`` a block at a time into ``place(offset, length)``
        (a buffer of length + SLACK bytes), yielding each block's offset and length."""
        key = hashlib.blake2b(self.seed + b"/" + ident.encode(), digest_size=32).digest()
        if self._cipher is not None:
            cipher, algorithms, modes = self._cipher
            enc = cipher(algorithms.AES(key), modes.CTR(bytes(16))).encryptor()
            for off in range(0, nbytes, GEN_BLOCK):
                k = min(GEN_BLOCK, nbytes - off)
                enc.update_into(_ZEROS[:k], place(off, k))
                yield off, k
            return
        bitgen = np.random.PCG64(int.from_bytes(key[:16], "little"))
        for off in range(0, nbytes, GEN_BLOCK):
            k = min(GEN_BLOCK, nbytes - off)
            words = bitgen.random_raw(-(-k // 8)).view(np.uint8)
            np.frombuffer(place(off, k), dtype=np.uint8)[:k] = words[:k]
            yield off, k


class RecycledBuffers:
    """A fixed set of reusable buffers: what bounds a rank's memory."""

    def __init__(self, count: int, size: int) -> None:
        self.size = size
        self._free: queue.SimpleQueue[np.ndarray] = queue.SimpleQueue()
        for _ in range(count):
            self._free.put(np.empty(size + DataGenerator.SLACK, dtype=np.uint8))

    def take(self) -> np.ndarray:
        return self._free.get()

    def give(self, buf: np.ndarray) -> None:
        self._free.put(buf)


def tensor_path(rank: int, component: str) -> str:
    """The tensor of logical rank ``rank``'s ``component`` (``model``, ``optim``)."""
    return f"rank-{rank:05d}/{component}"


class SyntheticState:
    """The state this process saves in a run, as a stream: the shard objects of the logical
    ranks ``mine`` (:meth:`specs`), each generated into a recycled buffer as a
    :class:`~ckptio.checkpoint.LocalTensor` (a box of its rank's flat tensor) when its turn
    to be written comes (:meth:`filled`)."""

    def __init__(
        self,
        plan: Plan,
        mine: Sequence[int] | np.ndarray,
        gen: DataGenerator,
        buffers: RecycledBuffers,
    ) -> None:
        self.plan, self.mine, self.gen, self.buffers = plan, mine, gen, buffers

    def specs(self) -> Iterator[ObjectSpec]:
        """This process's shard objects, in the order they are written."""
        return (o for r in self.mine for o in self.plan.rank_objects(int(r)))

    def prepared(self, metadata: dict[str, Any]) -> PreparedState:
        """The state description rank 0 commits: per writing logical rank a ``model`` (bf16)
        and an ``optim`` (fp32) tensor, flat, holding that rank's share (no data: the data
        is :meth:`filled` as it is written)."""
        plan = self.plan
        tensors: dict[str, LocalTensor] = {}
        tree: dict[str, Any] = {}
        for r in np.flatnonzero(plan.rank_bytes > 0).tolist():
            sub: dict[str, Any] = {}
            for comp, elems, dtype in (
                ("model", plan.model_elements[r], "bfloat16"),
                ("optim", plan.optim_elements[r], "float32"),
            ):
                if elems <= 0:
                    continue
                path = tensor_path(r, comp)
                tensors[path] = LocalTensor(
                    path,
                    np.empty(0, dtype=fmt.DTYPES[dtype]),
                    (int(elems),),
                    (0,),
                    replicated=False,
                )
                sub[comp] = {"t": path}
            tree[f"rank-{r:05d}"] = {"d": sub}
        return PreparedState({"d": tree}, tensors, metadata)

    def resolve_dtypes(self) -> None:
        """Look up the dtypes the writes will use now, outside every timed phase: a bfloat16
        weight imports ml_dtypes (about a second on a busy 2-core machine), which would
        otherwise land in the first iteration's write time."""
        for r in self.mine:
            for spec in self.plan.rank_objects(int(r)):
                fmt.DTYPES[spec.dtype]
                break

    @contextmanager
    def filled(
        self, spec: ObjectSpec, iteration: int, cpu_seconds: Callable[[float], None]
    ) -> Iterator[LocalTensor]:
        """Shard object ``spec`` of ``iteration`` generated into a recycled buffer, as the
        box of its tensor it is; the buffer is given back when the block ends (the writer
        has made it durable by then). ``cpu_seconds`` hears what generating it cost this
        thread."""
        buf = self.buffers.take()
        try:
            t0 = time.thread_time()  # CPU seconds: the cost per core, not the wait
            self.gen.fill(
                buf, spec.nbytes, f"{iteration}/{spec.rank}/{spec.component}/{spec.index}"
            )
            cpu_seconds(time.thread_time() - t0)
            plan = self.plan
            total = (
                int(plan.model_elements[spec.rank])
                if spec.component == "model"
                else int(plan.optim_elements[spec.rank])
            )
            yield LocalTensor(
                tensor_path(spec.rank, spec.component),
                buf[: spec.nbytes].view(fmt.DTYPES[spec.dtype]),
                (total,),
                (spec.element_offset,),
                replicated=False,
            )
        finally:
            self.buffers.give(buf)
