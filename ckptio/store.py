"""The Store contract: the one interface every storage backend implements.

Everything above it (checkpoint format, library API, runner) is written once against this
interface and branches on :class:`Capabilities`, never on the backend's type.

Sequence of calls for a checkpoint save (all ranks, then rank 0)::

    w = store.open_writer("step-0000000100/data/rank-00000.bin")   # each rank
    w.write(buf1); w.write(buf2); ...                              # queued, not copied
    w.close()                                                      # durable + visible
    store.publish("step-0000000100/manifest.json", data)           # rank 0, last

Keys are ``/``-separated, relative to the store's root URL, never start with ``/`` and never
contain ``..`` segments (:func:`check_key` enforces it).
"""

from __future__ import annotations

import builtins
import random
import re
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, ClassVar, Self, TypedDict, TypeVar

from ckptio import errors
from ckptio.redact import redact_url
from ckptio.trace import Trace
from ckptio.units import MAX_COUNT, parse_count

__all__ = [
    "DEFAULT_RETRY_POLICY",
    "NO_COLD_READS",
    "Buffer",
    "Capabilities",
    "ColdReads",
    "ObjectStat",
    "PositionalWriter",
    "RetryPolicy",
    "Store",
    "StoreInfo",
    "StoreURL",
    "Writer",
    "as_byte_view",
    "check_key",
    "no_layout",
    "option_bool",
    "option_int",
    "wait_all",
]

T = TypeVar("T")


@dataclass(frozen=True)
class ObjectStat:
    """What the storage says about one object (:meth:`Store.stat`)."""

    size: int
    """Bytes."""
    modified: float | None = None
    """Unix seconds of the object's last write *by the storage's clock* (an object store's
    ``LastModified``; a filesystem's mtime, stamped by its kernel or server), or None where a
    backend cannot tell. Ages compared with it do not depend on the writer's clock (see
    :mod:`ckptio.lease`)."""


@dataclass(frozen=True)
class StoreURL:
    """A storage URL taken apart by :func:`ckptio.registry.parse_url`, the one parser every
    backend reads its URL through (``parse_url(url)`` in its constructor: the registry sits
    above this module, so a Store does not parse its own URL).

    What ``host`` and ``path`` hold depends on the backend's form: a local directory
    (``file``, ``pfs``, ``fsspec+file``): ``host`` empty, ``path`` absolute and
    percent-decoded; a bucket (``s3`` and its ``+client`` variants, ``fsspec+s3``): ``host``
    the bucket, ``path`` the key prefix as written; a wrapper (``emulate+<url>``): ``inner``
    the wrapped URL; otherwise the URL's host and path as written.
    """

    scheme: str
    """As written, lower-cased: ``file``, ``s3+obstore``, ``fsspec+gs``, ``emulate+file``."""
    backend: str
    """The registered scheme (entry point) that serves it: ``file``, ``s3+obstore``,
    ``fsspec``, ``emulate``."""
    host: str = ""
    path: str = ""
    options: dict[str, str] = field(default_factory=dict, repr=False, compare=False)
    """From the query string (and, for a bucket, credentials given as user info); never in
    ``bare``. Not shown by ``repr``: they may hold secrets."""
    protocol: str = ""
    """``fsspec+<protocol>``: the fsspec protocol."""
    inner: StoreURL | None = None
    """``emulate+<url>``: the wrapped URL."""
    local: bool = False
    """``path`` is a local filesystem path."""

    @property
    def bucket(self) -> str:
        return self.host

    @property
    def prefix(self) -> str:
        """``path`` without slashes at either end (an object-store key prefix)."""
        return self.path.strip("/")

    @property
    def bare(self) -> str:
        """The canonical URL without query or credentials (what backends are constructed
        with and show as ``Store.url``); :func:`~ckptio.registry.parse_url` of it gives these
        parts back."""
        if self.inner is not None:
            return f"{self.backend}+{self.inner.bare}"
        if self.local:  # the characters a URL path cannot hold as they are
            path = self.path.replace("%", "%25").replace("?", "%3F").replace("#", "%23")
            return f"{self.scheme}://{path}"
        return f"{self.scheme}://{self.host}{self.path}"


