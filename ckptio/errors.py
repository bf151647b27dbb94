"""ckptio's exceptions.

Every error is a :class:`CkptioError` *and* the built-in a caller would expect, so
``except FileNotFoundError`` keeps working around ckptio calls (the zarr-python habit).
Vendor errors are translated at the backend boundary with ``raise ... from err`` so the
original cause stays on ``__cause__``.
"""

from __future__ import annotations

from collections.abc import Iterable
from types import ModuleType

from ckptio.redact import redact

__all__ = [
    "AlreadyExistsError",
    "BackendUnavailableError",
    "ChecksumError",
    "CkptioError",
    "CorruptCheckpointError",
    "DamagedCheckpointWarning",
    "InsufficientMemoryError",
    "InvalidArgumentError",
    "ManifestError",
    "NoSpaceError",
    "NotFoundError",
    "NotRegularFileError",
    "RetryBudgetExceededError",
    "SaveFailedError",
    "StorageError",
    "StoragePermissionError",
    "ThrottledError",
    "TransientStorageError",
    "UnknownOptionError",
    "UnknownSchemeError",
    "missing_package",
    "require",
]


class CkptioError(Exception):
    """Base class of every error ckptio raises on purpose. Its message never holds a
    credential: every string argument goes through :func:`ckptio.redact.redact`."""

    def __init__(self, *args: object) -> None:
        super().__init__(*(redact(a) if isinstance(a, str) else a for a in args))


class InvalidArgumentError(CkptioError, ValueError):
    """A caller passed something ckptio cannot use; the message names it and what is valid."""


class NotFoundError(CkptioError, FileNotFoundError):
    """A key, object, checkpoint or bucket does not exist."""


class NotRegularFileError(NotFoundError):
    """Something other than a regular file (a FIFO, socket, device, directory or symlink) lies
    where an object should be: refused without being opened for I/O (no read can block on it)."""

    mode: int = 0
    """The ``st_mode`` of what was found."""


class AlreadyExistsError(CkptioError, FileExistsError):
    """A create-if-absent write found the object already there (another writer won)."""


class StorageError(CkptioError, OSError):
    """The storage refused or failed a request permanently (after retries, if any)."""


class TransientStorageError(StorageError):
    """A failure worth retrying: 5xx, connection reset, timeout. Raised past the retry
    budget only through :class:`RetryBudgetExceededError`."""


class ThrottledError(TransientStorageError):
    """The service asked the client to slow down (S3 503 SlowDown, GCS 429, Azure 503)."""


class RetryBudgetExceededError(StorageError):
    """A request kept failing transiently until the retry budget ran out."""


class StoragePermissionError(StorageError, PermissionError):
    """Access denied: wrong credentials, read-only filesystem, missing permission."""


class NoSpaceError(StorageError):
    """The storage is full (ENOSPC, EDQUOT, quota exceeded)."""


class CorruptCheckpointError(CkptioError, ValueError):
    """What was read back is not what was written: a bad manifest, a torn or altered object."""


class ManifestError(CorruptCheckpointError):
    """A manifest failed validation. ``field`` names the offending field (a JSON path)."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        self.field = field
        super().__init__(f"{field}: {message}" if field else message)


class ChecksumError(CorruptCheckpointError):
    """A CRC32C mismatch; the message names the object and byte range."""


class BackendUnavailableError(CkptioError, ImportError):
    """An optional dependency is not installed; the message gives the pip extra."""


class UnknownOptionError(InvalidArgumentError):
    """Options nobody takes. The message suggests the closest valid name for each and lists
    the valid ones, per taker (``groups``: ``(taker, names)`` pairs, e.g. the Checkpointer's
    own options and its store's); :meth:`widened` adds a caller's own options."""

    def __init__(
        self, where: str, unknown: Iterable[str], groups: Iterable[tuple[str, Iterable[str]]]
    ) -> None:
        self.where = where
        self.unknown = sorted(unknown)
        self.groups = [(taker, sorted(set(names))) for taker, names in groups]
        super().__init__(self._message())

    def _message(self) -> str:
        import difflib  # error path only

        valid = [n for _, names in self.groups for n in names]
        hints = []
        for name in self.unknown:
            close = difflib.get_close_matches(name, valid, n=1, cutoff=0.6)
            if close:
                hints.append(
                    f"did you mean {close[0]!r}"
                    + (f" for {name!r}" if len(self.unknown) > 1 else "")
                    + "?"
                )
        text = f"{self.where}: unknown option(s) {', '.join(map(repr, self.unknown))}"
        if hints:
            text += f" ({'; '.join(hints)})"
        groups = [(t, n) for t, n in self.groups if n]
        if not groups:
            return text + f"; {self.groups[0][0] if self.groups else self.where} takes no options"
        if len(groups) == 1:
            return text + f"; valid options: {', '.join(groups[0][1])}"
        return text + "; valid options " + "; ".join(f"of {t}: {', '.join(n)}" for t, n in groups)

    def widened(
        self, taker: str, names: Iterable[str], where: str | None = None
    ) -> UnknownOptionError:
        """The same refusal as seen by ``taker`` (at ``where``, default: the same place),
        which takes ``names`` itself and passes the rest on (to the store that refused them)."""
        return UnknownOptionError(where or self.where, self.unknown, [(taker, names), *self.groups])


class UnknownSchemeError(InvalidArgumentError):
    """No backend serves this URL scheme; the message lists the schemes that exist."""


class InsufficientMemoryError(CkptioError, MemoryError):
    """A load needs more memory than this machine (or its cgroup) can give; refused before
    anything is allocated. The message gives both sizes."""


class SaveFailedError(CkptioError, RuntimeError):
    """A checkpoint save failed (on this rank or another); nothing was committed."""


class DamagedCheckpointWarning(UserWarning):
    """A load of the newest checkpoint skipped a newer one that is damaged (an object its
    manifest names is missing, unreadable or fails its CRC) and loaded an older one; the
    message names the skipped step and the object."""


def missing_package(
    err: ImportError, *, purpose: str, extra: str = "", install: str = ""
) -> BackendUnavailableError:
    """The error for ``err`` (an optional package not installed) met while ``purpose`` needed
    it: names the missing module and what installs it, ckptio's pip ``extra`` or the command
    ``install`` (raise it ``from err``)."""
    name = err.name or str(err)
    hint = install or f"pip install 'ckptio[{extra}]'"
    return BackendUnavailableError(
        f"{purpose} needs the Python package {name.partition('.')[0]!r}, which is not "
        f"installed; {hint}"
    )


def require(module: str, *, extra: str, purpose: str) -> ModuleType:
    """Import ``module`` where an optional feature first uses it; when it (or a package it
    needs) is not installed, :class:`BackendUnavailableError` naming the pip extra."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise missing_package(err, extra=extra, purpose=purpose) from err
