"""The S3 multipart engine: :class:`MultipartWriter` streams an object as parts sent in
parallel through a backend's :class:`PartSender` (one method per S3 request), each part a
list of slices of the caller's buffers (:class:`PieceReader` streams them without a join)
with its CRC32C; the part size is raised so an object fits in S3's part limit
(:func:`part_size_for`).
"""

from __future__ import annotations

import base64
import contextlib
import logging
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol

from crc32c import crc32c

from ckptio import errors
from ckptio.redact import redact
from ckptio.store import Buffer, Store, Writer, as_byte_view

from ._s3config import MAX_PART_SIZE, MAX_PARTS
from ._s3errors import guard

log = logging.getLogger("ckptio.backends.s3")


def part_size_for(total: int | None, part_size: int) -> int:
    """``part_size``, raised when needed so that ``total`` bytes fit in :data:`MAX_PARTS`."""
    if total and -(-total // part_size) > MAX_PARTS:
        part_size = -(-total // MAX_PARTS)
        part_size = -(-part_size // 2**20) * 2**20  # whole MiB
        if part_size > MAX_PART_SIZE:
            raise errors.InvalidArgumentError(
                f"object of {total} bytes exceeds S3's maximum of {MAX_PARTS} parts of 5 GiB"
            )
    return part_size


# -- checksums -------------------------------------------------------------------------------
def crc32c_of(pieces: Iterable[memoryview]) -> int:
    value = 0
    for p in pieces:
        value = crc32c(p, value)
    return value


def crc32c_b64(value: int) -> str:
    """The CRC32C in the form S3 takes in ``x-amz-checksum-crc32c``: base64 of 4 big-endian
    bytes."""
    return base64.b64encode(value.to_bytes(4, "big")).decode("ascii")


# -- the multipart writer engine -------------------------------------------------------------
class PartSender(Protocol):
    """What a backend provides to :class:`MultipartWriter`: one method per S3 request. Each
    raises its client library's exceptions (translated by the engine)."""

    def put_object(
        self, key: str, pieces: list[memoryview], nbytes: int, crc: int | None
    ) -> None: ...

    def create_upload(self, key: str) -> str: ...

    def upload_part(
        self,
        key: str,
        upload_id: str,
        number: int,
        pieces: list[memoryview],
        nbytes: int,
        crc: int | None,
    ) -> dict[str, Any]: ...

    def complete_upload(self, key: str, upload_id: str, parts: list[dict[str, Any]]) -> None: ...

    def abort_upload(self, key: str, upload_id: str) -> None: ...


class MultipartWriter(Writer):
    """Streams one object as S3 multipart upload parts, in parallel on the store's pool.

    Buffers are not copied: a part is a list of slices of the caller's buffers. The upload
    starts lazily with the first full part; an object smaller than one part is a single PUT
    at ``close``. Each request goes through :meth:`Store.retrying` (traced, retried when
    transient). ``abort`` — and any failure — aborts the multipart upload.
    """

    def __init__(
        self,
        store: Store,
        sender: PartSender,
        full_key: str,
        key: str,
        *,
        part_size: int,
        pool: ThreadPoolExecutor,
        checksum: bool,
        size_hint: int | None,
    ) -> None:
        self.key = key
        self._store = store
        self._sender = sender
        self._full = full_key
        self._part_size = part_size_for(size_hint, part_size)
        self._pool = pool
        self._checksum = checksum
        self._pending: list[memoryview] = []
        self._pending_bytes = 0
        self._nbytes = 0
        self._upload_id: str | None = None
        self._upload_lock = threading.Lock()
        self._futures: list[Future[dict[str, Any]]] = []
        self._failed: BaseException | None = None
        self._done = False

    # each request, retried and traced
    def _request(self, op: str, nbytes: int, action: str, fn: Callable[[], Any]) -> Any:
        where = self._store.url

        def attempt() -> Any:
            return guard(action, self.key, where, fn, getattr(self._store, "aws", None))

        return self._store.retrying(op, self.key, nbytes, attempt)

    def _ensure_upload(self) -> str:
        with self._upload_lock:
            if self._failed is not None:
                raise self._failed
            if self._upload_id is None:
                try:
                    self._upload_id = self._request(
                        "create",
                        0,
                        "start a multipart upload of",
                        lambda: self._sender.create_upload(self._full),
                    )
                except BaseException as err:
                    self._failed = err
                    raise
            return self._upload_id

    def _send_part(self, number: int, pieces: list[memoryview], nbytes: int) -> dict[str, Any]:
        if self._failed is not None:  # another part already failed: do not spend more requests
            raise self._failed
        upload_id = self._ensure_upload()
        try:
            return self._send_part_to(upload_id, number, pieces, nbytes)
        except BaseException as err:
            self._failed = err
            raise

    def _send_part_to(
        self, upload_id: str, number: int, pieces: list[memoryview], nbytes: int
    ) -> dict[str, Any]:
        crc = crc32c_of(pieces) if self._checksum else None
        return self._request(
            "write",
            nbytes,
            f"upload part {number} of",
            lambda: self._sender.upload_part(self._full, upload_id, number, pieces, nbytes, crc),
        )

    def write(self, data: Buffer) -> None:
        if self._done:
            raise errors.InvalidArgumentError(f"write to {self.key!r} after close/abort")
        view = as_byte_view(data)
        self._nbytes += view.nbytes
        while view.nbytes:
            take = min(view.nbytes, self._part_size - self._pending_bytes)
            self._pending.append(view[:take])
            self._pending_bytes += take
            view = view[take:]
            if self._pending_bytes == self._part_size:
                self._flush_part()

    def _flush_part(self) -> None:
        number = len(self._futures) + 1
        if number > MAX_PARTS:
            raise errors.InvalidArgumentError(
                f"{self.key!r}: more than {MAX_PARTS} parts of {self._part_size} bytes; "
                "pass size_hint or a larger part_size"
            )
        pieces, nbytes = self._pending, self._pending_bytes
        self._pending, self._pending_bytes = [], 0
        self._futures.append(self._pool.submit(self._send_part, number, pieces, nbytes))

    def close(self) -> None:
        if self._done:
            return
        try:
            if not self._futures:
                pieces, nbytes = self._pending, self._pending_bytes
                crc = crc32c_of(pieces) if self._checksum else None
                self._request(
                    "put",
                    nbytes,
                    "write",
                    lambda: self._sender.put_object(self._full, pieces, nbytes, crc),
                )
            else:
                if self._pending_bytes:
                    self._flush_part()
                parts = [f.result() for f in self._futures]
                upload_id = self._ensure_upload()
                self._request(
                    "commit",
                    self._nbytes,
                    "complete the multipart upload of",
                    lambda: self._sender.complete_upload(self._full, upload_id, parts),
                )
                self._upload_id = None
        except BaseException:
            self.abort()
            raise
        self._done = True
        self._pending = []

    def abort(self) -> None:
        for f in self._futures:
            f.cancel()
        for f in self._futures:
            if not f.cancelled():
                try:
                    f.result()
                except BaseException as err:  # the failure is reported by close(); we only wait
                    log.debug("part of %s failed before abort: %s", self.key, redact(str(err)))
        self._futures = []
        self._pending = []
        self._done = True
        upload_id, self._upload_id = self._upload_id, None
        if upload_id is not None:
            with contextlib.suppress(errors.NotFoundError):  # already gone
                self._request(
                    "abort",
                    0,
                    "abort the multipart upload of",
                    lambda: self._sender.abort_upload(self._full, upload_id),
                )


class PieceReader:
    """A read-only file object over a list of buffers: lets a client library stream a part
    made of several caller buffers without joining them first (no copy of the whole part)."""

    def __init__(self, pieces: list[memoryview]) -> None:
        self._pieces = pieces
        self._len = sum(p.nbytes for p in pieces)
        self._pos = 0

    def __len__(self) -> int:
        return self._len

    MIN_READ = 2**20
    """Bytes; reads are served in blocks of at least this size: http.client asks for 8 KiB
    at a time and sends whatever it gets, so 1 MiB blocks make 128 times fewer Python calls
    per part."""

    def read(self, n: int = -1) -> bytes | memoryview:
        """At least ``n`` bytes (up to :attr:`MIN_READ`, or the rest): a slice of a caller
        buffer (no copy) when they lie in one piece, joined bytes when a read crosses pieces."""
        if n is None or n < 0:
            n = self._len - self._pos
        n = min(max(n, self.MIN_READ), self._len - self._pos)
        if n <= 0:
            return b""
        out: list[memoryview] = []
        pos, start, want = self._pos, 0, n
        for p in self._pieces:
            end = start + p.nbytes
            if pos < end:
                lo = pos - start
                take = min(p.nbytes - lo, want)
                out.append(p[lo : lo + take])
                pos += take
                want -= take
                if not want:
                    break
            start = end
        self._pos = pos
        return out[0] if len(out) == 1 else b"".join(out)

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._pos, 2: self._len}[whence]
        self._pos = max(0, min(self._len, base + offset))
        return self._pos

    def tell(self) -> int:
        return self._pos

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True


def one_buffer(pieces: list[memoryview]) -> bytes:
    """The part as one ``bytes`` (a copy): for client libraries that take nothing else."""
    return pieces[0].tobytes() if len(pieces) == 1 else b"".join(pieces)
