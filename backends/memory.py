"""In-process storage: ``memory://name``. The upper bound of what the layers above cost.

Stores with the same name share their objects within one process (a save and a later load
through different Store objects see the same data). Nothing survives the process.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import ClassVar, Unpack

from ckptio import errors
from ckptio.registry import parse_url
from ckptio.store import Buffer, Capabilities, NoOptions, Store, Writer, check_key
from ckptio.trace import Trace

__all__ = ["MemoryStore", "clear_all"]

_SPACES: dict[str, dict[str, bytes]] = {}
_SPACES_LOCK = threading.Lock()


def _space(name: str) -> dict[str, bytes]:
    with _SPACES_LOCK:
        return _SPACES.setdefault(name, {})


def clear_all() -> None:
    """Forget every memory store of this process (for tests)."""
    with _SPACES_LOCK:
        for space in _SPACES.values():
            space.clear()


class _MemoryWriter(Writer):
    def __init__(self, store: MemoryStore, key: str) -> None:
        self.key = key
        self._store = store
        self._parts: list[memoryview] = []
        self._nbytes = 0
        self._done = False

    def write(self, data: Buffer) -> None:
        if self._done:
            raise errors.InvalidArgumentError(f"write to {self.key!r} after close/abort")
        view = memoryview(data).cast("B")
        self._parts.append(view)
        self._nbytes += view.nbytes

    def close(self) -> None:
        if self._done:
            return
        with self._store.trace.request("commit", self.key, self._nbytes, backend="memory"):
            blob = b"".join(self._parts)
            self._parts.clear()
            with self._store._lock:
                self._store._objects[self._store._full(self.key)] = blob
        self._done = True

    def abort(self) -> None:
        self._parts.clear()
        self._done = True


class MemoryStore(Store):
    """Objects in a process-wide dictionary.

    Options: none (``trace`` aside). The URL's host part names the space (``memory://run1``); ``memory://``
    alone is the default space, and a path after the host is a prefix inside it.
    """

    schemes: ClassVar[tuple[str, ...]] = ("memory",)
    name: ClassVar[str] = "memory"
    capabilities: ClassVar[Capabilities] = Capabilities(
        atomic_rename=False,
        range_reads=True,
        durable_flush=False,
        conditional_create=True,
        multipart=False,
        listing=True,
        positional_writes=False,
        shared=False,
    )

    _lock = _SPACES_LOCK

    def __init__(
        self, url: str, *, trace: Trace | None = None, **unknown: Unpack[NoOptions]
    ) -> None:
        if unknown:
            raise errors.UnknownOptionError("memory://", unknown, [("memory://", ())])
        super().__init__(url, trace=trace)
        loc = parse_url(url)
        self._objects = _space(loc.host)
        self._prefix = loc.prefix + "/" if loc.prefix else ""

    def _full(self, key: str) -> str:
        return self._prefix + check_key(key)

    def open_writer(self, key: str, *, size_hint: int | None = None) -> Writer:
        check_key(key)
        return _MemoryWriter(self, key)

    def publish(self, key: str, data: bytes, *, overwrite: bool = True) -> None:
        full = self._full(key)
        with self.trace.request("put", key, len(data), backend=self.name), self._lock:
            if not overwrite and full in self._objects:
                raise errors.AlreadyExistsError(f"memory://{full} already exists")
            self._objects[full] = bytes(data)

    def _blob(self, key: str) -> bytes:
        try:
            return self._objects[self._full(key)]
        except KeyError:
            raise errors.NotFoundError(f"{self.url}: no object {key!r}") from None

    def read_into(self, key: str, offset: int, buffer: Buffer) -> int:
        out = memoryview(buffer).cast("B")
        with self.trace.request("get", key, 0, backend=self.name) as ev:
            blob = self._blob(key)
            if offset < 0:
                raise errors.InvalidArgumentError(f"negative offset {offset} for {key!r}")
            chunk = blob[offset : offset + out.nbytes]
            out[: len(chunk)] = chunk
            ev.nbytes = len(chunk)
        return len(chunk)

    def list(self, prefix: str = "") -> list[str]:
        with self.trace.request("list", prefix, backend=self.name), self._lock:
            full = self._prefix + prefix
            n = len(self._prefix)
            return sorted(k[n:] for k in self._objects if k.startswith(full))

    def size(self, key: str) -> int:
        with self.trace.request("head", key, backend=self.name):
            return len(self._blob(key))

    def delete(self, keys: Iterable[str]) -> None:
        for key in keys:
            with self.trace.request("delete", key, backend=self.name), self._lock:
                self._objects.pop(self._full(key), None)
