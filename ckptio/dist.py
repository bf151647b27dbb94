"""Ranks: who am I, how many are we, and the few collectives a checkpoint needs.

ckptio adds no cluster layer of its own: ranks come from an existing engine (MPI through
mpi4py, torch.distributed) or there is one process. :func:`detect` picks what the process
was started with.

A :class:`Communicator` offers exactly what saving and committing need: ``barrier``,
``gather`` of small JSON-able objects to rank 0, and ``bcast`` from rank 0. Collectives of a
background (async) save run on their own communicator (``dup``), so they never interleave
with the training code's own collectives.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any, Protocol, TypeVar, runtime_checkable

from ckptio import errors
from ckptio.wire import decode, encode

__all__ = [
    "Communicator",
    "LocalProcesses",
    "MPICommunicator",
    "RankFailedError",
    "SingleProcess",
    "detect",
    "poll",
    "run_local",
    "shutdown",
    "torch_communicator",
    "under_mpi",
    "under_torchrun",
]


@runtime_checkable
class Communicator(Protocol):
    rank: int
    size: int

    def barrier(self) -> None: ...

    def gather(self, obj: Any, root: int = 0) -> list[Any] | None:
        """Rank ``root`` gets the list of every rank's ``obj`` (in rank order); others None."""
        ...

    def bcast(self, obj: Any, root: int = 0) -> Any: ...

    def dup(self) -> Communicator:
        """A communicator over the same ranks whose messages never mix with this one's."""
        ...


class SingleProcess:
    """One rank: every collective is trivial."""

    rank = 0
    size = 1

    def barrier(self) -> None:
        return None

    def gather(self, obj: Any, root: int = 0) -> list[Any] | None:
        return [obj]

    def bcast(self, obj: Any, root: int = 0) -> Any:
        return obj

    def dup(self) -> SingleProcess:
        return self

    def __repr__(self) -> str:
        return "SingleProcess()"


T = TypeVar("T")

POLL_MIN, POLL_MAX = 20e-6, 1e-3
"""The sleeps of :func:`poll`: from 20 us, doubling, up to 1 ms."""


def poll(ready: Callable[[], T]) -> T:
    """Call ``ready`` until it returns something truthy (an MPI request's ``Test``, a matched
    probe), sleeping between tries, from :data:`POLL_MIN` doubling up to :data:`POLL_MAX`;
    returns that. Written for MPI waits: Open MPI's blocking calls spin a core while they
    wait, and on a node whose cores are busy (training, other ranks) the waiting rank takes
    CPU from the one it waits for. A wait ends at most about a millisecond after its event;
    measured on this project's 2-core VM under load: ``benchmarks/README.md`` (peer
    transport)."""
    pause = POLL_MIN
    while not (got := ready()):
        time.sleep(pause)
        pause = min(2 * pause, POLL_MAX)
    return got


class MPICommunicator:
    """An mpi4py communicator (``MPI.COMM_WORLD`` by default). Its collectives are MPI's
    non-blocking ones (``Igatherv``, ``Ibcast``, ``Ibarrier``) waited for by :func:`poll`, so
    a rank waiting for the others in a commit or a restore's planning leaves the CPU to them;
    objects travel as :func:`~ckptio.wire.encode` makes them (JSON, never pickle)."""

    def __init__(self, comm: Any = None) -> None:
        try:
            from mpi4py import MPI
        except ImportError as err:
            raise errors.BackendUnavailableError(
                "MPI ranks need mpi4py and an MPI library; pip install 'ckptio[mpi]'"
            ) from err
        self._MPI = MPI
        self.comm = comm if comm is not None else MPI.COMM_WORLD
        self.rank = int(self.comm.Get_rank())
        self.size = int(self.comm.Get_size())

    def barrier(self) -> None:
        poll(self.comm.Ibarrier().Test)

    def gather(self, obj: Any, root: int = 0) -> list[Any] | None:
        from array import array

        MPI = self._MPI
        data = encode(obj)
        sizes = array("q", bytes(8 * self.size)) if self.rank == root else None
        mine = array("q", [len(data)])
        into = None if sizes is None else [sizes, MPI.INT64_T]
        poll(self.comm.Igather([mine, MPI.INT64_T], into, root).Test)
        if sizes is None:
            poll(self.comm.Igatherv([data, MPI.BYTE], None, root).Test)
            return None
        counts = list(sizes)
        displs = [sum(counts[:r]) for r in range(self.size)]
        buf = bytearray(sum(counts))
        recv = [buf, (counts, displs), MPI.BYTE]
        poll(self.comm.Igatherv([data, MPI.BYTE], recv, root).Test)
        view = memoryview(buf)
        return [decode(view[d : d + c]) for d, c in zip(displs, counts, strict=True)]

    def bcast(self, obj: Any, root: int = 0) -> Any:
        from array import array

        MPI = self._MPI
        data = encode(obj) if self.rank == root else b""
        size = array("q", [len(data)])
        poll(self.comm.Ibcast([size, MPI.INT64_T], root).Test)
        buf = bytearray(data) if self.rank == root else bytearray(size[0])
        poll(self.comm.Ibcast([buf, MPI.BYTE], root).Test)
        return obj if self.rank == root else decode(buf)

    def dup(self) -> MPICommunicator:
        return MPICommunicator(self.comm.Dup())

    def __repr__(self) -> str:
        return f"MPICommunicator(rank={self.rank}, size={self.size})"


