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

import contextlib
import datetime
from collections.abc import Iterable
from typing import Any, ClassVar, Literal

from ckptio import errors
from ckptio.store import Buffer, Capabilities, Writer
from ckptio.trace import Trace

from . import _s3common as c


class ObstoreStore(c.S3Base):
    """S3 through obstore.

    URL: ``s3+obstore://bucket/prefix``. Options: ``part_size`` (bytes, default 8 MiB,
    5 MiB..5 GiB), ``streams`` (int, default 8), the AWS connection options shared by every S3
    backend (``endpoint_url``, ``region``, ``profile``, ``access_key_id``,
    ``secret_access_key``, ``session_token``, ``anonymous``, ``addressing_style``, ``connect_timeout``, ``read_timeout``), ``trace``.
    """

    schemes: ClassVar[tuple[str, ...]] = ("s3+obstore",)
    name: ClassVar[str] = "s3+obstore"
    capabilities: ClassVar[Capabilities] = Capabilities(
        atomic_rename=False,
        range_reads=True,
        durable_flush=True,
        conditional_create=True,
        multipart=True,
        listing=True,
    )

    def __init__(self, url: str, *, trace: Trace | None = None, **options: Any) -> None:
        import obstore
        from obstore.store import S3Store

        super().__init__(url, trace=trace)
        self._setup(url, options)
        c.reject_unknown(self.name, options, self.OPTIONS)
        aws = self.aws
        config: dict[str, Any] = {
            "region": aws.region,
            "virtual_hosted_style_request": aws.addressing_style == "virtual",
            "conditional_put": "etag",  # If-None-Match: * for mode="create"
        }
        if aws.anonymous:
            config["skip_signature"] = True
        elif aws.has_credentials:
            config["access_key_id"] = aws.access_key_id
            config["secret_access_key"] = aws.secret_access_key
            if aws.session_token:
                config["session_token"] = aws.session_token
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
            use_multipart=nbytes > self.part_size,
            chunk_size=self.part_size,
            max_concurrency=self.streams,
        )

    def open_writer(self, key: str, *, size_hint: int | None = None) -> Writer:
        return c.WholeObjectWriter(self, key, self._full(key), self._upload)

    def publish(self, key: str, data: bytes, *, overwrite: bool = True) -> None:
        full = self._full(key)
        data = bytes(data)
        attempts = [0]

        def put() -> None:
            attempts[0] += 1
            self._upload(full, [memoryview(data)], len(data), "overwrite" if overwrite else "create")

        try:
            self._call("put", key, len(data), "publish", put)
        except errors.AlreadyExistsError:
            if attempts[0] > 1 and self._get_or_none(key) == data:
                return  # our own earlier attempt landed before its response was lost
            raise errors.AlreadyExistsError(
                f"{self.where}/{full} already exists (another writer committed it)"
            ) from None

    def _get_or_none(self, key: str) -> bytes | None:
        try:
            return self.get(key)
        except errors.NotFoundError:
            return None

    # -- reads ------------------------------------------------------------------------------
    def read_into(self, key: str, offset: int, buffer: Buffer) -> int:
        full = self._full(key)
        out = memoryview(buffer).cast("B")
        if offset < 0:
            raise errors.InvalidArgumentError(f"negative offset {offset} for {key!r}")
        if out.nbytes == 0:
            return 0

        def get() -> int:
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
            view = memoryview(data)
            n = view.nbytes
            out[:n] = view
            return n

        return self._call("get", key, out.nbytes, "read", get)

    # -- metadata ---------------------------------------------------------------------------
    def list(self, prefix: str = "") -> list[str]:
        full = self._full_prefix(prefix)
        # object_store lists whole path segments; filter by string prefix ourselves
        directory = full.rsplit("/", 1)[0] if "/" in full else None

        def run() -> list[str]:
            keys: list[str] = []
            for batch in self._obs.list(self.store, prefix=directory):
                keys += [m["path"] for m in batch if m["path"].startswith(full)]
            return [self._rel(k) for k in keys]

        return sorted(self._call("list", prefix, 0, "list", run))

    def size(self, key: str) -> int:
        full = self._full(key)
        meta = self._call("head", key, 0, "stat", lambda: self._obs.head(self.store, full))
        return int(meta["size"])

    def delete(self, keys: Iterable[str]) -> None:
        fulls = [self._full(k) for k in keys]
        if not fulls:
            return

        def run() -> None:
            with contextlib.suppress(FileNotFoundError):
                self._obs.delete(self.store, fulls)

        self._call("delete", fulls[0] if len(fulls) == 1 else f"{len(fulls)} keys", 0, "delete", run)
