"""Amazon S3 (and S3-compatible stores) through boto3/botocore: ``s3+boto3://bucket/prefix``,
and plain ``s3://``: of the four S3 backends, this one is the default, because it moves a
checkpoint with the least client CPU per GB and the highest throughput
(``benchmarks/s3_peers.py`` measures the four side by side).

Writes are S3 multipart uploads driven by ckptio itself (:class:`MultipartWriter`): parts of
``part_size`` bytes, sent by a pool of ``streams`` threads shared by every object of the store,
each part carrying its CRC32C (``x-amz-checksum-crc32c``, verified by S3 before it accepts the
part), no whole-object MD5. Buffers are sliced, never joined, when a part lies inside one
caller buffer. Reads are ranged GETs of presigned URLs (:class:`PresignedGets`), received
straight into the caller's buffer.

botocore's own retries are off (``total_max_attempts=1``): every attempt goes through
:meth:`Store.retrying`, so the trace counts each retry and each 503 SlowDown.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar, Unpack

from ckptio.store import Capabilities, ObjectStat, Writer, option_bool
from ckptio.trace import Trace

from . import _s3common as c
from ._s3config import S3Options, canonical_options, given, make_boto3_client, own_options
from ._s3errors import error_details
from ._s3multipart import MultipartWriter, PieceReader, crc32c_b64, crc32c_of
from ._s3presigned import PresignedGets, receive

__all__ = ["Boto3Options", "Boto3Store", "S3Options"]


class _BotoSender:
    def __init__(self, client: Any, bucket: str, checksum: bool) -> None:
        self.client = client
        self.bucket = bucket
        self.checksum = checksum

    def _crc(self, crc: int | None) -> dict[str, str]:
        return {"ChecksumCRC32C": crc32c_b64(crc)} if crc is not None else {}

    def put_object(self, key: str, pieces: list[memoryview], nbytes: int, crc: int | None) -> None:
        self.client.put_object(
            Bucket=self.bucket,
            Key=key,
            Body=PieceReader(pieces),
            ContentLength=nbytes,
            **self._crc(crc),
        )

    def create_upload(self, key: str) -> str:
        extra = {"ChecksumAlgorithm": "CRC32C"} if self.checksum else {}
        return self.client.create_multipart_upload(Bucket=self.bucket, Key=key, **extra)["UploadId"]

    def upload_part(
        self,
        key: str,
        upload_id: str,
        number: int,
        pieces: list[memoryview],
        nbytes: int,
        crc: int | None,
    ) -> dict[str, Any]:
        resp = self.client.upload_part(
            Bucket=self.bucket,
            Key=key,
            UploadId=upload_id,
            PartNumber=number,
            Body=PieceReader(pieces),
            ContentLength=nbytes,
            **self._crc(crc),
        )
        part = {"PartNumber": number, "ETag": resp["ETag"]}
        if crc is not None:
            part["ChecksumCRC32C"] = resp.get("ChecksumCRC32C") or crc32c_b64(crc)
        return part

    def complete_upload(self, key: str, upload_id: str, parts: list[dict[str, Any]]) -> None:
        self.client.complete_multipart_upload(
            Bucket=self.bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": parts}
        )

    def abort_upload(self, key: str, upload_id: str) -> None:
        self.client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id)


class Boto3Options(S3Options, total=False):
    """The options of ``s3+boto3://`` (and ``s3://``): those of every S3 store and two more."""

    checksum: bool | str | None
    """Send a CRC32C with every part and PUT, for S3 to check. Default True. **Environment
    variable**: none."""
    presigned_reads: bool | str | None
    """Send ranged GETs as presigned URLs through botocore's HTTP session, not
    ``get_object`` (less client CPU per request:
    :class:`~ckptio.backends._s3presigned.PresignedGets`, measured by
    ``benchmarks/s3_request_cpu.py``); False sends every read through ``get_object``.
    Default True. **Environment variable**: none."""


