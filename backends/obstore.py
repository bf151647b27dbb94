"""S3 through obstore (Rust ``object_store``): ``s3+obstore://bucket/prefix``.

Writes hand the caller's buffers to ``obstore.put`` at ``close``: a single PUT for objects up
to ``part_size``, else a multipart upload of ``part_size`` parts, ``streams`` in flight, run by
Rust threads without the GIL. obstore copies the buffers into Rust-owned memory (forced by the
API) and sends no per-part CRC32C (object_store offers only SHA-256 checksums). Reads are
``get_range`` copied into the caller's buffer. object_store's own retries are off
(``max_retries=0``): every attempt is ours, traced.

``publish(overwrite=False)`` uses obstore's ``mode="create"`` which sends ``If-None-Match: *``.
"""

from __future__ import annotations

import builtins
import contextlib
import datetime
from collections.abc import Iterable
from typing import Any, ClassVar, Literal, Unpack

from ckptio import errors
from ckptio.store import Capabilities, ObjectStat
from ckptio.trace import Trace

from . import _s3common as c
from ._s3config import S3Options, given

__all__ = ["ObstoreStore"]


class ObstoreStore(c.WholeObjectStore):
    """S3 through obstore.

    URL: ``s3+obstore://bucket/prefix``. Options: those of every S3 store
    (:class:`~ckptio.backends._s3config.S3Options`); ``trace``.
    """

    schemes: ClassVar[tuple[str, ...]] = ("s3+obstore",)
    name: ClassVar[str] = "s3+obstore"
    capabilities: ClassVar[Capabilities] = c.S3_CAPABILITIES

    def __init__(
        self,
        url: str,
        *,
        trace: Trace | None = None,
        **options: Unpack[S3Options],
    ) -> None:
        opts = given(options)
        obstore = errors.require("obstore", extra="s3", purpose="the s3+obstore backend")
        from obstore.store import S3Store

        super().__init__(url, trace=trace)
        self._setup(opts)
        aws = self.aws
        config: dict[str, Any] = {
            "region": aws.region,
            "virtual_hosted_style_request": aws.addressing_style == "virtual",
            "conditional_put": "etag",  # If-None-Match: * for mode="create"
        }
        config.update(
            aws.signing(
                anonymous=("skip_signature", True),
                key="access_key_id",
                secret="secret_access_key",
                token="session_token",
            )
        )
        if aws.endpoint_url:
            config["endpoint"] = aws.endpoint_url
        self._obs = obstore
        self.store = S3Store(
            self.bucket,
            config=config,  # type: ignore[arg-type]  # a TypedDict built key by key
            client_options={
                "connect_timeout": datetime.timedelta(seconds=aws.connect_timeout),
                "timeout": datetime.timedelta(seconds=aws.read_timeout),
                "allow_http": aws.allow_http,
            },
            retry_config={"max_retries": 0, "retry_timeout": datetime.timedelta(seconds=1)},
        )

    # -- writes -----------------------------------------------------------------------------
    def _upload(
        self,
        full: str,
        pieces: list[memoryview],
        nbytes: int,
        mode: Literal["create", "overwrite"] = "overwrite",
    ) -> None:
        data: Any = pieces[0] if len(pieces) == 1 else iter(pieces)
        if not pieces:
            data = b""
        self._obs.put(
            self.store,
            full,
            data,
            mode=mode,
            use_multipart=mode == "overwrite" and nbytes > self.part_size,  # create: one PUT
            chunk_size=self.part_size,
            max_concurrency=self.streams,
        )

    # -- reads ------------------------------------------------------------------------------
    def _read_range(self, key: str, full: str, offset: int, out: memoryview) -> int:
        try:
            data = self._obs.get_range(self.store, full, start=offset, length=out.nbytes)
        except Exception as err:
            text = str(err)
            if "range" in text.lower() and "not" not in type(err).__name__.lower():
                size = self._obs.head(self.store, full)["size"]  # raises if missing
                if offset >= size:
                    return 0
                data = self._obs.get_range(self.store, full, start=offset, end=size)
            else:
                raise
        return c.copy_into(out, data)

    # -- metadata ---------------------------------------------------------------------------
    def list(self, prefix: str = "") -> list[str]:
        full = self._full_prefix(prefix)
        # object_store lists whole path segments; filter by string prefix ourselves
        directory = full.rsplit("/", 1)[0] if "/" in full else None

        def run() -> list[str]:
            keys: list[str] = []
            try:
                for batch in self._obs.list(self.store, prefix=directory):
                    keys += [m["path"] for m in batch if m["path"].startswith(full)]
            except self._obs.exceptions.InvalidPathError:
                # a key object_store cannot represent (a "..", "." or empty segment: S3 takes
                # any key, and another tool may have written one) fails the whole listing:
                # list through botocore instead, which sees every key as it is
                keys = self._list_all(full)
            return [self._rel(k) for k in keys]

        return sorted(self._call("list", prefix, 0, "list", run))

    def _list_all(self, full: str) -> builtins.list[str]:
        """Every key that starts with ``full``, listed through botocore."""
        pages = self._mpu_client().get_paginator("list_objects_v2")
        return [
            o["Key"]
            for page in pages.paginate(Bucket=self.bucket, Prefix=full)
            for o in page.get("Contents", ())
        ]

    def stat(self, key: str) -> ObjectStat:
        """One HEAD; ``last_modified`` is the server's clock."""
        full = self._full(key)
        meta = self._call("head", key, 0, "stat", lambda: self._obs.head(self.store, full))
        return ObjectStat(int(meta["size"]), c.timestamp(meta.get("last_modified")))

    def delete(self, keys: Iterable[str]) -> None:
        fulls = [self._full(k) for k in keys]
        if not fulls:
            return

        def run() -> None:
            with contextlib.suppress(FileNotFoundError):
                self._obs.delete(self.store, fulls)

        self._call("delete", c.batch_label(fulls), 0, "delete", run)
