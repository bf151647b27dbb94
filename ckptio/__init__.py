"""ckptio: checkpoint I/O for AI training.

One API to save and load sharded checkpoints on local disks, parallel filesystems and object
storage; a suite that runs the same checkpoint workload against each and explains the
difference. See README.md and docs/.

The public names below are imported on first use (PEP 562), so ``import ckptio`` and CLI
commands that need no array machinery (``ckptio plan``, ``ckptio model``) start fast.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "CheckpointReader": "ckptio.checkpoint",
    "Checkpointer": "ckptio.checkpoint",
    "Codec": "ckptio.checkpoint",
    "SaveHandle": "ckptio.checkpoint",
    "SaveResult": "ckptio.checkpoint",
    "aligned_empty": "ckptio.checkpoint",
    "Shard": "ckptio.checkpoint",
    "collect_garbage": "ckptio.checkpoint",
    "load": "ckptio.checkpoint",
    "open_checkpoint": "ckptio.checkpoint",
    "save": "ckptio.checkpoint",
    "verify": "ckptio.checkpoint",
    "CkptioError": "ckptio.errors",
    "open_store": "ckptio.registry",
    "Capabilities": "ckptio.store",
    "Store": "ckptio.store",
    "Writer": "ckptio.store",
}

__all__ = [
    "Capabilities",
    "CheckpointReader",
    "Checkpointer",
    "CkptioError",
    "Codec",
    "SaveHandle",
    "SaveResult",
    "Shard",
    "Store",
    "Writer",
    "__version__",
    "aligned_empty",
    "collect_garbage",
    "load",
    "open_checkpoint",
    "open_store",
    "save",
    "verify",
]

if TYPE_CHECKING:
    from ckptio.checkpoint import (
        Checkpointer,
        CheckpointReader,
        Codec,
        SaveHandle,
        SaveResult,
        Shard,
        aligned_empty,
        collect_garbage,
        load,
        open_checkpoint,
        save,
        verify,
    )
    from ckptio.errors import CkptioError
    from ckptio.registry import open_store
    from ckptio.store import Capabilities, Store, Writer


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'ckptio' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The public API only (:data:`__all__`): not the helpers of this module, nor the submodules
    that importing them binds here."""
    return sorted(__all__)