class Boto3Store(c.S3Base):
    """S3 through boto3/botocore.

    URL: ``s3+boto3://bucket/prefix`` (and ``s3://``). Options: :class:`Boto3Options`, those
    of every S3 store (:class:`~ckptio.backends._s3config.S3Options`) and two of its own; a
    ``part_size`` too small for an object of known size (``size_hint``) is raised so the
    object fits in 10,000 parts. ``trace``: a :class:`~ckptio.trace.Trace`.

    Commit: ``publish`` is one PUT; with ``overwrite=False`` it sends ``If-None-Match: *`` so
    S3 itself refuses a second manifest (S3 and moto support it; some S3 clones do not).
    """

    schemes: ClassVar[tuple[str, ...]] = ("s3+boto3", "s3")
    name: ClassVar[str] = "s3+boto3"
    capabilities: ClassVar[Capabilities] = c.S3_CAPABILITIES
    OPTIONS = own_options(Boto3Options)

    def __init__(
        self,
        url: str,
        *,
        trace: Trace | None = None,
        **options: Unpack[Boto3Options],
    ) -> None:
        # under ckptio's names first: storage_options={"checksum": ...} sets checksum too
        opts = canonical_options(given(options))
        super().__init__(url, trace=trace)
        self.checksum = option_bool(opts.pop("checksum", True), field="checksum")
        self.presigned_reads = option_bool(
            opts.pop("presigned_reads", True), field="presigned_reads"
        )
        self._setup(opts)
        self.client = make_boto3_client(self.aws, pool_connections=self.streams + 4)
        self._janitor_client = self.client
        self._sender = _BotoSender(self.client, self.bucket, self.checksum)
        self._presigned: PresignedGets | None = None
        if self.presigned_reads and hasattr(
            getattr(self.client, "_endpoint", None), "http_session"
        ):
            presigner = make_boto3_client(self.aws, pool_connections=1, sigv4=True)
            self._presigned = PresignedGets(self.client, presigner, self.bucket)
        self._pool = ThreadPoolExecutor(self.streams, thread_name_prefix=c.POOL_THREADS)

    # -- writes ---------------------------------------------------------------------------------
    def open_writer(self, key: str, *, size_hint: int | None = None) -> Writer:
        return MultipartWriter(
            self,
            self._sender,
            self._full(key),
            key,
            part_size=self.part_size,
            pool=self._pool,
            checksum=self.checksum,
            size_hint=size_hint,
        )

    def _publish_request(self, full: str, data: bytes, *, overwrite: bool) -> Callable[[], None]:
        """One PUT; ``If-None-Match: *`` when not overwriting; CRC32C computed once."""
        extra: dict[str, Any] = {} if overwrite else {"IfNoneMatch": "*"}
        if self.checksum:
            extra["ChecksumCRC32C"] = crc32c_b64(crc32c_of([memoryview(data)]))
        return lambda: self.client.put_object(Bucket=self.bucket, Key=full, Body=data, **extra)

    # -- reads ----------------------------------------------------------------------------------
    def _parts_pool(self) -> ThreadPoolExecutor:
        return self._pool

    def _read_range(self, key: str, full: str, offset: int, out: memoryview) -> int:
        rng = f"bytes={offset}-{offset + out.nbytes - 1}"
        if self._presigned is not None:
            got = self._presigned.get(full, rng, out)
            if got is not None:
                return self._check_read(key, *got)
        try:
            resp = self.client.get_object(Bucket=self.bucket, Key=full, Range=rng)
        except Exception as err:
            code, status = error_details(err)
            if code == "InvalidRange" or status == 416:
                return 0  # offset at or past the end
            raise
        raw = resp["Body"]._raw_stream  # the urllib3 response
        return self._check_read(key, *receive(raw, int(resp["ContentLength"]), out))

    # -- metadata -------------------------------------------------------------------------------
    def list(self, prefix: str = "") -> list[str]:
        full = self._full_prefix(prefix)

        def run() -> list[str]:
            keys: list[str] = []
            token: str | None = None
            while True:
                kw: dict[str, Any] = {"Bucket": self.bucket, "Prefix": full}
                if token:
                    kw["ContinuationToken"] = token
                resp = self.client.list_objects_v2(**kw)
                keys += [self._rel(o["Key"]) for o in resp.get("Contents", ())]
                if not resp.get("IsTruncated"):
                    return keys
                token = resp["NextContinuationToken"]

        return sorted(self._call("list", prefix, 0, "list", run))

    def stat(self, key: str) -> ObjectStat:
        """One HEAD; ``LastModified`` is the server's clock (whole seconds on AWS)."""
        full = self._full(key)
        resp = self._call(
            "head", key, 0, "stat", lambda: self.client.head_object(Bucket=self.bucket, Key=full)
        )
        return ObjectStat(int(resp["ContentLength"]), c.timestamp(resp.get("LastModified")))

    def delete(self, keys: Iterable[str]) -> None:
        self._delete_objects(self.client, keys)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self.client.close()
        self._janitor_client = None
