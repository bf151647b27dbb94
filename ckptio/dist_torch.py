"""torch.distributed as a :class:`ckptio.dist.Communicator` (used under ``torchrun``)."""

from __future__ import annotations

from typing import Any

from ckptio import errors
from ckptio.wire import decode, encode

__all__ = ["TorchCommunicator"]


class TorchCommunicator:
    """Collectives through ``torch.distributed`` (gloo works on CPU). Objects travel as
    :func:`ckptio.wire.encode` makes them, in uint8 tensors: torch's object collectives
    (``gather_object``, ``broadcast_object_list``) pickle, and a rank would unpickle what
    another process sent."""

    def __init__(self, group: Any = None) -> None:
        try:
            import torch
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
        backend = tdist.get_backend(group)
        self._device = (
            torch.device("cuda", torch.cuda.current_device())
            if backend == "nccl"
            else torch.device("cpu")
        )
        self.rank = int(tdist.get_rank(group))
        self.size = int(tdist.get_world_size(group))

    def barrier(self) -> None:
        self._dist.barrier(group=self.group)

    def _bytes(self, data: bytes, length: int) -> Any:
        import torch

        out = torch.zeros(length, dtype=torch.uint8, device=self._device)
        if data:
            out[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        return out

    def gather(self, obj: Any, root: int = 0) -> list[Any] | None:
        import torch

        data = encode(obj)
        sizes = [torch.zeros(1, dtype=torch.int64, device=self._device) for _ in range(self.size)]
        mine = torch.tensor([len(data)], dtype=torch.int64, device=self._device)
        self._dist.all_gather(sizes, mine, group=self.group)
        counts = [int(t.item()) for t in sizes]
        longest = max(counts)
        every = [self._bytes(b"", longest) for _ in range(self.size)]
        self._dist.all_gather(every, self._bytes(data, longest), group=self.group)
        if self.rank != root:
            return None
        return [decode(t[:n].cpu().numpy().tobytes()) for t, n in zip(every, counts, strict=True)]

    def bcast(self, obj: Any, root: int = 0) -> Any:
        import torch

        data = encode(obj) if self.rank == root else b""
        size = torch.tensor([len(data)], dtype=torch.int64, device=self._device)
        self._dist.broadcast(size, src=root, group=self.group)
        buf = self._bytes(data, int(size.item()))
        self._dist.broadcast(buf, src=root, group=self.group)
        return obj if self.rank == root else decode(buf.cpu().numpy().tobytes())

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
