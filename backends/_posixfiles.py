"""Files on a POSIX filesystem, as the local stores (``file://``, ``pfs://``) see them: OS
errors translated into ckptio's (naming the path, and for a refusal the directory at fault),
regular files opened without following links or blocking on a FIFO, and the mark every temp
file carries."""

from __future__ import annotations

import errno
import os
import stat

from ckptio import errors

__all__ = [
    "TMP_MARK",
    "not_regular",
    "open_regular",
    "open_regular_raw",
    "os_error",
    "why_unwritable",
]

TMP_MARK = ".ckptio-tmp-"
"""Every temp file has this in its name; ``list`` hides them and ``gc`` removes them."""


def os_error(err: OSError, path: str, action: str) -> errors.CkptioError:
    """Translate an OSError into the ckptio error a user should see, naming the path."""
    reason = os.strerror(err.errno) if err.errno else str(err)
    msg = f"cannot {action} {path}: {reason}"
    code = err.errno
    if code == errno.ENOENT:
        return errors.NotFoundError(code, msg, path)
    if code == errno.EEXIST:
        return errors.AlreadyExistsError(code, msg, path)
    if code in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        return errors.NoSpaceError(code, msg, path)
    if code in (errno.EACCES, errno.EPERM, errno.EROFS):
        return errors.StoragePermissionError(code, f"{msg}: {why_unwritable(path, code)}", path)
    return errors.StorageError(code, msg, path)


def why_unwritable(path: str, code: int | None = None) -> str:
    """Why this process may not write ``path``, naming the directory (or file) at fault: the
    nearest existing directory on the way that it may not write into (its owner and mode), or
    the read-only filesystem that holds it."""
    cur = path
    while not os.path.isdir(cur):
        parent = os.path.dirname(cur)
        if parent == cur:
            break
        cur = parent
    if code == errno.EROFS:
        return f"{cur} is on a read-only filesystem; remount it read-write or choose another path"
    uid = os.geteuid() if hasattr(os, "geteuid") else None
    for where in (cur, *((path,) if os.path.isfile(path) else ())):
        if not os.access(where, os.W_OK | (os.X_OK if where == cur else 0), effective_ids=True):
            st = os.stat(where)
            kind = "directory" if where == cur else "file"
            return (
                f"{kind} {where} is not writable by this process (uid {uid}; owner uid "
                f"{st.st_uid}, mode {stat.filemode(st.st_mode)}): make it writable "
                "(chmod/chown) or choose another path"
            )
    return (
        f"refused although {cur} looks writable (an ACL, an immutable attribute, a security "
        "module or the filesystem's own permissions)"
    )


_KINDS = {
    stat.S_IFIFO: "a FIFO",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFDIR: "a directory",
    stat.S_IFLNK: "a symbolic link",
}


def not_regular(path: str, mode: int) -> errors.NotRegularFileError:
    """The refusal of anything but a regular file where an object should be: no object is
    there (a :class:`~ckptio.errors.NotFoundError`, as on an object store), and nothing is
    read from or written to it."""
    kind = _KINDS.get(stat.S_IFMT(mode), "not a regular file")
    err = errors.NotRegularFileError(
        errno.ENOENT, f"refusing {path}: it is {kind}, not a regular file", path
    )
    err.mode = mode
    return err


def open_regular_raw(path: str, flags: int, mode: int = 0o644) -> int:
    """``os.open(path, flags | O_NOFOLLOW, mode)`` that refuses (:func:`not_regular`) anything
    but a regular file without blocking: opened ``O_NONBLOCK`` (a FIFO would otherwise block
    the open until a writer comes), checked with ``fstat``, then made blocking again. Other
    errors are the OSError of ``open``."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK, mode)
    except OSError as err:
        if err.errno == errno.ELOOP:  # O_NOFOLLOW met a symlink
            raise not_regular(path, stat.S_IFLNK) from err
        raise
    try:
        kind = os.fstat(fd).st_mode
        if not stat.S_ISREG(kind):
            raise not_regular(path, kind)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_regular(path: str, flags: int, action: str = "open", *, name: str | None = None) -> int:
    """:func:`open_regular_raw`, its errors ckptio's (:func:`os_error`), naming ``name``
    (default: ``path``)."""
    name = name or path
    try:
        return open_regular_raw(path, flags)
    except errors.NotRegularFileError as err:
        raise not_regular(name, err.mode) from None
    except OSError as err:
        raise os_error(err, name, action) from err
