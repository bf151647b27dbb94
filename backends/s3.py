"""Amazon S3 (and S3-compatible stores) through boto3/botocore: ``s3+boto3://bucket/prefix``,
and plain ``s3://`` (the backend that measured fastest and cheapest in
``benchmarks/s3_peers.py``; see docs/performance.md, "S3 clients").

Writes are S3 multipart uploads driven by ckptio itself (:class:`MultipartWriter`): parts of
``part_size`` bytes, sent by a pool of ``streams`` threads shared by every object of the store,
each part carrying its CRC32C (``x-amz-checksum-crc32c``, verified by S3 before it accepts the
part), no whole-object MD5. Buffers are sliced, never joined, when a part lies inside one
caller buffer. Reads are ranged GETs of presigned URLs (:class:`_PresignedGets`), received
straight into the caller's buffer.

botocore's own retries are off (``total_max_attempts=1``): every attempt goes through
:meth:`Store.retrying`, so the trace counts each retry and each 503 SlowDown.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar

from ckptio import errors
from ckptio.store import Capabilities, Writer, option_bool
from ckptio.trace import Trace

from . import _s3common as c


class _BotoSender:
    def __init__(self, client: Any, bucket: str, checksum: bool) -> None:
        self.client = client
        self.bucket = bucket
        self.checksum = checksum

    def _crc(self, crc: int | None) -> dict[str, str]:
        return {"ChecksumCRC32C": c.crc32c_b64(crc)} if crc is not None else {}

    def put_object(self, key: str, pieces: list[memoryview], nbytes: int, crc: int | None) -> None:
        self.client.put_object(
            Bucket=self.bucket,
            Key=key,
            Body=c.PieceReader(pieces),
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
            Body=c.PieceReader(pieces),
            ContentLength=nbytes,
            **self._crc(crc),
        )
        part = {"PartNumber": number, "ETag": resp["ETag"]}
        if crc is not None:
            part["ChecksumCRC32C"] = resp.get("ChecksumCRC32C") or c.crc32c_b64(crc)
        return part

    def complete_upload(self, key: str, upload_id: str, parts: list[dict[str, Any]]) -> None:
        self.client.complete_multipart_upload(
            Bucket=self.bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": parts}
        )

    def abort_upload(self, key: str, upload_id: str) -> None:
        self.client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id)


def _receive(raw: Any, expected: int, out: memoryview) -> tuple[int, int]:
    """Read the ``expected`` body bytes of the urllib3 response ``raw`` into ``out``; returns
    ``(bytes read, expected)``. The connection goes back to the pool when the whole body was
    read, and is closed otherwise."""
    # urllib3 2's readinto reads into a temporary and copies; http.client's (under it)
    # receives straight into the caller's buffer. Use it when nothing decodes the body.
    fp = getattr(raw, "_fp", None)
    direct = fp is not None and hasattr(fp, "readinto") and not raw.headers.get("Content-Encoding")
    reader: Any = fp if direct else raw
    n = 0
    try:
        while n < expected:
            got = reader.readinto(out[n:expected])
            if not got:
                break
            n += got
    finally:
        if n == expected and direct:
            raw.release_conn()  # fully read: the connection goes back to the pool
        else:
            raw.close()
    return n, expected


_QUERY = re.compile(r"\?[^\s'\"]*")


def _without_url(err: Exception) -> Exception:
    """``err`` (botocore's exception for a failed send, kept so that ckptio translates it as
    any other) with every URL query string cut from its message and its causes dropped: the
    query of a presigned URL holds the access key id and a signature."""
    err.args = (_QUERY.sub("?...", str(err)),)
    kwargs = getattr(err, "kwargs", None)
    if isinstance(kwargs, dict):
        err.kwargs = {
            k: _QUERY.sub("?...", v) if isinstance(v, str) else type(v).__name__  # type: ignore[attr-defined]
            for k, v in kwargs.items()
        }
    err.__cause__ = err.__context__ = None
    return err


def _service_error(status: int, raw: Any) -> Exception:
    """botocore's ``ClientError`` for an S3 error answer of ``status`` (its code read from
    the XML body), so that ckptio translates it as any other: 503 SlowDown throttled, 500
    transient."""
    from botocore.exceptions import ClientError

    try:
        body = raw.read(64 * 1024)
    finally:
        raw.close()
    code = re.search(rb"<Code>([^<]{1,100})</Code>", body or b"")
    message = re.search(rb"<Message>([^<]{1,500})</Message>", body or b"")
    return ClientError(
        {
            "Error": {
                "Code": code.group(1).decode() if code else str(status),
                "Message": message.group(1).decode(errors="replace") if message else "",
            },
            "ResponseMetadata": {"HTTPStatusCode": status},
        },
        "GetObject",
    )


class _PresignedGets:
    """Ranged GETs sent as presigned (SigV4 query-signed) URLs through the botocore client's
    own HTTP session, bypassing botocore's per-request machinery.

    Why by hand: a ``get_object`` call costs ~4 ms of client CPU on this project's VM (event
    hooks, endpoint rules, signing, response parsing, user agent), which at 8 MiB ranges is
    most of the client CPU of a download; a GET of a presigned URL kept per object costs
    ~1.4 ms (``benchmarks/s3_request_cpu.py``; the effect on whole downloads:
    docs/performance.md, "S3 clients"). No library sends botocore-configured ranged GETs without botocore's
    per-request pipeline. The URL is
    made by botocore (same endpoint, addressing style, region and credentials as the
    client), sent by botocore's ``URLLib3Session`` (same proxies, TLS verification, timeouts
    and connection pool), and kept for :attr:`REUSE` seconds of its :attr:`EXPIRES`.

    2xx bodies are received into the caller's buffer, 416 means past the end, and a 5xx
    answer (503 SlowDown, 500) raises botocore's ``ClientError`` with the S3 error code, so
    the retry policy backs off and counts it as for any request. Any other answer (an
    expired or refused signature, a missing object) returns None, and the caller repeats the
    request through ``get_object``, whose error botocore parses and ckptio translates. URLs
    carry a signature and the access key id; they are never logged or put in an error
    message."""

    EXPIRES = 900
    REUSE = 300.0
    MAX_KEPT = 4096

    def __init__(self, client: Any, presigner: Any, bucket: str) -> None:
        from botocore.awsrequest import AWSPreparedRequest

        self._prepared = AWSPreparedRequest
        self._session = client._endpoint.http_session
        self._presigner = presigner
        self._bucket = bucket
        self._urls: dict[str, tuple[str, float]] = {}

    def _url(self, full: str) -> str:
        now = time.monotonic()
        kept = self._urls.get(full)
        if kept is not None and now - kept[1] < self.REUSE:
            return kept[0]
        url = self._presigner.generate_presigned_url(
            "get_object", Params={"Bucket": self._bucket, "Key": full}, ExpiresIn=self.EXPIRES
        )
        if len(self._urls) >= self.MAX_KEPT:
            self._urls.clear()
        self._urls[full] = (url, now)
        return url

    def get(self, full: str, rng: str, out: memoryview) -> tuple[int, int] | None:
        """``(bytes read, bytes sent)`` of the range ``rng`` of ``full`` received into
        ``out``, ``(0, 0)`` past the end; raises on 5xx; None for any other answer."""
        request = self._prepared("GET", self._url(full), {"Range": rng}, None, True)
        try:
            resp = self._session.send(request)
        except Exception as err:
            raise _without_url(err) from None
        raw = resp.raw
        if resp.status_code in (200, 206):
            return _receive(raw, int(resp.headers["Content-Length"]), out)
        if resp.status_code >= 500:  # the service's own trouble: an error, retried as any
            raise _service_error(resp.status_code, raw)
        raw.close()
        if resp.status_code == 416:
            return 0, 0
        self._urls.pop(full, None)
        return None


class Boto3Store(c.S3Base):
    """S3 through boto3/botocore.

    URL: ``s3+boto3://bucket/prefix``. Options (keyword-only; URL query strings work too):

    - ``part_size`` (bytes or ``"16MiB"``; default 8 MiB; S3 limits 5 MiB..5 GiB, raised
      automatically so an object fits in 10,000 parts when ``size_hint`` is given);
    - ``streams`` (int, default 8): requests in flight for the whole store;
    - ``checksum`` (bool, default True): send CRC32C with every part and PUT;
    - ``presigned_reads`` (bool, default True): send ranged GETs as presigned URLs through
      botocore's HTTP session, not ``get_object`` (less than half the client CPU per request;
      see :class:`_PresignedGets`); False sends every read through ``get_object``;
    - ``endpoint_url``, ``region``, ``profile``, ``access_key_id``, ``secret_access_key``,
      ``session_token``, ``anonymous``, ``addressing_style`` (``path``/``virtual``), ``connect_timeout`` / ``read_timeout`` (seconds): the AWS
      connection; unset ones come from the environment and AWS config files as the AWS CLI
      does (``AWS_ENDPOINT_URL`` included); the fsspec/s3fs and boto3 spellings of these (``key``, ``anon``, ``region_name``, ``storage_options={...}``, ...) work too: :data:`ckptio.backends._s3common.OPTION_SPELLINGS`;
    - ``trace``: a :class:`~ckptio.trace.Trace`.

    Commit: ``publish`` is one PUT; with ``overwrite=False`` it sends ``If-None-Match: *`` so
    S3 itself refuses a second manifest (S3 and moto support it; some S3 clones do not).
    """

    schemes: ClassVar[tuple[str, ...]] = ("s3+boto3", "s3")
    name: ClassVar[str] = "s3+boto3"
    capabilities: ClassVar[Capabilities] = c.S3_CAPABILITIES
    client_packages: ClassVar[tuple[str, ...]] = ("botocore",)
    OPTIONS = ("checksum", "presigned_reads", *c.S3Base.OPTIONS)

    def __init__(self, url: str, *, trace: Trace | None = None, **options: Any) -> None:
        super().__init__(url, trace=trace)
        options = c.canonical_options(options)  # storage_options={"checksum": ...} too
        self.checksum = option_bool(options.pop("checksum", True), field="checksum")
        self.presigned_reads = option_bool(
            options.pop("presigned_reads", True), field="presigned_reads"
        )
        self._setup(options)
        self.client = c.make_boto3_client(self.aws, pool_connections=self.streams + 4)
        self._janitor_client = self.client
        self._sender = _BotoSender(self.client, self.bucket, self.checksum)
        self._presigned: _PresignedGets | None = None
        if self.presigned_reads and hasattr(
            getattr(self.client, "_endpoint", None), "http_session"
        ):
            presigner = c.make_boto3_client(self.aws, pool_connections=1, sigv4=True)
            self._presigned = _PresignedGets(self.client, presigner, self.bucket)
        self._pool = ThreadPoolExecutor(self.streams, thread_name_prefix="ckptio-s3")

    # -- writes ---------------------------------------------------------------------------------
    def open_writer(self, key: str, *, size_hint: int | None = None) -> Writer:
        return c.MultipartWriter(
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
            extra["ChecksumCRC32C"] = c.crc32c_b64(c.crc32c_of([memoryview(data)]))
        return lambda: self.client.put_object(Bucket=self.bucket, Key=full, Body=data, **extra)

    # -- reads ----------------------------------------------------------------------------------
    def _read_range(self, key: str, full: str, offset: int, out: memoryview) -> int:
        rng = f"bytes={offset}-{offset + out.nbytes - 1}"
        if self._presigned is not None:
            got = self._presigned.get(full, rng, out)
            if got is not None:
                return self._check_read(key, *got)
        try:
            resp = self.client.get_object(Bucket=self.bucket, Key=full, Range=rng)
        except Exception as err:
            code, status = c.error_details(err)
            if code == "InvalidRange" or status == 416:
                return 0  # offset at or past the end
            raise
        raw = resp["Body"]._raw_stream  # the urllib3 response
        return self._check_read(key, *_receive(raw, int(resp["ContentLength"]), out))

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

    def size(self, key: str) -> int:
        full = self._full(key)
        resp = self._call(
            "head", key, 0, "stat", lambda: self.client.head_object(Bucket=self.bucket, Key=full)
        )
        return int(resp["ContentLength"])

    def delete(self, keys: Iterable[str]) -> None:
        fulls = [self._full(k) for k in keys]
        for start in range(0, len(fulls), 1000):  # S3 DeleteObjects takes at most 1000 keys
            batch = fulls[start : start + 1000]

            def run(batch: list[str] = batch) -> None:
                resp = self.client.delete_objects(
                    Bucket=self.bucket,
                    Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True},
                )
                failed = [e for e in resp.get("Errors", ()) if e.get("Code") != "NoSuchKey"]
                if failed:
                    raise errors.StorageError(
                        f"{self.name}: cannot delete {len(failed)} object(s), first: "
                        f"{failed[0].get('Key')!r}: {failed[0].get('Code')} {failed[0].get('Message')}"
                    )

            self._call("delete", c.batch_label(batch), 0, "delete", run)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self.client.close()
        self._janitor_client = None
