"""Cold reads of the local stores: how a read can miss the page cache on this machine
(``o_direct``, ``fadvise``), what ``ckptio run`` uses to measure a cold restore
(:class:`~ckptio.store.ColdReads`)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ckptio import errors
from ckptio.store import ColdReads

from ._posixfiles import open_regular

if TYPE_CHECKING:
    from .local import LocalStore

__all__ = ["LocalColdReads", "drop_cache"]


def drop_cache(store: LocalStore, key: str) -> bool:
    """Ask the kernel to drop ``key``'s cached pages (``posix_fadvise DONTNEED``), so the
    next read comes from the device. Returns False where that is not possible."""
    try:
        fd = open_regular(store.read_path(key), os.O_RDONLY)
    except errors.CkptioError:
        return False
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        return True
    except (OSError, AttributeError):
        return False
    finally:
        os.close(fd)


class LocalColdReads(ColdReads):
    """Cold reads of a :class:`LocalStore`: ``o_direct`` turns the store's ``direct_read`` on
    until :meth:`end`; ``fadvise`` drops the cached pages of every key
    (:func:`drop_cache`)."""

    def __init__(self, store: LocalStore) -> None:
        self._store = store
        self._direct_before: bool | None = None
        """``direct_read`` before :meth:`start` switched it on (None: not switched)."""

    @property
    def modes(self) -> tuple[str, ...]:
        direct = ("o_direct",) if self._store.capabilities.direct_io else ()
        return (*direct, "fadvise") if hasattr(os, "posix_fadvise") else direct

    def start(self, keys: Sequence[str], mode: str) -> str:
        store = self._store
        if mode not in self.modes:
            raise self.refuse(mode, store.name)
        if mode == "o_direct":
            if self._direct_before is None:
                self._direct_before = store.direct_read
            store.direct_read = True
            return mode
        done = [drop_cache(store, k) for k in keys]
        return mode if done and all(done) else "none" if any(done) else ""

    def end(self) -> bool:
        """False where the filesystem refused O_DIRECT during the reads (``direct_read`` then
        stays off: later reads go buffered at once); else ``direct_read`` is as it was."""
        before, self._direct_before = self._direct_before, None
        if before is None:
            return True
        store = self._store
        held = store.direct_read
        if held:
            store.direct_read = before
        return held
