"""What the four S3 backends share: the store base classes (:class:`S3Base`: bucket/prefix
mapping, options, ``publish``, ``read_into``, multipart debris; :class:`WholeObjectStore`:
writers for libraries that upload whole objects) and :data:`S3_CAPABILITIES`.

The rest lives beside it, one module per concern: :mod:`._s3config` (AWS configuration,
option spellings, S3 limits, the botocore client), :mod:`._s3errors` (S3 errors -> ckptio
errors), :mod:`._s3multipart` (the multipart writer engine), :mod:`._s3presigned` (ranged
GETs of presigned URLs).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any, Literal

from ckptio import errors
from ckptio.arrays import prefault
from ckptio.redact import redact, redact_url
from ckptio.registry import parse_url
from ckptio.store import (
    DEFAULT_RETRY_POLICY,
    Buffer,
    Capabilities,
    Store,
    StoreInfo,
    Writer,
    as_byte_view,
    wait_all,
)
from ckptio.trace import Trace

from ._s3config import (
    MAX_SINGLE_PUT,
    S3Options,
    canonical_options,
    io_options,
    make_boto3_client,
    own_options,
    reject_unknown,
    resolve_aws,
)
from ._s3errors import guard

log = logging.getLogger("ckptio.backends.s3")


S3_CAPABILITIES = Capabilities(
    atomic_rename=False,
    range_reads=True,
    durable_flush=True,  # an acknowledged PUT / CompleteMultipartUpload is durable
    conditional_create=True,  # If-None-Match: * (a backend that cannot send it says so)
    multipart=True,
    listing=True,
)
"""What S3 offers through every backend that can send every request S3 has."""


def check_prefix(prefix: str) -> str:
    """``prefix`` if it is a relative listing prefix (no leading ``/``, no ``..`` segment)."""
    if prefix.startswith("/") or ".." in prefix.split("/"):
        raise errors.InvalidArgumentError(f"invalid prefix {prefix!r}")
    return prefix


def batch_label(names: list[str]) -> str:
    """What a request on several objects reports as its key: the one name, or ``N keys``."""
    return names[0] if len(names) == 1 else f"{len(names)} keys"


def timestamp(value: Any) -> float | None:
    """Unix seconds of a time a client library reports (a ``datetime``, an ISO 8601 string,
    or seconds), None if it reports none."""
    if value is None:
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        value = datetime.fromisoformat(value.replace("Z", "+00:00"))
    if isinstance(value, datetime):
        if value.tzinfo is None:  # S3 times are UTC
            value = value.replace(tzinfo=UTC)
        return value.timestamp()
    return None


def copy_into(out: memoryview, data: Any) -> int:
    """Copy ``data`` (bytes or any buffer a client library returns) to the front of ``out``
    (its pages mapped first in one call: :func:`~ckptio.arrays.prefault`); returns its length
    in bytes."""
    view = memoryview(data)
    n = view.nbytes
    prefault(out[:n])
    out[:n] = view
    return n


POOL_THREADS = "ckptio-s3"
"""The name prefix of the S3 stores' request threads (:meth:`S3Base._parts_pool`)."""