_MPI_ENV = (
    "OMPI_COMM_WORLD_SIZE",
    "PMI_SIZE",
    "PMIX_RANK",
    "MPI_LOCALNRANKS",
    "SLURM_PMIXP_ABORTAGENTPORT",
)


def under_mpi() -> bool:
    """True when this process was started by mpiexec/mpirun/srun with an MPI launcher."""
    return any(v in os.environ for v in _MPI_ENV)


def under_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ or (
        "RANK" in os.environ and "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ
    )


_DETECTED: Communicator | None = None


def detect() -> Communicator:
    """The communicator this process was started with: MPI under mpiexec/srun,
    torch.distributed under torchrun (when its process group is initialised, or initialised
    here with gloo), else a single process. The result is cached."""
    global _DETECTED
    if _DETECTED is not None:
        return _DETECTED
    comm: Communicator
    if under_mpi():
        comm = MPICommunicator()
    elif under_torchrun():
        comm = torch_communicator()
    else:
        comm = SingleProcess()
    _DETECTED = comm
    return comm


def shutdown() -> None:
    """Release the communicator :func:`detect` set up (a torch process group it started is
    destroyed after a last barrier); the next :func:`detect` starts afresh."""
    global _DETECTED
    comm, _DETECTED = _DETECTED, None
    close = getattr(comm, "close", None)
    if close is not None:
        close()


def torch_communicator() -> Communicator:
    """A communicator over torch.distributed's default group (gloo if not initialised)."""
    from ckptio.dist_torch import TorchCommunicator

    return TorchCommunicator()


# -- local processes (``--ranks N`` on one node) ----------------------------------------------


class RankFailedError(errors.CkptioError, RuntimeError):
    """A rank of a local-process group died or failed; the others cannot go on."""


CHANNELS = 4
"""Pipes between rank 0 and each other local-process rank: the communicator's own and one for
each :meth:`LocalProcesses.dup` (a background save's, a tiered drain's, ...)."""


