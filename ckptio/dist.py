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
from typing import Any, Protocol, runtime_checkable

from ckptio import errors


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


class MPICommunicator:
    """An mpi4py communicator (``MPI.COMM_WORLD`` by default)."""

    def __init__(self, comm: Any = None) -> None:
        try:
            from mpi4py import MPI
        except ImportError as err:
            raise errors.BackendUnavailableError(
                "MPI ranks need mpi4py and an MPI library; pip install 'ckptio[mpi]'"
            ) from err
        self.comm = comm if comm is not None else MPI.COMM_WORLD
        self.rank = int(self.comm.Get_rank())
        self.size = int(self.comm.Get_size())

    def barrier(self) -> None:
        self.comm.Barrier()

    def gather(self, obj: Any, root: int = 0) -> list[Any] | None:
        return self.comm.gather(obj, root=root)  # type: ignore[no-any-return]

    def bcast(self, obj: Any, root: int = 0) -> Any:
        return self.comm.bcast(obj, root=root)

    def dup(self) -> MPICommunicator:
        return MPICommunicator(self.comm.Dup())

    def __repr__(self) -> str:
        return f"MPICommunicator(rank={self.rank}, size={self.size})"


_MPI_ENV = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS", "SLURM_PMIXP_ABORTAGENTPORT")


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


def torch_communicator() -> Communicator:
    """A communicator over torch.distributed's default group (gloo if not initialised)."""
    from ckptio.dist_torch import TorchCommunicator

    return TorchCommunicator()