class S3Base(Store):
    """What the S3 backends share: bucket/prefix/key mapping, the I/O and AWS options,
    requests wrapped in translation + retries + trace, the shape of ``publish`` and
    ``read_into``, and the janitor for multipart debris (listing and aborting uploads goes
    through botocore for every backend, since pyarrow and obstore do not expose those S3
    calls).

    The options every S3 store takes are :class:`~ckptio.backends._s3config.S3Options`, each
    documented there once with its environment variable; :meth:`_setup` checks them.
    """

    OPTIONS: tuple[str, ...] = own_options(S3Options)

    def describe(self) -> StoreInfo:
        return StoreInfo(self.name, request_size=self.part_size, streams=self.streams)

    def _setup(self, options: dict[str, Any]) -> None:
        """Take the bucket and prefix from the URL (:func:`~ckptio.registry.parse_url`) and pop the I/O and AWS
        options (in any spelling of :data:`OPTION_SPELLINGS`); any option left over is an
        error naming the valid ones (:attr:`OPTIONS`)."""
        canon = canonical_options(options)
        options.clear()
        options.update(canon)
        loc = parse_url(self._given_url)
        self.bucket, self.prefix = loc.bucket, loc.prefix
        reject_unknown(
            self.name, {k: v for k, v in options.items() if k not in self.OPTIONS}, self.OPTIONS
        )
        self.part_size, self.streams = io_options(options)
        self.aws = resolve_aws(options, where=f"{self.name}://{self.bucket}")
        reject_unknown(self.name, options, self.OPTIONS)
        self._janitor_client: Any = None
        self._janitor_lock = threading.Lock()

    def __repr__(self) -> str:
        endpoint = self.aws.endpoint_url
        shown = redact_url(endpoint) if endpoint is not None else None
        return f"{type(self).__name__}({self.url!r}, endpoint={shown!r})"

    @property
    def where(self) -> str:
        return f"{self.name}://{self.bucket}"

    def _full(self, key: str) -> str:
        from ckptio.store import check_key

        check_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def _full_prefix(self, prefix: str) -> str:
        check_prefix(prefix)
        return f"{self.prefix}/{prefix}" if self.prefix else prefix

    def _path(self, full: str) -> str:
        """``bucket/full``: the path path-based libraries take, and what messages show after
        ``name://``."""
        return f"{self.bucket}/{full}"

    def _rel(self, full: str) -> str:
        return full[len(self.prefix) + 1 :] if self.prefix else full

    def _call(self, op: str, key: str, nbytes: int, action: str, fn: Callable[[], Any]) -> Any:
        """One request: vendor errors translated, transient ones retried, each attempt traced."""
        where = self.where
        return self.retrying(op, key, nbytes, lambda: guard(action, key, where, fn, self.aws))

    # -- commit ------------------------------------------------------------------------------
    def publish(self, key: str, data: bytes, *, overwrite: bool = True) -> None:
        """Write ``data`` as ``key`` in one request, retried and traced. With
        ``overwrite=False`` the request is a create-if-absent; when it is refused after a
        retry and what is stored is exactly ``data``, it was our own earlier attempt (landed,
        response lost) and the publish succeeded; otherwise :class:`AlreadyExistsError`.

        The create-if-absent is always one PUT with ``If-None-Match: *``, never a multipart
        upload whatever the size: S3 clones differ on a conditional CompleteMultipartUpload
        (Ceph RGW 16 ignores the condition and overwrites), all tested honour it on a PUT.
        Hence ``data`` above :data:`MAX_SINGLE_PUT` is refused."""
        full = self._full(key)
        data = bytes(data)
        if not overwrite and len(data) > MAX_SINGLE_PUT:
            raise errors.InvalidArgumentError(
                f"{self.name}: cannot create {key!r} only if absent: {len(data)} bytes is more "
                f"than one PUT takes ({MAX_SINGLE_PUT})"
            )
        request = self._publish_request(full, data, overwrite=overwrite)
        attempts = 0

        def put() -> None:
            nonlocal attempts
            attempts += 1
            request()

        try:
            self._call("put", key, len(data), "publish", put)
        except errors.AlreadyExistsError:
            if attempts > 1 and self._get_or_none(key) == data:
                return  # our own earlier attempt landed before its response was lost
            raise errors.AlreadyExistsError(
                f"{self.name}://{self._path(full)} already exists (another writer committed it)"
            ) from None

    def _publish_request(self, full: str, data: bytes, *, overwrite: bool) -> Callable[[], None]:
        """One attempt of :meth:`publish`: store ``data`` as ``full``; with ``overwrite=False``
        raise (or let the library raise) an already-exists error when ``full`` exists."""
        raise NotImplementedError

    def _get_or_none(self, key: str) -> bytes | None:
        try:
            return self.get(key)
        except errors.NotFoundError:
            return None

    # -- reads -------------------------------------------------------------------------------
    def size(self, key: str) -> int:
        """One HEAD, as :meth:`stat` (each backend's)."""
        return self.stat(key).size

    def read_into(self, key: str, offset: int, buffer: Buffer) -> int:
        """Read up to ``len(buffer)`` bytes of ``key`` from byte ``offset`` straight into
        ``buffer``; returns the bytes read, 0 at or past the end of the object.

        A read longer than ``part_size`` goes out as ranged GETs of ``part_size``, ``streams``
        at a time, each received straight into its slice of ``buffer`` (where the backend has
        a pool for them: :meth:`_parts_pool`), as downloaders of large objects do: one GET
        stream per chunk left a load of a few large chunks with a few streams, and the last
        chunk of a load alone. Each GET is retried and traced on its own."""
        full = self._full(key)
        out = memoryview(buffer).cast("B")
        if offset < 0:
            raise errors.InvalidArgumentError(f"negative offset {offset} for {key!r}")
        if out.nbytes == 0:
            return 0
        part = self.part_size
        pool = self._parts_pool() if out.nbytes > part else None
        if pool is None or threading.current_thread().name.startswith(POOL_THREADS):
            return self._read_part(key, full, offset, out)  # a pool thread never waits on one
        spans = [(s, min(part, out.nbytes - s)) for s in range(0, out.nbytes, part)]
        counts = wait_all(
            [pool.submit(self._read_part, key, full, offset + s, out[s : s + n]) for s, n in spans]
        )
        total = 0
        for (_s, n), got in zip(spans, counts, strict=True):
            total += got
            if got < n:  # the object ends in this part: later parts read nothing
                break
        return total

    def _read_part(self, key: str, full: str, offset: int, out: memoryview) -> int:
        """One ranged GET into ``out`` (retried and traced). The pages of ``out`` are mapped
        once the answer has come, just before its body is copied in (:func:`copy_into`,
        :func:`~._s3presigned.receive`), not before the request is sent: mapping 8 MiB of
        fresh memory takes milliseconds of CPU, which then overlap the server's sending
        instead of delaying the request (a load's first GETs went out 10-40 ms late)."""
        return self._call(
            "get", key, out.nbytes, "read", lambda: self._read_range(key, full, offset, out)
        )

    def _parts_pool(self) -> ThreadPoolExecutor | None:
        """The threads that send the ranged GETs of a long read (``streams`` of them), or None:
        the backend reads each ``read_into`` as one request."""
        return None

    def _read_range(self, key: str, full: str, offset: int, out: memoryview) -> int:
        """One attempt of :meth:`read_into` (``out`` is not empty, ``offset`` >= 0)."""
        raise NotImplementedError

    def _check_read(self, key: str, n: int, want: int) -> int:
        """``n``, when it is the ``want`` bytes the server said it sends; a short read (the
        connection ended early) is transient."""
        if n != want:
            raise errors.TransientStorageError(
                f"{self.name}: short read of {key!r}: {n} of {want} bytes"
            )
        return n

    def _delete_objects(self, client: Any, keys: Iterable[str]) -> None:
        """Delete ``keys`` with botocore's DeleteObjects, 1,000 keys a request (S3's limit);
        a key already gone is not an error."""
        fulls = [self._full(k) for k in keys]
        for start in range(0, len(fulls), 1000):
            batch = fulls[start : start + 1000]

            def run(batch: list[str] = batch) -> None:
                resp = client.delete_objects(
                    Bucket=self.bucket,
                    Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True},
                )
                failed = [e for e in resp.get("Errors", ()) if e.get("Code") != "NoSuchKey"]
                if failed:
                    raise errors.StorageError(
                        f"{self.name}: cannot delete {len(failed)} object(s), first: "
                        f"{failed[0].get('Key')!r}: {failed[0].get('Code')} "
                        f"{failed[0].get('Message')}"
                    )

            self._call("delete", batch_label(batch), 0, "delete", run)

    # -- multipart debris --------------------------------------------------------------------
    def _mpu_client(self) -> Any:
        with self._janitor_lock:
            if self._janitor_client is None:
                self._janitor_client = make_boto3_client(self.aws)
            return self._janitor_client

    def _uploads(self, prefix: str) -> list[dict[str, Any]]:
        full = self._full_prefix(prefix)
        client = self._mpu_client()

        def run() -> list[dict[str, Any]]:
            out: list[dict[str, Any]] = []
            kw: dict[str, Any] = {"Bucket": self.bucket, "Prefix": full}
            while True:
                resp = client.list_multipart_uploads(**kw)
                out += resp.get("Uploads", [])
                if not resp.get("IsTruncated"):
                    return out
                kw["KeyMarker"] = resp["NextKeyMarker"]
                kw["UploadIdMarker"] = resp["NextUploadIdMarker"]

        return self._call("list", prefix, 0, "list multipart uploads under", run)

    def list_incomplete(self, prefix: str = "") -> list[str]:
        """Open multipart uploads under ``prefix`` as ``key#upload-id`` (S3 bills their parts
        until they are aborted)."""
        return sorted(f"{self._rel(u['Key'])}#{u['UploadId']}" for u in self._uploads(prefix))

    def cleanup_incomplete(self, prefix: str = "", *, older_than: float = 0.0) -> int:
        """Abort open multipart uploads under ``prefix`` started more than ``older_than``
        seconds ago. Returns how many were aborted."""
        import time

        now = time.time()
        n = 0
        client = self._mpu_client()
        for u in self._uploads(prefix):
            if older_than > 0 and now - u["Initiated"].timestamp() < older_than:
                continue

            def abort(u: dict[str, Any] = u) -> None:
                client.abort_multipart_upload(
                    Bucket=self.bucket, Key=u["Key"], UploadId=u["UploadId"]
                )

            try:
                self._call("abort", self._rel(u["Key"]), 0, "abort the multipart upload of", abort)
            except errors.NotFoundError:
                continue
            n += 1
        return n

    def _abort_uploads_of(self, full: str) -> None:
        """After a failed whole-object upload: abort what the client library may have left
        open for exactly this key, each request retried as any other (a fault that broke the
        upload may hit the abort too). Reported, not raised, when it still fails: the upload's
        own error is what matters (``cleanup_incomplete`` is the backstop)."""
        key = self._rel(full)

        def abort_all() -> None:
            client = self._mpu_client()
            resp = client.list_multipart_uploads(Bucket=self.bucket, Prefix=full)
            for u in resp.get("Uploads", []):
                if u["Key"] == full:
                    upload_id: str = u["UploadId"]

                    def abort(upload_id: str = upload_id) -> None:
                        client.abort_multipart_upload(
                            Bucket=self.bucket, Key=full, UploadId=upload_id
                        )

                    with contextlib.suppress(errors.NotFoundError):  # gone already
                        guard("abort the multipart upload of", key, self.where, abort)

        where = self.where
        try:  # retried like any request, but not traced: the caller's trace is of its upload
            (getattr(self, "retry_policy", None) or DEFAULT_RETRY_POLICY).call(
                lambda: guard("abort the leftover uploads of", key, where, abort_all),
                trace=Trace(),
                op="abort",
                key=key,
                nbytes=0,
                backend=self.name,
            )
        except Exception as err:
            log.warning("could not abort leftover uploads of %s: %s", full, redact(str(err)))

    def close(self) -> None:
        if self._janitor_client is not None:
            self._janitor_client.close()
            self._janitor_client = None


