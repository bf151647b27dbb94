"""ckptio: checkpoint I/O for AI training.

One API to save and load sharded checkpoints on local disks, parallel filesystems and object
storage; a suite that runs the same checkpoint workload against each and explains the
difference. See README.md.
"""

from ckptio.checkpoint import (
    CheckpointReader,
    Checkpointer,
    SaveHandle,
    SaveResult,
    Shard,
    collect_garbage,
    load,
    open_checkpoint,
    save,
    verify,
)
from ckptio.errors import CkptioError
from ckptio.registry import open_store
from ckptio.store import Capabilities, Store, Writer

__version__ = "0.1.0"

__all__ = [
    "Capabilities",
    "CheckpointReader",
    "Checkpointer",
    "CkptioError",
    "SaveHandle",
    "SaveResult",
    "Shard",
    "Store",
    "Writer",
    "__version__",
    "collect_garbage",
    "load",
    "open_checkpoint",
    "open_store",
    "save",
    "verify",
]
