"""Durable directories of the local stores: every directory a store creates (a step's, the
root and its missing parents) is made durable in its parent before the first object under it
is reported durable.

The parents are fsynced when a writer or a publish that created them completes, after its own
file's fsync (:meth:`DurableDirs.make`, :meth:`DurableDirs.sync_new`). An fsync at the mkdir
itself would cost a journal commit per directory in the save's critical path, before any byte
is written; after the file's fsync, the journal already holds the new entries and the
directory's fsync finds little to do.
"""

from __future__ import annotations

import errno
import os
import stat
import time

from ckptio import errors

from ._posixfiles import open_regular_raw

__all__ = ["DurableDirs", "fsync_dir"]

MKDIR_RACE_SECONDS = 10.0
"""How long :meth:`DurableDirs.make` waits for a directory whose ``mkdir`` failed with one
of :data:`RACED` to be seen as one (:func:`_await_directory`)."""

RACED = (errno.EEXIST, errno.ESTALE, errno.ENODATA)
"""What ``mkdir`` answers where another client makes the same directory at the same moment:
EEXIST everywhere, and on GlusterFS also ESTALE and ENODATA."""


def fsync_dir(path: str) -> None:
    """fsync a directory: the entries created in it (files renamed into place, directories
    made) become durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class DurableDirs:
    """The directories one store made: which are known to exist (so a save pays for each new
    directory once, not per object), and which gained an entry not yet fsynced. ``durable``
    False (a store with ``fsync`` off): directories are made, never fsynced."""

    def __init__(self, *, durable: bool) -> None:
        self.durable = durable
        self._known: set[str] = set()
        """Directories known to exist."""
        self._unsynced: set[str] = set()
        """Directories with an entry created here and not yet fsynced (see :meth:`sync_new`)."""

    def make(self, directory: str) -> None:
        """Create ``directory`` and its missing parents. With ``durable``, the parent of every
        directory this creates, at every level (a step's directories, the root, the root's
        own missing parents), is noted for :meth:`sync_new`, which the writer or publish that
        needed the directory calls once its own data is durable. A directory another writer
        created at the same moment (``EEXIST``) gets its parent noted too, since that writer
        may not have synced it yet."""
        if directory in self._known:
            return
        missing: list[str] = []
        d = directory
        while d not in self._known and not os.path.isdir(d):
            missing.append(d)
            parent = os.path.dirname(d)
            if parent == d:
                break
            d = parent
        for d in reversed(missing):
            try:
                os.mkdir(d)
            except OSError as err:
                if err.errno not in RACED:
                    raise
                _await_directory(d, err)
            self.new_entry(os.path.dirname(d))
        self._known.add(directory)

    def new_entry(self, directory: str) -> None:
        """Note that ``directory`` gained an entry that must be made durable (with
        ``durable``) before whatever is written under it is reported durable."""
        if self.durable:
            self._unsynced.add(directory)

    def sync_new(self) -> None:
        """fsync every directory noted by :meth:`new_entry`, deepest first. Called by a
        writer's ``close`` and by ``publish`` after their own fsync, so a save that returns
        has every directory it created durable in its parent."""
        while self._unsynced:
            pending = sorted(self._unsynced, key=len, reverse=True)
            for d in pending:
                fsync_dir(d)
                self._unsynced.discard(d)

    def removed(self, directory: str) -> None:
        """``directory`` was removed (an empty directory pruned): made again when needed."""
        self._known.discard(directory)

    def open_creating(self, path: str, flags: int) -> int:
        """``os.open(path, flags, 0o644)`` (a regular file, :func:`open_regular_raw`) after
        :meth:`make` of its directory. A known directory removed since (retention or gc
        pruning empty directories, here or in another process) is created again, once."""
        directory = os.path.dirname(path)
        self.make(directory)
        try:
            return open_regular_raw(path, flags)
        except errors.NotRegularFileError:
            raise
        except FileNotFoundError:
            self._known.clear()
            self.make(directory)
            return open_regular_raw(path, flags)


def _await_directory(path: str, err: OSError) -> None:
    """Return once ``path``, whose ``mkdir`` here failed with ``err`` (one of
    :data:`RACED`), is seen as a directory; raise ``err`` if something else is there, or if
    none is seen within :data:`MKDIR_RACE_SECONDS`.

    On a local filesystem EEXIST means the directory is there. On a distributed one it can
    mean that another client's ``mkdir`` of it is still under way: GlusterFS's DHT creates a
    directory on each brick in turn, and a lookup between two of them misses it (ENOENT or
    ESTALE); the ``mkdir`` itself can fail with ESTALE or ENODATA then. Ranks on several
    nodes making one step's directory at once met all of these, and a save failed with
    "File exists". So the lookup is repeated, and the ``mkdir`` too (the other client's may
    have been undone); a file in the way fails at once."""
    deadline = time.monotonic() + MKDIR_RACE_SECONDS
    pause = 0.002
    while True:
        try:
            mode = os.stat(path).st_mode
        except OSError as missed:
            if missed.errno not in (errno.ENOENT, *RACED):
                raise
        else:
            if stat.S_ISDIR(mode):
                return
            raise err
        if time.monotonic() > deadline:
            raise err
        time.sleep(pause)
        pause = min(pause * 2, 0.1)
        try:
            os.mkdir(path)
            return
        except OSError as again:
            if again.errno not in RACED:
                raise
