"""Presigned reads: ranged GETs of presigned (SigV4 query-signed) URLs sent through a
botocore client's own HTTP session (:class:`PresignedGets`), and :func:`receive`, which reads
a urllib3 response body straight into the caller's buffer.
"""

from __future__ import annotations

import re
import time
from typing import Any

from ckptio.arrays import prefault


def receive(raw: Any, expected: int, out: memoryview) -> tuple[int, int]:
    """Read the ``expected`` body bytes of the urllib3 response ``raw`` into ``out``; returns
    ``(bytes read, expected)``. The connection goes back to the pool when the whole body was
    read, and is closed otherwise."""
    # urllib3 2's readinto reads into a temporary and copies; http.client's (under it)
    # receives straight into the caller's buffer. Use it when nothing decodes the body.
    fp = getattr(raw, "_fp", None)
    direct = fp is not None and hasattr(fp, "readinto") and not raw.headers.get("Content-Encoding")
    reader: Any = fp if direct else raw
    prefault(out[:expected])  # map the pages in one call, not one fault each
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
        err.kwargs = {  # type: ignore[attr-defined]  # botocore's exceptions carry kwargs
            k: _QUERY.sub("?...", v) if isinstance(v, str) else type(v).__name__
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


class PresignedGets:
    """Ranged GETs sent as presigned (SigV4 query-signed) URLs through the botocore client's
    own HTTP session, bypassing botocore's per-request machinery.

    Why by hand: botocore's per-request pipeline (event hooks, endpoint rules, signing,
    response parsing, user agent) costs several times the client CPU of a GET of a presigned
    URL kept per object, and at part-sized ranges it is most of the client CPU of a
    download; ``benchmarks/s3_request_cpu.py`` measures the two side by side
    (``benchmarks/s3_peers.py --op read``: whole downloads). No library sends
    botocore-configured ranged GETs without that pipeline. The URL is made by botocore (same
    endpoint, addressing style, region and credentials as the client), sent by botocore's
    ``URLLib3Session`` (same proxies, TLS verification, timeouts and connection pool), and
    kept for :attr:`REUSE` seconds of its :attr:`EXPIRES`.

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
            return receive(raw, int(resp.headers["Content-Length"]), out)
        if resp.status_code >= 500:  # the service's own trouble: an error, retried as any
            raise _service_error(resp.status_code, raw)
        raw.close()
        if resp.status_code == 416:
            return 0, 0
        self._urls.pop(full, None)
        return None
