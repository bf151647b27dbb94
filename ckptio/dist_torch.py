"""torch.distributed as a :class:`ckptio.dist.Communicator` (used under ``torchrun``)."""

from __future__ import annotations

from typing import Any

from ckptio import errors

__all__ = ["TorchCommunicator"]


class TorchCommunicator:
    """Collectives through ``torch.distributed`` object collectives (gloo works on CPU)."""

    def __init__(self, group: Any = None) -> None:
        try:
            import torch.distributed as tdist
        except ImportError as err:
            raise errors.BackendUnavailableError(
                "torchrun ranks need torch; pip install 'ckptio[torch]'"
            ) from err
        #: True when this object started the default group, so :meth:`close` ends it.
        self.owns_group = False
        if not tdist.is_initialized():
            tdist.init_process_group(backend="gloo")
            self.owns_group = True
        self._dist = tdist
        self.group = group
        self.rank = int(tdist.get_rank(group))
        self.size = int(tdist.get_world_size(group))

    def barrier(self) -> None:
        self._dist.barrier(group=self.group)

    def gather(self, obj: Any, root: int = 0) -> list[Any] | None:
        out: list[Any] | None = [None] * self.size if self.rank == root else None
        self._dist.gather_object(obj, out, dst=root, group=self.group)
        return out

    def bcast(self, obj: Any, root: int = 0) -> Any:
        box = [obj]
        self._dist.broadcast_object_list(box, src=root, group=self.group)
        return box[0]

    def dup(self) -> TorchCommunicator:
        return TorchCommunicator(self._dist.new_group(backend="gloo"))

    def close(self) -> None:
        """End the process group this communicator started (a no-op otherwise). Every rank
        waits for the others first: a gloo rank that exits while its peers still talk to it,
        or whose group outlives the interpreter, can abort in C++ ("terminate called without
        an active exception") and fail the whole torchrun job."""
        if self.owns_group and self._dist.is_initialized():
            self._dist.barrier()
            self._dist.destroy_process_group()
            self.owns_group = False

    def __repr__(self) -> str:
        return f"TorchCommunicator(rank={self.rank}, size={self.size})"
