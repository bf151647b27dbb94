"""Any fsspec filesystem: ``s3+fsspec://bucket/prefix`` (s3fs) and ``fsspec+<proto>://path``
(gcsfs, adlfs, memory, ... whatever fsspec knows, with their own options).

Writes hand the whole object to ``fs.pipe_file`` at ``close``: for s3fs that is a multipart
upload of ``part_size`` parts, ``streams`` at a time, aborted by s3fs on failure. fsspec's
pipe takes one ``bytes`` object, so every object is joined once (one copy of the object,
forced by the API: aiobotocore refuses memoryviews). Reads are
``cat_file(start, end)`` copied into the caller's buffer.

For S3, s3fs's own retries are off (``retries=1`` and botocore's ``total_max_attempts=1``):
every attempt goes through :meth:`Store.retrying` and is traced. For other protocols retries
are whatever that filesystem does, plus ours for errors that look transient.
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
from collections.abc import Callable, Iterable
from typing import Any, ClassVar, Literal, Unpack

from ckptio import errors
from ckptio.registry import parse_url
from ckptio.store import Capabilities, ObjectStat, StoreInfo
from ckptio.trace import Trace

from . import _s3common as c
from ._s3config import (
    AwsSettings,
    S3Options,
    botocore_config,
    given,
    io_options,
    reject_unknown,
)
from ._s3errors import error_details
from ._s3multipart import one_buffer

__all__ = ["FsspecStore"]


class FsspecStore(c.WholeObjectStore):
    """A store on an fsspec filesystem.

    URLs: ``s3+fsspec://bucket/prefix`` (s3fs), ``fsspec+<proto>://<path>`` (e.g.
    ``fsspec+gs://bucket/ckpt``, ``fsspec+memory://tmp/ckpt``).

    Options: those of every S3 store (:class:`~ckptio.backends._s3config.S3Options`;
    ``part_size`` and ``streams`` are s3fs's multipart part size and parts in flight); for a
    protocol other than S3 only ``part_size``, ``streams`` and ``storage_options`` (a dict for
    ``fsspec.filesystem``; ``fsspec+file://``: ``auto_mkdir`` defaults to True). ``trace``.
    """

    schemes: ClassVar[tuple[str, ...]] = ("s3+fsspec", "fsspec")
    name: ClassVar[str] = "s3+fsspec"
    capabilities: ClassVar[Capabilities] = c.S3_CAPABILITIES  # s3fs: If-None-Match for "create"

    def __init__(
        self,
        url: str,
        *,
        trace: Trace | None = None,
        **options: Unpack[S3Options],
    ) -> None:
        opts = given(options)
        fsspec = errors.require(
            "fsspec", extra="s3", purpose="the fsspec backends (s3+fsspec://, fsspec+<protocol>://)"
        )

        super().__init__(url, trace=trace)
        loc = parse_url(url)
        proto = loc.protocol or "s3"  # s3+fsspec://
        self.protocol = proto
        self._is_s3 = proto in ("s3", "s3a")
        if self._is_s3:
            self._setup(opts)
            self.fs = _s3fs(self.aws, self.streams)
            self.root = f"{self.bucket}/{self.prefix}" if self.prefix else self.bucket
        else:
            fs_options = dict(opts.pop("storage_options", None) or {})
            if loc.local:  # fsspec's local filesystem writes into existing directories only
                fs_options.setdefault("auto_mkdir", True)
            self.part_size, self.streams = io_options(opts)
            reject_unknown(
                f"fsspec+{proto}",
                opts,
                ("part_size", "streams", "storage_options"),
                spellings=False,
            )
            self.aws = AwsSettings(region="", endpoint_url=None)
            self.bucket, self.prefix = loc.host, ""
            self._janitor_client = None
            self.fs = fsspec.filesystem(proto, **fs_options)
            # a local path keeps its leading "/"; other protocols' paths are host + path
            self.root = (loc.host + loc.path).rstrip("/") or ("/" if loc.local else "")
            self.name = f"fsspec+{proto}"  # type: ignore[misc]
            self.capabilities = Capabilities(  # type: ignore[misc]
                atomic_rename=False, conditional_create=False, multipart=False, listing=True
            )

    def describe(self) -> StoreInfo:
        local = self.root if parse_url(self._given_url).local else None
        return dataclasses.replace(super().describe(), local_path=local)

    @property
    def where(self) -> str:
        return f"{self.name}://{self.root}"

    def _path(self, full: str) -> str:
        # full is relative to the bucket for S3; build the fsspec path
        if self._is_s3:
            return f"{self.bucket}/{full}"
        return f"{self.root}/{full}" if self.root else full

    def _full(self, key: str) -> str:
        if self._is_s3:
            return super()._full(key)
        from ckptio.store import check_key

        return check_key(key)

    # -- writes -----------------------------------------------------------------------------
    def _upload(
        self,
        full: str,
        pieces: list[memoryview],
        nbytes: int,
        mode: Literal["create", "overwrite"] = "overwrite",
    ) -> None:
        data = one_buffer(pieces)  # pipe_file (aiobotocore underneath) takes bytes only
        path = self._path(full)
        if self._is_s3:
            # s3fs sends one PUT below 2 chunks: "create" always is one (see S3Base.publish)
            chunk = self.part_size if mode == "overwrite" else max(self.part_size, nbytes)
            self.fs.pipe_file(path, data, chunksize=chunk, max_concurrency=self.streams, mode=mode)
        else:
            self.fs.pipe_file(path, data)

    def _publish_request(self, full: str, data: bytes, *, overwrite: bool) -> Callable[[], None]:
        upload = super()._publish_request(full, data, overwrite=overwrite)
        if overwrite or self._is_s3:
            return upload

        def check_then_upload() -> None:  # no conditional write outside S3: best effort
            if self.fs.exists(self._path(full)):
                raise errors.AlreadyExistsError(f"{self.where}/{full} already exists")
            upload()

        return check_then_upload

    # -- reads ------------------------------------------------------------------------------
    def get(self, key: str) -> bytes:
        """The whole object, as the ``bytes`` ``cat_file`` returns: not received into a buffer
        and copied out again (Store.get), which would hold a manifest three times over."""
        full = self._full(key)
        return bytes(self._call("get", key, 0, "read", lambda: self.fs.cat_file(self._path(full))))

    def _read_range(self, key: str, full: str, offset: int, out: memoryview) -> int:
        path = self._path(full)
        try:
            data = self.fs.cat_file(path, start=offset, end=offset + out.nbytes)
        except Exception as err:
            code, status = error_details(err)
            if code == "InvalidRange" or status == 416:
                self.fs.info(path)  # raises if the key is missing
                return 0
            raise
        return c.copy_into(out, data)

    # -- metadata ---------------------------------------------------------------------------
    def list(self, prefix: str = "") -> list[str]:
        c.check_prefix(prefix)
        root = self.root.rstrip("/")  # a local path keeps its leading "/" (fsspec+file:///x)
        base = f"{root}/{prefix}" if root else prefix
        directory = base.rsplit("/", 1)[0] if "/" in prefix else root
        want = base.lstrip("/")  # found paths are compared without their leading "/"
        strip = len(root.lstrip("/")) + 1 if root.lstrip("/") else 0

        def run() -> list[str]:
            with contextlib.suppress(FileNotFoundError):
                found = (p.lstrip("/") for p in self.fs.find(directory, withdirs=False))
                return [p[strip:] for p in found if p.startswith(want)]
            return []

        return sorted(self._call("list", prefix, 0, "list", run))

    def stat(self, key: str) -> ObjectStat:
        """One ``info`` (a HEAD on S3): its ``LastModified`` (s3fs) or ``mtime`` (local)."""
        path = self._path(self._full(key))
        info = self._call("head", key, 0, "stat", lambda: self.fs.info(path))
        if info.get("type") == "directory":
            raise errors.NotFoundError(f"{self.where}: no object {key!r}")
        return ObjectStat(
            int(info["size"]), c.timestamp(info.get("LastModified", info.get("mtime")))
        )

    def delete(self, keys: Iterable[str]) -> None:
        paths = [self._path(self._full(k)) for k in keys]
        if not paths:
            return

        def run() -> None:
            if self._is_s3:
                self.fs.rm(paths)  # DeleteObjects in batches; missing keys are fine
                return
            for p in paths:
                with contextlib.suppress(FileNotFoundError):
                    self.fs.rm_file(p)

        self._call("delete", c.batch_label(paths), 0, "delete", run)

    def _abort_uploads_of(self, full: str) -> None:
        if self._is_s3:  # other filesystems have no S3 multipart uploads to abort
            super()._abort_uploads_of(full)

    def list_incomplete(self, prefix: str = "") -> builtins.list[str]:
        return super().list_incomplete(prefix) if self._is_s3 else []

    def cleanup_incomplete(self, prefix: str = "", *, older_than: float = 0.0) -> int:
        return super().cleanup_incomplete(prefix, older_than=older_than) if self._is_s3 else 0


def _s3fs(aws: AwsSettings, streams: int) -> Any:
    s3fs = errors.require("s3fs", extra="s3", purpose="the s3+fsspec backend")
    fs = s3fs.S3FileSystem(
        **aws.signing(anonymous=("anon", True), key="key", secret="secret", token="token"),
        endpoint_url=aws.endpoint_url,
        client_kwargs={"region_name": aws.region},
        config_kwargs=botocore_config(aws, pool_connections=streams + 4),
        skip_instance_cache=True,
        use_listings_cache=False,
        max_concurrency=streams,
    )
    fs.retries = 1  # s3fs's own retry loop: one attempt; ours retry and count
    return fs
