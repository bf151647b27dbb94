"""S3 through Apache Arrow's C++ filesystem (``pyarrow.fs.S3FileSystem``): ``s3+arrow://``.

Writes go through Arrow's output stream with ``background_writes``: Arrow copies the buffers
into its own part buffers (forced by the API) and uploads parts from its I/O thread pool
(resized to at least ``streams`` threads). Arrow chooses its own part size (it has no option
for it; ``part_size`` here only decides when ckptio aborts leftover uploads) and sends no
per-part checksum of ckptio's (the AWS SDK adds its own, see below). Reads are ``read_at`` on a
random-access file, copied into the caller's buffer. Arrow's own retries are off (``AwsStandardS3RetryStrategy(max_attempts=1)``): every
attempt is ours, traced.

The AWS SDK under Arrow sends each part as ``aws-chunked`` with a trailing checksum and no
``Content-Length``; S3 implementations that predate trailing checksums (Ceph RGW 16, for one)
answer 411 MissingContentLength (or 400 XAmzContentSHA256Mismatch where a proxy between
forwarded the body de-chunked, framing and all). On that answer the store rebuilds its filesystem with the
SDK's checksums set to "when required" (``AWS_REQUEST_CHECKSUM_CALCULATION=when_required``,
read by the SDK when the filesystem is made), logs it once, and sends the object again.

``publish(overwrite=False)`` is best effort (check, then PUT): Arrow cannot send
``If-None-Match``, so ``capabilities.conditional_create`` is False.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
from collections.abc import Iterable
from typing import Any, ClassVar, Literal, Unpack

from ckptio import errors
from ckptio.store import Capabilities, ObjectStat
from ckptio.trace import Trace

from . import _s3common as c
from ._s3config import S3Options, given

__all__ = ["ArrowStore"]

log = logging.getLogger(__name__)
_ENV_LOCK = threading.Lock()
_CHECKSUM_ENV = "AWS_REQUEST_CHECKSUM_CALCULATION"


class ArrowStore(c.WholeObjectStore):
    """S3 through ``pyarrow.fs``.

    URL: ``s3+arrow://bucket/prefix``. Options: those of every S3 store
    (:class:`~ckptio.backends._s3config.S3Options`), two of them read Arrow's way: Arrow
    chooses its own part size (``part_size`` only decides when ckptio aborts leftover
    uploads), and ``streams`` is the least number of Arrow I/O threads; ``trace``.
    """

    schemes: ClassVar[tuple[str, ...]] = ("s3+arrow",)
    name: ClassVar[str] = "s3+arrow"
    capabilities: ClassVar[Capabilities] = dataclasses.replace(
        c.S3_CAPABILITIES, conditional_create=False
    )

    def __init__(
        self,
        url: str,
        *,
        trace: Trace | None = None,
        **options: Unpack[S3Options],
    ) -> None:
        opts = given(options)
        pyarrow = errors.require("pyarrow", extra="s3", purpose="the s3+arrow backend")
        from pyarrow import fs as pafs

        super().__init__(url, trace=trace)
        self._setup(opts)
        aws = self.aws
        kw: dict[str, Any] = {
            "region": aws.region,
            "connect_timeout": aws.connect_timeout,
            "request_timeout": aws.read_timeout,
            "background_writes": True,
            "retry_strategy": pafs.AwsStandardS3RetryStrategy(max_attempts=1),
            "force_virtual_addressing": aws.addressing_style == "virtual",
        }
        kw.update(
            aws.signing(
                anonymous=("anonymous", True),
                key="access_key",
                secret="secret_key",
                token="session_token",
            )
        )
        if aws.endpoint_url:
            scheme, _, host = aws.endpoint_url.partition("://")
            kw.update(scheme=scheme, endpoint_override=host)
        self._fs_kw = kw
        self._pafs = pafs
        self._fs_lock = threading.Lock()
        self._trailing_checksums = True
        self.fs = pafs.S3FileSystem(**kw)
        if pyarrow.io_thread_count() < self.streams:
            pyarrow.set_io_thread_count(self.streams)

    # -- writes -----------------------------------------------------------------------------
    def _upload(
        self,
        full: str,
        pieces: list[memoryview],
        nbytes: int,
        mode: Literal["create", "overwrite"] = "overwrite",
    ) -> None:
        """Arrow has no conditional write: ``mode="create"`` is refused (publish checks first)."""
        if mode != "overwrite":
            raise errors.InvalidArgumentError(f"{self.name} cannot create {full!r} only if absent")
        fs = self.fs
        try:
            self._write_stream(fs, full, pieces)
        except OSError as err:
            text = str(err)
            refused = "MissingContentLength" in text or "XAmzContentSHA256Mismatch" in text
            if not refused or not self._without_trailing_checksums(fs):
                raise
            self._abort_uploads_of(full)
            self._write_stream(self.fs, full, pieces)

    def _without_trailing_checksums(self, failed: Any) -> bool:
        """After a refused aws-chunked upload on the filesystem ``failed``: make the filesystem
        again with the SDK's checksums "when required" (see module notes). True when the
        object should be sent again; False when ``failed`` already was that filesystem."""
        with self._fs_lock:
            if not self._trailing_checksums:
                return failed is not self.fs  # another thread switched: send on the new one
            with _ENV_LOCK:
                before = os.environ.get(_CHECKSUM_ENV)
                os.environ[_CHECKSUM_ENV] = "when_required"
                try:
                    self.fs = self._pafs.S3FileSystem(**self._fs_kw)
                finally:
                    if before is None:
                        del os.environ[_CHECKSUM_ENV]
                    else:
                        os.environ[_CHECKSUM_ENV] = before
            self._trailing_checksums = False
        log.warning(
            "%s: the server refused aws-chunked uploads (MissingContentLength or "
            "XAmzContentSHA256Mismatch): sending parts "
            "with Content-Length and without the SDK's trailing checksums",
            self.where,
        )
        return True

    def _write_stream(self, fs: Any, full: str, pieces: list[memoryview]) -> None:
        stream = fs.open_output_stream(self._path(full))
        try:
            for p in pieces:
                stream.write(p)
        except BaseException:
            stream.close()  # Arrow has no abort: the caller aborts the upload left open
            raise
        stream.close()

    def publish(self, key: str, data: bytes, *, overwrite: bool = True) -> None:
        """Best effort without ``overwrite``: check, then PUT (Arrow cannot send
        ``If-None-Match``). Each attempt aborts the upload it leaves open on failure (Arrow
        writes even small objects as a multipart upload)."""
        full = self._full(key)
        data = bytes(data)
        if not overwrite and self.exists(key):
            raise errors.AlreadyExistsError(f"{self.name}://{self._path(full)} already exists")
        self._call(
            "put",
            key,
            len(data),
            "publish",
            lambda: self._upload_or_abort(full, [memoryview(data)], len(data)),
        )

    # -- reads ------------------------------------------------------------------------------
    def _read_range(self, key: str, full: str, offset: int, out: memoryview) -> int:
        with self.fs.open_input_file(self._path(full)) as f:
            size = f.size()
            want = max(0, min(out.nbytes, size - offset))
            if want == 0:
                return 0
            buf = f.read_at(want, offset)
        return self._check_read(key, c.copy_into(out, buf), want)

    # -- metadata ---------------------------------------------------------------------------
    def list(self, prefix: str = "") -> list[str]:
        full = self._full_prefix(prefix)
        directory = self._path(full.rsplit("/", 1)[0]) if "/" in full else self.bucket
        want = self._path(full)
        strip = len(self._path(self.prefix)) + 1 if self.prefix else len(self.bucket) + 1

        def run() -> list[str]:
            sel = self._pafs.FileSelector(directory, recursive=True, allow_not_found=True)
            infos = self.fs.get_file_info(sel)
            return [
                i.path[strip:]
                for i in infos
                if i.type == self._pafs.FileType.File and i.path.startswith(want)
            ]

        return sorted(self._call("list", prefix, 0, "list", run))

    def stat(self, key: str) -> ObjectStat:
        """One ``get_file_info`` (a HEAD); its ``mtime`` is the server's ``LastModified``."""
        path = self._path(self._full(key))
        info = self._call("head", key, 0, "stat", lambda: self.fs.get_file_info(path))
        if info.type != self._pafs.FileType.File:
            raise errors.NotFoundError(f"{self.where}: no object {key!r}")
        return ObjectStat(int(info.size), c.timestamp(info.mtime))

    def delete(self, keys: Iterable[str]) -> None:
        # through botocore: pyarrow's delete_file writes a directory marker ("prefix/") when
        # it removes the last object under a prefix, a stray object left in the bucket
        self._delete_objects(self._mpu_client(), keys)