class LocalProcesses:
    """Ranks as processes on this node, started by :func:`run_local` (``ckptio run --ranks N``
    without a launcher). Rank 0 is the calling process; the others are its children, each
    linked to rank 0 by :data:`CHANNELS` pipes: one for this communicator, the others taken in
    order by :meth:`dup` (every rank dups in the same order, as with MPI). Messages are
    :func:`~ckptio.wire.encode`'s JSON (never pickle); collectives go through rank 0 (gather
    to and broadcast from rank 0 only), which is all the runner needs. A rank that dies makes
    the next collective raise :class:`RankFailedError` on rank 0 (and its closed pipes do the
    same on the others)."""

    def __init__(
        self, rank: int, size: int, conns: list[Any], spare: list[list[Any]] | None = None
    ) -> None:
        self.rank = rank
        self.size = size
        self._conns = conns  # rank 0: pipes to ranks 1..size-1; others: [pipe to rank 0]
        # further channels, shared with every dup of this communicator (taken in order)
        self._spare: list[list[Any]] = spare if spare is not None else []

    def _send(self, conn: Any, obj: Any, peer: int) -> None:
        try:
            conn.send_bytes(encode(obj))
        except (OSError, EOFError) as err:
            raise RankFailedError(
                f"rank {peer} is gone (sending from rank {self.rank}): {err}"
            ) from err

    def _recv(self, conn: Any, peer: int) -> Any:
        try:
            return decode(conn.recv_bytes())
        except (OSError, EOFError) as err:
            raise RankFailedError(
                f"rank {peer} died or failed (rank {self.rank} was waiting for it)"
            ) from err

    def _root_only(self, root: int) -> None:
        if root != 0:
            raise errors.InvalidArgumentError(
                "local-process ranks gather to and broadcast from rank 0 only"
            )

    def gather(self, obj: Any, root: int = 0) -> list[Any] | None:
        self._root_only(root)
        if self.rank == 0:
            return [obj] + [self._recv(c, r) for r, c in enumerate(self._conns, start=1)]
        self._send(self._conns[0], obj, 0)
        return None

    def bcast(self, obj: Any, root: int = 0) -> Any:
        self._root_only(root)
        if self.rank == 0:
            for r, c in enumerate(self._conns, start=1):
                self._send(c, obj, r)
            return obj
        return self._recv(self._conns[0], 0)

    def barrier(self) -> None:
        self.gather(None)
        self.bcast(None)

    def dup(self) -> LocalProcesses:
        if not self._spare:
            raise errors.InvalidArgumentError(
                f"local-process ranks have {CHANNELS} channels, all in use (each background "
                "save or tiered drain takes one); use MPI or torch.distributed for more"
            )
        return LocalProcesses(self.rank, self.size, self._spare.pop(0), self._spare)

    def close(self) -> None:
        """Close this communicator's pipes and the channels no dup took."""
        for c in [*self._conns, *(c for conns in self._spare for c in conns)]:
            c.close()

    def __repr__(self) -> str:
        return f"LocalProcesses(rank={self.rank}, size={self.size})"


def _local_child(
    rank: int,
    size: int,
    conns: list[Any],
    target: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> None:
    comm = LocalProcesses(rank, size, [conns[0]], [[c] for c in conns[1:]])
    try:
        target(comm, *args, **kwargs)
    finally:
        comm.close()


def run_local(size: int, target: Any, /, *args: Any, **kwargs: Any) -> Any:
    """Run ``target(comm, *args, **kwargs)`` on ``size`` ranks of this node: rank 0 in this
    process, ranks 1.. in fresh child processes (``spawn``: nothing of this process's threads
    or locks is inherited). ``target`` must be a module-level function and the arguments
    importable/picklable for the start of the children. Returns rank 0's result; raises
    :class:`RankFailedError` if any child failed (after rank 0 finished or failed)."""
    import multiprocessing as mp

    if size < 1:
        raise errors.InvalidArgumentError(f"ranks must be >= 1, got {size}")
    if size == 1:
        return target(SingleProcess(), *args, **kwargs)
    ctx = mp.get_context("spawn")
    channels: list[list[Any]] = [[] for _ in range(CHANNELS)]  # per channel: a pipe per rank
    procs = []
    try:
        for r in range(1, size):
            pipes = [ctx.Pipe(duplex=True) for _ in range(CHANNELS)]
            p = ctx.Process(
                target=_local_child,
                args=(r, size, [child for _, child in pipes], target, args, kwargs),
                name=f"ckptio-rank-{r}",
                daemon=True,
            )
            p.start()
            for ch, (parent, child) in zip(channels, pipes, strict=True):
                child.close()
                ch.append(parent)
            procs.append(p)
        comm = LocalProcesses(0, size, channels[0], channels[1:])
        try:
            result = target(comm, *args, **kwargs)
        finally:
            for conns in channels:  # the dups' pipes too: every channel is this function's
                for c in conns:
                    c.close()
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
                p.join()
    failed = [(r, p.exitcode) for r, p in enumerate(procs, start=1) if p.exitcode != 0]
    if failed:
        raise RankFailedError(
            "rank(s) failed: " + ", ".join(f"rank {r} (exit code {code})" for r, code in failed)
        )
    return result