Buffer = Any
"""Anything exposing the buffer protocol, or a numpy array (``collections.abc.Buffer`` is
Python 3.12+)."""

_KEY_SEGMENT = re.compile(r"^[A-Za-z0-9._=+-]+$")


def check_key(key: str) -> str:
    """Return ``key`` if it is a safe relative key, else raise :class:`InvalidArgumentError`.

    Safe: non-empty ``/``-separated segments of ``[A-Za-z0-9._=+-]``, none of them ``.`` or
    ``..``, no leading ``/``. This is what keeps every read and write under the root.
    """
    if not isinstance(key, str) or not key:
        raise errors.InvalidArgumentError(f"invalid key {key!r}: must be a non-empty string")
    for seg in key.split("/"):
        if seg in ("", ".", "..") or not _KEY_SEGMENT.match(seg):
            raise errors.InvalidArgumentError(
                f"invalid key {key!r}: segment {seg!r} is not allowed "
                "(segments use [A-Za-z0-9._=+-], no empty, '.' or '..' segments, no leading '/')"
            )
    return key


def is_key(key: str) -> bool:
    """Whether :func:`check_key` accepts ``key``. A listed key it refuses was not written by
    ckptio (a folder marker ``step-…/`` a console or tool left in a bucket, a file named with a
    space) and cannot be read, sized or deleted through a store: listings that ``ls``, ``gc``
    and retention act on leave such keys out, and so leave them alone."""
    try:
        check_key(key)
    except errors.InvalidArgumentError:
        return False
    return True


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a backend can do natively. Callers branch on these, never on the class."""

    atomic_rename: bool = False
    """Objects can be renamed atomically (POSIX ``rename``)."""
    range_reads: bool = True
    """``read_into`` at any offset costs only the bytes read."""
    durable_flush: bool = False
    """Data can be forced to stable storage (``fsync``); object stores are durable on PUT."""
    conditional_create: bool = False
    """``publish(..., overwrite=False)`` is enforced atomically by the storage itself
    (``O_EXCL``/``link``, S3 ``If-None-Match: *``). Without it the check is best-effort."""
    multipart: bool = False
    """Large objects are written in parts, in parallel."""
    listing: bool = True
    """``list(prefix)`` is supported."""
    positional_writes: bool = False
    """Several writers may write disjoint ranges of one object at once (``pwrite``), which
    the ``shared-file`` (N-1) layout needs."""
    direct_io: bool = False
    """Reads and writes can bypass the page cache (``O_DIRECT``)."""
    shared: bool = True
    """Every process that opens the same URL sees the same objects. False for a store held in
    one process's memory: no other process can delete a save's objects there, and a commit
    skips its check after publishing (:func:`ckptio.checkpoint.publish_manifest`)."""


class ColdReads(ABC):
    """How a store makes the coming reads miss this machine's caches, so that a restore is
    measured cold: what ``ckptio run`` does before its read phase. A store whose reads pass a
    local cache (a filesystem's page cache) offers one through :attr:`StoreInfo.cold_reads`;
    elsewhere every read reaches the storage and :data:`NO_COLD_READS` says so."""

    @property
    @abstractmethod
    def modes(self) -> tuple[str, ...]:
        """The modes offered, best first: ``o_direct`` (the store's reads bypass the page
        cache until :meth:`end`) and ``fadvise`` (the cached pages of given objects are
        dropped)."""

    @abstractmethod
    def start(self, keys: Sequence[str], mode: str) -> str:
        """Make the coming reads of ``keys`` miss local caches by ``mode`` (one of
        :attr:`modes`; another raises :class:`~ckptio.errors.InvalidArgumentError`).

        Returns ``mode`` when done for every key, ``"none"`` when done for some only (reads of
        the others may come from the cache), ``""`` when done for none (nothing to drop).
        ``o_direct`` switches every read of the store, whatever ``keys`` hold; call
        :meth:`end` after the reads."""

    @abstractmethod
    def end(self) -> bool:
        """Back to ordinary reads. Returns whether every read since :meth:`start` bypassed
        caches as asked (False: the filesystem refused O_DIRECT on the way and the store read
        through the page cache instead)."""

    def refuse(self, mode: str, who: str) -> errors.InvalidArgumentError:
        """The error for a ``mode`` not in :attr:`modes`, naming the store ``who``."""
        offered = ", ".join(self.modes) or "none (nothing caches its reads)"
        return errors.InvalidArgumentError(
            f"{who} cannot make reads cold by {mode!r}; cold-read modes it offers: {offered}"
        )


class _NoColdReads(ColdReads):
    @property
    def modes(self) -> tuple[str, ...]:
        return ()

    def start(self, keys: Sequence[str], mode: str) -> str:
        raise self.refuse(mode, "this store")

    def end(self) -> bool:
        return True


NO_COLD_READS: ColdReads = _NoColdReads()
"""The :class:`ColdReads` of a store with nothing between it and its storage that caches
reads (object stores, memory): no modes; every read is cold already."""


def no_layout(key: str) -> dict[str, int | str]:
    """The :attr:`StoreInfo.file_layout` of a storage with no notion of layout: ``{}``."""
    return {}


@dataclass(frozen=True)
class StoreInfo:
    """What an open store says about itself to the benchmark runner and the result files
    (:meth:`Store.describe`), apart from its storage semantics: the suite records these
    beside every run and never asks a store for anything else."""

    backend: str
    """The store's name in traces and reports (:attr:`Store.name`: ``file``,
    ``s3+boto3``, ``emulate:cloud-s3+memory``)."""
    request_size: int = 0
    """Bytes per data request: a part of a multipart upload, a block of a POSIX write, an
    emulated request (set by the scheme's
    :attr:`~ckptio.registry.BackendInfo.request_size_option`). 0 where writes are not split
    into requests (memory)."""
    streams: int = 0
    """Requests the store keeps in flight at once (I/O threads, connections, parts in
    flight): its concurrency, set by its ``streams`` option. 0 where it does not say."""
    emulated: bool = False
    """Requests are timed by an emulation (``emulate``), not by the storage: results through
    this store are marked emulated and never taken for measurements."""
    local_path: str | None = None
    """The absolute local directory the objects live under, where there is one (``file://``,
    ``pfs://``, ``fsspec+file://``, an emulating store over them): results record its filesystem
    type. None for object stores and memory."""
    cold_reads: ColdReads = field(default=NO_COLD_READS, compare=False)
    """How reads can be made to miss this machine's caches (:class:`ColdReads`)."""
    file_layout: Callable[[str], dict[str, int | str]] = field(default=no_layout, compare=False)
    """How the storage laid the existing object ``key`` out, in its own terms (a parallel
    filesystem's striping: ``fs``, ``stripe_count``, ``stripe_size`` / ``stripe_unit``,
    ``object_size``, ...); ``{}`` where the storage has no such notion. A run's sidecar
    records it for one of its objects (``storage_layout``)."""


class _CloseOrAbort(ABC):
    """Used as a context manager: ``close`` on success, ``abort`` on an exception."""

    @abstractmethod
    def close(self) -> None: ...

    @abstractmethod
    def abort(self) -> None: ...

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


class Writer(_CloseOrAbort):
    """A streamed write of one object.

    ``write`` queues buffers *without copying them*: the caller must keep each buffer alive
    and unmodified until ``close`` or ``abort`` returns. ``close`` returns only when the
    object is complete, durable (where the store can make it so) and visible under its key;
    before that no reader can observe it. ``abort`` discards everything and leaves nothing
    behind (no temp file, no open multipart upload). A writer used as a context manager
    closes on success and aborts on an exception.
    """

    key: str

    @abstractmethod
    def write(self, data: Buffer) -> None:
        """Append ``data`` (bytes, memoryview, numpy array, any C-contiguous buffer)."""

    @abstractmethod
    def close(self) -> None:
        """Finish: flush, make durable, make visible. Raises if any queued write failed."""

    @abstractmethod
    def abort(self) -> None:
        """Discard the object. Safe to call after a failed ``close``; idempotent."""

    @property
    def nbytes(self) -> int:
        """Bytes written so far (queued)."""
        return getattr(self, "_nbytes", 0)


class PositionalWriter(_CloseOrAbort):
    """Writes at byte offsets into one object that several writers share (the N-1 layout).

    Sequence (see :meth:`Store.open_positional`): one participant creates the object with
    ``create=True`` and closes that handle; then every writer (any process, any node) opens it
    with ``create=False``, calls ``pwrite`` for its own byte ranges, and ``close``. Writers
    must write disjoint ranges, each starting at a multiple of
    :attr:`Store.positional_alignment`; with direct I/O a range's tail is padded with zeros
    up to the next 4096 bytes, so that padding must belong to the same writer.

    Unlike :class:`Writer`, the object is visible (at its full size, content undefined) from
    its creation: it belongs to a checkpoint only once a committed manifest names it.
    ``close`` returns when *this* writer's ranges are durable; ``abort`` drops this writer's
    handle (deleting the object is the creator's business, through :meth:`Store.delete`).
    """

    key: str

    @abstractmethod
    def pwrite(self, offset: int, data: Buffer) -> None:
        """Queue ``data`` for writing at byte ``offset`` without copying it (keep the buffer
        alive and unchanged until ``close``/``abort`` returns)."""

    @abstractmethod
    def close(self) -> None:
        """Wait for the queued writes and make them durable. Raises if any failed."""

    @abstractmethod
    def abort(self) -> None:
        """Stop: wait out writes in flight, release the handle. Idempotent."""


class Store(ABC):
    """A place to put checkpoint objects, addressed by a root URL.

    Subclasses set :attr:`schemes`, :attr:`capabilities`, and implement the abstract
    methods. Constructor options are keyword-only and documented in the subclass docstring;
    every backend accepts ``trace`` (a :class:`~ckptio.trace.Trace`; a private one is made
    if omitted).

    Note for implementers: every request to the storage must be reported to ``self.trace``
    (see :meth:`Trace.request`), including retries; vendor exceptions must be translated to
    :mod:`ckptio.errors` with ``raise ... from err``, and transient ones retried through
    :meth:`retrying`.
    """

    schemes: ClassVar[tuple[str, ...]] = ()
    capabilities: ClassVar[Capabilities] = Capabilities()
    name: ClassVar[str] = ""
    """Short backend name used in traces and reports (``file``, ``s3+boto3``, ...)."""

    url: str
    """The URL the store was opened with, credentials hidden (:func:`ckptio.redact.redact_url`):
    for messages and labels. Backends connect with the parts of the URL they were given
    (:func:`ckptio.registry.parse_url`) and their options, never with this."""

    trace: Trace
    """Where every request of this store is reported (:meth:`Trace.request`)."""

    def __init__(self, url: str, *, trace: Trace | None = None) -> None:
        self._given_url = url
        self.url = redact_url(url)
        self.trace = trace if trace is not None else Trace()

    # -- writes ---------------------------------------------------------------------------
    @abstractmethod
    def open_writer(self, key: str, *, size_hint: int | None = None) -> Writer:
        """Start a streamed write of ``key`` (replacing any existing object on ``close``).
        ``size_hint`` (bytes), when known, lets the backend preallocate or choose part sizes."""

    @abstractmethod
    def publish(self, key: str, data: bytes, *, overwrite: bool = True) -> None:
        """Write a small object atomically and durably: the commit primitive.

        Readers see either the old object (or none) or all of ``data``, never a part. With
        ``overwrite=False``, raise :class:`~ckptio.errors.AlreadyExistsError` if ``key``
        exists; atomically so where ``capabilities.conditional_create``.
        """

    def publish_transient(self, key: str, data: bytes) -> None:
        """Write a small object atomically, replacing any, for readers that run while its
        writer does; it need not survive a crash (a save's lease, which a crash ends anyway:
        :mod:`ckptio.lease`). Readers see the old object (or none) or all of ``data``. The
        default is :meth:`publish`; a local filesystem skips the fsyncs, which would cost a
        journal commit each before a save writes its first byte."""
        self.publish(key, data, overwrite=True)

    fork_safe: ClassVar[bool] = False
    """Whether the store can write from a child process forked from the one that opened it,
    after :meth:`after_fork` (``Checkpointer(snapshot="fork")``). Plain system calls can;
    clients with pooled network connections or event loops cannot."""

    def after_fork(self) -> None:
        """In a forked child: replace what the fork left unusable (thread pools whose threads
        did not survive, locks another thread may have held). The child's requests go to a
        trace of its own; they are not in the parent's. Only called where :attr:`fork_safe`."""
        self.trace = Trace()

    preferred_key_layout: str = "flat"
    """The key layout (``flat``/``hashed``, see :func:`ckptio.format.shard_key`) the checkpoint
    layer uses here unless told otherwise: ``hashed`` spreads shard objects over 256 prefixes
    (object-store partitions, or directories of a parallel filesystem)."""

    positional_alignment: int = 4096
    """Bytes: writers sharing one object through :meth:`open_positional` get ranges that
    start at multiples of this (a parallel filesystem sets its stripe or block size, so no
    two writers contend for one lock extent)."""

    def open_positional(self, key: str, size: int, *, create: bool = False) -> PositionalWriter:
        """Open ``key`` for writes at byte offsets, shared by several writers.

        ``create=True`` creates (or truncates) the object at ``size`` bytes and makes its
        directory entry durable; exactly one participant does this before the others open it
        with ``create=False`` (which raises :class:`~ckptio.errors.NotFoundError` if it does
        not exist). Only where ``capabilities.positional_writes``; others raise
        :class:`~ckptio.errors.InvalidArgumentError`.

        Note for implementers: report create/open/write/fsync/close to the trace like
        ``open_writer`` does; the object must be readable by ``read_into`` from every node
        once every writer's ``close`` has returned.
        """
        raise errors.InvalidArgumentError(
            f"{self.name or type(self).__name__} cannot write one object from several writers "
            "(no positional writes); use layout='file-per-shard'"
        )

    def put(self, key: str, data: Buffer) -> None:
        """Write a whole object through a writer (not necessarily atomic to replace)."""
        with self.open_writer(key, size_hint=memoryview(data).nbytes) as w:
            w.write(data)

    # -- reads ----------------------------------------------------------------------------
    @abstractmethod
    def read_into(self, key: str, offset: int, buffer: Buffer) -> int:
        """Fill the writable ``buffer`` with bytes of ``key`` from ``offset``.

        Returns the number of bytes read, which is ``len(buffer)`` unless the object ends
        first. Raises :class:`~ckptio.errors.NotFoundError` if ``key`` does not exist.
        """

    def get(self, key: str) -> bytes:
        """The whole object (a helper over :meth:`size` and :meth:`read_into`): received into
        one buffer, then copied once into the ``bytes`` returned (at most twice the object's
        size at once; slicing the buffer first would be a third copy)."""
        buf = bytearray(self.size(key))
        n = self.read_into(key, 0, buf)
        del buf[n:]  # in place: the object shrank since its size was taken
        return bytes(buf)

    # -- metadata -------------------------------------------------------------------------
    @abstractmethod
    def list(self, prefix: str = "") -> list[str]:
        """Keys that start with ``prefix``, sorted. In-flight (unclosed) writes are absent."""

    @abstractmethod
    def size(self, key: str) -> int:
        """Size of ``key`` in bytes; :class:`~ckptio.errors.NotFoundError` if absent."""

    def stat(self, key: str) -> ObjectStat:
        """Size and last-write time of ``key`` (one HEAD/stat: the request :meth:`size`
        makes); :class:`~ckptio.errors.NotFoundError` if absent. The default knows no time.

        Note for implementers: report the storage's own timestamp, never the client's clock."""
        return ObjectStat(self.size(key))

    def stored_ranges(self, key: str, start: int, end: int) -> Iterator[tuple[int, int]]:
        """The byte ranges ``[a, b)`` within ``start..end`` of ``key`` (``end`` at most its
        size, which the caller knows) that the storage really holds, ascending; bytes in
        between read as zeros without being stored (a sparse file's holes). A reader bounds
        its work by these, not by a size a manifest declares. The default: all of
        ``start..end`` (an object store holds every byte it reports; this asks it nothing).

        Note for implementers: report as holes only what reads back as zeros (POSIX
        ``SEEK_HOLE``), and never a range past the object's end."""
        yield (start, end)

    def exists(self, key: str) -> bool:
        try:
            self.size(key)
        except FileNotFoundError:
            return False
        return True

    @abstractmethod
    def delete(self, keys: Iterable[str]) -> None:
        """Delete ``keys``; keys that do not exist are ignored."""

    def list_incomplete(self, prefix: str = "") -> builtins.list[str]:
        """Debris of interrupted writes under ``prefix`` (temp files, open multipart uploads),
        as opaque identifiers for :meth:`cleanup_incomplete`. Default: none."""
        return []

    def cleanup_incomplete(self, prefix: str = "", *, older_than: float = 0.0) -> int:
        """Remove debris of interrupted writes under ``prefix`` that is older than
        ``older_than`` seconds. Returns how many were removed. Default: nothing to do.

        Note for implementers: ``older_than=0`` removes all of it, whatever its timestamp
        says: a write still landing after this call's clock reading, or a writer whose clock
        runs ahead of this host's, stamps a time in the future, and "any age" must not read
        that as "too young"."""
        return 0

    # -- what the suite records about a store (a description, not storage semantics) -------
    def describe(self) -> StoreInfo:
        """What this open store says about itself to the benchmark runner and the result
        files (:class:`StoreInfo`: its request size, concurrency, local directory, whether it
        is emulated, how its reads can be made cold). The default says "not applicable" to
        everything. What is known before a store opens (the option that sets the request
        size, the client packages) is its scheme's record,
        :func:`ckptio.registry.backend_info`.

        Note for implementers: cheap and without requests; every call returns the same
        :attr:`StoreInfo.cold_reads` object (it may hold state between ``start`` and
        ``end``)."""
        return StoreInfo(self.name or type(self).__name__)

    def close(self) -> None:  # noqa: B027  (optional: stores without resources keep it)
        """Release clients, thread pools and connections."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"

    # -- retries --------------------------------------------------------------------------
    retry_policy: RetryPolicy

    def retrying(self, op: str, key: str, nbytes: int, fn: Callable[[], T]) -> T:
        """Run ``fn`` (one request) with this store's :class:`RetryPolicy`, recording each
        attempt to the trace. ``fn`` must raise :class:`~ckptio.errors.TransientStorageError`
        (or :class:`~ckptio.errors.ThrottledError`) for failures worth retrying."""
        policy = getattr(self, "retry_policy", None) or DEFAULT_RETRY_POLICY
        return policy.call(fn, trace=self.trace, op=op, key=key, nbytes=nbytes, backend=self.name)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Jittered exponential backoff ("full jitter", as the AWS SDKs do)."""

    max_attempts: int = 8
    """Attempts in all, the first included."""
    base_delay: float = 0.05
    """Seconds; attempt n sleeps uniform(0, min(max_delay, base_delay * 2**n))."""
    max_delay: float = 5.0
    """Seconds; the cap of one backoff."""

    def delay(
        self, attempt: int, uniform: Callable[[float, float], float] = random.uniform
    ) -> float:
        """Seconds to back off after failed attempt ``attempt`` (1 = the first):
        ``uniform(0, min(max_delay, base_delay * 2**attempt))``. The one place the backoff is
        computed: :meth:`call` sleeps it, and :mod:`ckptio.simulate` replays it in virtual
        time with its own seeded ``uniform``."""
        return uniform(0, min(self.max_delay, self.base_delay * 2**attempt))

    def call(
        self,
        fn: Callable[[], T],
        *,
        trace: Trace,
        op: str,
        key: str,
        nbytes: int,
        backend: str = "",
    ) -> T:
        attempt = 1
        while True:
            try:
                with trace.request(op, key, nbytes, backend=backend, attempt=attempt) as ev:
                    try:
                        result = fn()
                        if not nbytes and isinstance(result, bytes | bytearray):
                            ev.nbytes = len(result)  # a GET whose size was not known before
                        return result
                    except errors.TransientStorageError as err:
                        if attempt < self.max_attempts:
                            ev.outcome = (
                                "throttled" if isinstance(err, errors.ThrottledError) else "retry"
                            )
                        raise
            except errors.TransientStorageError as err:
                if attempt >= self.max_attempts:
                    raise errors.RetryBudgetExceededError(
                        f"{op} {key!r} failed {attempt} times; last error: {err}"
                    ) from err
                _sleep(self.delay(attempt))
                attempt += 1


DEFAULT_RETRY_POLICY = RetryPolicy()


def _sleep(seconds: float) -> None:
    # time.sleep; kept as one function so tests can see all backoff goes through here
    time.sleep(seconds)


def option_bool(value: Any, *, field: str) -> bool:
    """A boolean option that may come from a URL query string."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise errors.InvalidArgumentError(f"{field}: expected true/false, got {value!r}")


def option_int(value: Any, *, field: str, minimum: int = 0, maximum: int = MAX_COUNT) -> int:
    """An integer option that may come from a URL query string (``minimum`` .. ``maximum``)."""
    return parse_count(value, field=field, minimum=minimum, maximum=maximum)


class NoOptions(TypedDict, total=False):
    """The type of a backend's ``**unknown`` parameter: no keyword beyond the named ones.
    A type checker refuses any other name in a call; one that arrives anyway (from a URL's
    query string, through :func:`~ckptio.registry.open_store`) the store refuses with
    :class:`~ckptio.errors.UnknownOptionError`, which names it and suggests the closest
    valid option::

        def __init__(self, url, *, trace=None, streams: int | str = 8,
                     **unknown: Unpack[NoOptions]) -> None:
            if unknown:
                raise errors.UnknownOptionError("x://", unknown, [("x://", ("streams",))])
    """


def as_byte_view(data: Buffer) -> memoryview:
    """A flat unsigned-byte view of ``data`` without copying it.

    Accepts bytes, bytearray, memoryview and C-contiguous numpy arrays of any dtype (also
    those, like bfloat16, that the buffer protocol cannot describe).
    """
    import numpy as np

    if isinstance(data, np.ndarray):
        if not data.flags.c_contiguous:
            raise errors.InvalidArgumentError(
                "array is not C-contiguous; pass np.ascontiguousarray(a) (this copies it)"
            )
        # numpy's stubs declare ndarray's buffer protocol (__buffer__) for Python >= 3.12 only
        return memoryview(data.reshape(-1).view(np.uint8))  # type: ignore[arg-type]
    view = memoryview(data)
    if not view.c_contiguous:
        raise errors.InvalidArgumentError("buffer is not C-contiguous")
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


def wait_all(futures: Iterable[Any]) -> list[Any]:
    """Wait for every future (never leaving one running behind an error), then return their
    results in order, or raise the first error. The one way ckptio joins parallel requests."""
    results: list[Any] = []
    first: BaseException | None = None
    for fut in futures:
        try:
            results.append(fut.result())
        except BaseException as err:
            first = first or err
    if first is not None:
        raise first
    return results