class WholeObjectStore(S3Base):
    """An S3 backend whose client library runs the multipart upload itself (s3fs, pyarrow,
    obstore): it provides ``_upload``; writers are :class:`WholeObjectWriter` and one attempt
    of ``publish`` is one ``_upload``."""

    def _upload(
        self,
        full: str,
        pieces: list[memoryview],
        nbytes: int,
        mode: Literal["create", "overwrite"] = "overwrite",
    ) -> None:
        """Store the ``nbytes`` bytes of ``pieces`` as ``full`` (``mode="create"``: only if
        absent, where the library can say so)."""
        raise NotImplementedError

    def _upload_or_abort(self, full: str, pieces: list[memoryview], nbytes: int) -> None:
        """``_upload``; when it fails, abort the multipart upload the library may have left
        open (pyarrow always uses one) before the error goes on."""
        try:
            self._upload(full, pieces, nbytes)
        except BaseException:
            self._abort_uploads_of(full)
            raise

    def open_writer(self, key: str, *, size_hint: int | None = None) -> Writer:
        return WholeObjectWriter(self, key, self._full(key))

    def _publish_request(self, full: str, data: bytes, *, overwrite: bool) -> Callable[[], None]:
        mode: Literal["create", "overwrite"] = "overwrite" if overwrite else "create"
        return lambda: self._upload(full, [memoryview(data)], len(data), mode)


