"""ckptio's exceptions.

Every error is a :class:`CkptioError` *and* the built-in a caller would expect, so
``except FileNotFoundError`` keeps working around ckptio calls (the zarr-python habit).
Vendor errors are translated at the backend boundary with ``raise ... from err`` so the
original cause stays on ``__cause__``.
"""

from __future__ import annotations

from ckptio.redact import redact


class CkptioError(Exception):
    """Base class of every error ckptio raises on purpose. Its message never holds a
    credential: every string argument goes through :func:`ckptio.redact.redact`."""

    def __init__(self, *args: object) -> None:
        super().__init__(*(redact(a) if isinstance(a, str) else a for a in args))


class InvalidArgumentError(CkptioError, ValueError):
    """A caller passed something ckptio cannot use; the message names it and what is valid."""


class NotFoundError(CkptioError, FileNotFoundError):
    """A key, object, checkpoint or bucket does not exist."""


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
    """A backend's optional dependency is not installed; the message gives the pip extra."""


class UnknownSchemeError(InvalidArgumentError):
    """No backend serves this URL scheme; the message lists the schemes that exist."""


class SaveFailedError(CkptioError, RuntimeError):
    """A checkpoint save failed (on this rank or another); nothing was committed."""
