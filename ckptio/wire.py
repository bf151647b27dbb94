"""What a collective's object is on the wire, for every communicator (:mod:`ckptio.dist`,
:mod:`ckptio.dist_torch`): compact JSON, never pickle. A rank that unpickled what another
process sent would run whatever that process put there, and a load never unpickles."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["decode", "encode"]


def encode(obj: Any) -> bytes:
    """``obj`` as compact JSON bytes: tuples arrive as lists, dict keys as strings; an object
    JSON cannot hold is refused (``TypeError``), never pickled."""
    return json.dumps(obj, separators=(",", ":")).encode()


def decode(data: bytes | bytearray | memoryview) -> Any:
    """The object :func:`encode` sent (``ValueError`` for anything else, a pickle included)."""
    return json.loads(bytes(data))