class WholeObjectWriter(Writer):
    """For client libraries that run the multipart upload themselves (s3fs, pyarrow,
    obstore): ``write`` queues the caller's buffers (no copy); ``close`` hands them to one
    ``store._upload(full_key, pieces, nbytes)`` call, which the library splits into parts and
    sends concurrently. A failed attempt aborts whatever upload it left open and is retried
    whole (the caller's buffers are still there), each attempt traced."""

    def __init__(self, store: WholeObjectStore, key: str, full: str) -> None:
        self.key = key
        self._store = store
        self._full = full
        self._pieces: list[memoryview] = []
        self._nbytes = 0
        self._done = False

    def write(self, data: Buffer) -> None:
        if self._done:
            raise errors.InvalidArgumentError(f"write to {self.key!r} after close/abort")
        view = as_byte_view(data)
        if view.nbytes:
            self._pieces.append(view)
            self._nbytes += view.nbytes

    def close(self) -> None:
        if self._done:
            return
        pieces, nbytes, full = self._pieces, self._nbytes, self._full
        try:
            self._store._call(
                "write",
                self.key,
                nbytes,
                "write",
                lambda: self._store._upload_or_abort(full, pieces, nbytes),
            )
        finally:
            self._done = True
            self._pieces = []

    def abort(self) -> None:
        self._pieces = []
        self._done = True
