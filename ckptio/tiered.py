"""The old import path of tiered checkpoints, kept for users who import it:
:mod:`ckptio.checkpoint.tiered` (the two-tier engine), :mod:`ckptio.checkpoint.drain` (the
copy to the durable tier) and :mod:`ckptio.checkpoint.fastroot` (the fast tier) hold the code.
``ckptio.Checkpointer(url, local=...)`` is the public way to build one."""

from ckptio.checkpoint.drain import DrainHandle, DrainResult, object_rank
from ckptio.checkpoint.fastroot import OWNER_KEY, claim_fast_root
from ckptio.checkpoint.tiered import (
    BACKPRESSURE,
    TieredCheckpointer,
    TieredSaveHandle,
    read_first_intact,
    tiered_checkpointer,
)

__all__ = [
    "BACKPRESSURE",
    "OWNER_KEY",
    "DrainHandle",
    "DrainResult",
    "TieredCheckpointer",
    "TieredSaveHandle",
    "claim_fast_root",
    "object_rank",
    "read_first_intact",
    "tiered_checkpointer",
]
