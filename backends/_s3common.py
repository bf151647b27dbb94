"""What the four S3 backends share: AWS-style configuration, S3 limits, the one table that
translates S3 errors into ckptio errors, the multipart writer engine, and the
store base classes (:class:`S3Base`: ``publish``, ``read_into``, multipart debris;
:class:`WholeObjectStore`: writers for libraries that upload whole objects).

Configuration the AWS way (:func:`resolve_aws`): credentials, region and endpoint come from the
standard chain that botocore implements — explicit options first, then ``AWS_ACCESS_KEY_ID`` /
``AWS_SECRET_ACCESS_KEY`` / ``AWS_SESSION_TOKEN``, ``AWS_PROFILE``, ``~/.aws/credentials`` and
``~/.aws/config``, then instance metadata; ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL`` or an
``endpoint_url`` in the profile. The resolved values are handed explicitly to every client
library (boto3, s3fs, pyarrow, obstore), so the same environment reaches all four backends.

Option spellings (:data:`OPTION_SPELLINGS`, applied by :func:`canonical_options` to every S3
backend's options, keyword or URL query): the names users already have from fsspec/s3fs and
boto3 mean the same as ckptio's own:

=========================================================  =========================  ============================
fsspec / s3fs                                              boto3                      ckptio
=========================================================  =========================  ============================
``key``                                                    ``aws_access_key_id``      ``access_key_id``
``secret``                                                 ``aws_secret_access_key``  ``secret_access_key``
``token``                                                  ``aws_session_token``      ``session_token``
``anon``                                                   (``UNSIGNED`` config)      ``anonymous``
``client_kwargs={"region_name": ...}``                     ``region_name``            ``region``
``endpoint_url``, ``client_kwargs={"endpoint_url": ...}``  ``endpoint_url``           ``endpoint_url``
``profile``                                                ``profile_name``           ``profile``
``storage_options={...}``                                  (keyword arguments)        keyword arguments, URL query
=========================================================  =========================  ============================

``storage_options`` and ``client_kwargs`` are dicts whose entries are options (nested as
fsspec nests them); one option given under two spellings with different values is an error.

Errors (:func:`translate_error`): every backend funnels its vendor exceptions through one
table, :data:`S3_ERROR_CODES`, keyed by the S3 error code normalised to upper case without
``_`` (so botocore's ``NoSuchKey`` and Arrow's ``NO_SUCH_KEY`` meet), then by HTTP status,
then by the kind of network failure. Transient failures become
:class:`~ckptio.errors.TransientStorageError` / :class:`~ckptio.errors.ThrottledError`, which
:meth:`Store.retrying` retries and traces; the client libraries' own retries are switched off
so that every attempt is ours and is counted.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import logging
import os
import re
import socket
import threading
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar, Literal, Protocol

from crc32c import crc32c

from ckptio import errors
from ckptio.arrays import prefault
from ckptio.redact import redact, redact_url, register_secret
from ckptio.store import (
    DEFAULT_RETRY_POLICY,
    Buffer,
    Capabilities,
    Store,
    Writer,
    as_byte_view,
    option_int,
    parse_size,
)
from ckptio.trace import Trace
from ckptio.units import MAX_LOCAL_PROCESSES, parse_duration

log = logging.getLogger("ckptio.backends.s3")

# -- S3 limits (AWS S3 user guide, "Amazon S3 multipart upload limits") ---------------------
MIN_PART_SIZE = 5 * 2**20
"""Bytes; S3 refuses parts below 5 MiB except the last one of an upload."""
MAX_PART_SIZE = 5 * 2**30
"""Bytes; S3 refuses parts above 5 GiB."""
MAX_PARTS = 10_000
"""S3 limit on the number of parts of one multipart upload."""
MAX_SINGLE_PUT = 5 * 2**30
"""Bytes; S3 refuses a single PUT above 5 GiB."""
DEFAULT_PART_SIZE = 8 * 2**20
"""Bytes; 8 MiB, the low end of the 8-16 MiB part size AWS recommends: large enough that
per-request latency is amortised, small enough that a 2-core client keeps several in flight."""
DEFAULT_STREAMS = 8
"""Requests in flight per store (parts of one object and of different objects together)."""
CONNECT_TIMEOUT = 3.0
"""Seconds to open a TCP connection; short so that an endpoint nobody listens on, or a wrong
address, fails in seconds instead of hanging."""
READ_TIMEOUT = 60.0
"""Seconds without a byte from the server before a request counts as timed out (transient)."""


# -- configuration ---------------------------------------------------------------------------
@dataclass(frozen=True)
class AwsSettings:
    """Resolved AWS configuration handed to a client library. ``repr`` never shows secrets."""

    region: str
    """Region name; ``us-east-1`` when nothing says otherwise."""
    endpoint_url: str | None
    """``scheme://host[:port]`` or None for the AWS default endpoint."""
    access_key_id: str | None = field(default=None, repr=False)
    secret_access_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)
    anonymous: bool = False
    """Send unsigned requests (public buckets)."""
    addressing_style: str = "path"
    """``path`` (works with MinIO, Ceph RGW, moto) or ``virtual``."""
    connect_timeout: float = CONNECT_TIMEOUT
    """Seconds to open a connection."""
    read_timeout: float = READ_TIMEOUT
    """Seconds without a byte from the server before a request times out (then retried)."""
    session: Any = field(default=None, repr=False, compare=False)
    """The botocore session that resolved these settings; :func:`make_boto3_client` creates
    its clients from it, so botocore's handlers and data files are set up once per store."""
    credential_source: str = ""
    """Where the credentials came from, in words (``the options``, ``the environment
    (AWS_ACCESS_KEY_ID)``, ``profile 'x' in ~/.aws/credentials``...): what a refusal names."""

    @property
    def allow_http(self) -> bool:
        return bool(self.endpoint_url and self.endpoint_url.startswith("http://"))

    @property
    def has_credentials(self) -> bool:
        return bool(self.access_key_id and self.secret_access_key)

    def signing(
        self, *, anonymous: tuple[str, Any], key: str, secret: str, token: str
    ) -> dict[str, Any]:
        """How a client library should sign requests, as its own option names: the one
        option ``anonymous`` (name, value) for unsigned requests; else the resolved access
        key, secret key and (when there is one) session token under the names ``key``,
        ``secret``, ``token``; empty when nothing was resolved (the library looks itself)."""
        if self.anonymous:
            return dict([anonymous])
        if not self.has_credentials:
            return {}
        out = {key: self.access_key_id, secret: self.secret_access_key}
        if self.session_token:
            out[token] = self.session_token
        return out


#: Options every S3 backend accepts for its connection (beyond its own I/O options).
AWS_OPTIONS = (
    "endpoint_url",
    "region",
    "profile",
    "access_key_id",
    "secret_access_key",
    "session_token",
    "anonymous",
    "addressing_style",
    "connect_timeout",
    "read_timeout",
)


OPTION_SPELLINGS: Mapping[str, str] = MappingProxyType(
    {
        # fsspec / s3fs (S3FileSystem's keyword arguments)
        "key": "access_key_id",
        "secret": "secret_access_key",
        "token": "session_token",
        "anon": "anonymous",
        # boto3 (boto3.client / boto3.Session keyword arguments)
        "aws_access_key_id": "access_key_id",
        "aws_secret_access_key": "secret_access_key",
        "aws_session_token": "session_token",
        "region_name": "region",
        "profile_name": "profile",
    }
)
"""Other libraries' name of an option -> ckptio's name. The one table (see the module
docstring); ``endpoint_url`` and ``profile`` are spelled alike everywhere."""

NESTED_OPTIONS = ("storage_options", "client_kwargs")
"""Options that hold a dict of options: fsspec's ``storage_options`` (what pandas, Lightning,
xarray pass on to a filesystem) and s3fs's ``client_kwargs`` (what it passes to the boto
client: ``endpoint_url``, ``region_name``, ...)."""


def canonical_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` under ckptio's names: :data:`OPTION_SPELLINGS` renamed, the dicts of
    :data:`NESTED_OPTIONS` flattened into the rest. Other names pass unchanged (the store
    refuses those it does not take). One option under two spellings with different values is
    an :class:`~ckptio.errors.InvalidArgumentError` (the values are not shown)."""
    out: dict[str, Any] = {}
    spelt: dict[str, str] = {}

    def take(items: Mapping[str, Any], within: str) -> None:
        for name, value in items.items():
            where = f"{within}[{name!r}]" if within else name
            if name in NESTED_OPTIONS:
                if not isinstance(value, Mapping):
                    raise errors.InvalidArgumentError(
                        f"{where}: expected a dict of options (as fsspec/s3fs take it), got "
                        f"{type(value).__name__}"
                    )
                take(value, where)
                continue
            canon = OPTION_SPELLINGS.get(name, name)
            if canon in out and out[canon] != value:
                raise errors.InvalidArgumentError(
                    f"{where} and {spelt[canon]} both set {canon!r}, to different values; give it once"
                )
            out[canon], spelt[canon] = value, where

    take(options, "")
    return out


def _aws_files(session: Any) -> tuple[str, str, str]:
    """``(profile, credentials file, config file)`` as this botocore session reads them."""
    profile = session.profile or os.environ.get("AWS_PROFILE") or "default"
    creds = os.path.expanduser(
        session.get_config_variable("credentials_file") or "~/.aws/credentials"
    )
    config = os.path.expanduser(session.get_config_variable("config_file") or "~/.aws/config")
    return profile, creds, config


def _credential_source(method: str, session: Any) -> str:
    """botocore's name of a credential provider (``Credentials.method``) in words."""
    profile, creds, config = _aws_files(session)
    return {
        "env": "the environment (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY)",
        "shared-credentials-file": f"profile {profile!r} in {creds}",
        "config-file": f"profile {profile!r} in {config}",
        "iam-role": "the instance metadata (IAM role)",
        "container-role": "the container credentials endpoint",
        "assume-role": f"profile {profile!r} (assume role)",
        "assume-role-with-web-identity": "web identity (AWS_WEB_IDENTITY_TOKEN_FILE)",
        "sso": f"profile {profile!r} (SSO)",
        "custom-process": f"profile {profile!r} (credential_process)",
    }.get(method, f"botocore's {method!r} provider")


def no_credentials_message(where: str, session: Any, given: Mapping[str, Any]) -> str:
    """What a store with no credentials says: every place ckptio looked (in the order it
    looked) and how to set them."""
    profile, creds, config = _aws_files(session)
    half = [n for n in ("access_key_id", "secret_access_key") if given.get(n)]
    env = [n for n in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY") if os.environ.get(n)]
    files = ", ".join(
        f"{p} ({'exists' if os.path.isfile(p) else 'not found'})" for p in (creds, config)
    )
    imds = (
        "disabled by AWS_EC2_METADATA_DISABLED"
        if str(os.environ.get("AWS_EC2_METADATA_DISABLED", "")).lower() == "true"
        else "nothing"
    )
    return (
        f"{where}: no AWS credentials found. ckptio looked, in this order, at: "
        "1) the options access_key_id and secret_access_key (also spelled key/secret, "
        "aws_access_key_id/aws_secret_access_key, or s3://KEY:SECRET@bucket): "
        + (f"only {half[0]} given" if half else "not given")
        + "; 2) the environment variables AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY: "
        + (f"only {env[0]} set" if env else "not set")
        + f"; 3) profile {profile!r} (AWS_PROFILE or the profile option) in the credentials "
        f"and config files (AWS_SHARED_CREDENTIALS_FILE, AWS_CONFIG_FILE): {files}: no keys "
        f"there; 4) SSO, web identity, container and instance metadata: {imds}. "
        "Set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or write a profile (`aws configure "
        "[--profile NAME]`) and pass profile=NAME (or set AWS_PROFILE), or pass the options "
        "access_key_id= and secret_access_key=; for a public bucket pass anonymous=true "
        "(anon=True)."
    )


def resolve_aws(options: dict[str, Any], *, where: str = "s3") -> AwsSettings:
    """Pop the :data:`AWS_OPTIONS` from ``options`` and resolve the rest the AWS way. No
    credentials anywhere (and not ``anonymous``) is a
    :class:`~ckptio.errors.StoragePermissionError` naming where ckptio looked
    (:func:`no_credentials_message`), before any request; ``where`` names the store."""
    errors.require("botocore.session", extra="s3", purpose="S3 access (s3://)")
    import botocore.session

    opts = {k: options.pop(k) for k in AWS_OPTIONS if k in options}
    from ckptio.store import option_bool

    anonymous = option_bool(opts.get("anonymous", False), field="anonymous")
    session = botocore.session.Session(profile=opts.get("profile") or None)
    if session.profile is not None and session.profile not in session.available_profiles:
        files = [
            os.path.expanduser(session.get_config_variable(n, methods=("env",)) or d)
            for n, d in (
                ("credentials_file", "~/.aws/credentials"),
                ("config_file", "~/.aws/config"),
            )
        ]
        raise errors.InvalidArgumentError(
            f"{where}: profile {session.profile!r} (from the profile option or AWS_PROFILE) is "
            f"not in {' or '.join(files)}; profiles there: "
            f"{', '.join(sorted(session.available_profiles)) or 'none'}"
        )
    session.register_component(
        "data_loader", _data_loader(session.get_config_variable("data_path"))
    )
    region = (
        opts.get("region")
        or os.environ.get("AWS_REGION")
        or session.get_config_variable("region")
        or "us-east-1"
    )
    endpoint = opts.get("endpoint_url") or _configured_endpoint(session)
    if endpoint is not None:
        endpoint = str(endpoint).rstrip("/")
        if not re.match(r"^https?://[^/\s]+$", endpoint):
            raise errors.InvalidArgumentError(
                f"endpoint_url: expected http(s)://host[:port], got {redact_url(endpoint)!r}"
            )
    key, secret, token = (
        opts.get("access_key_id"),
        opts.get("secret_access_key"),
        opts.get("session_token"),
    )
    source = "the options" if key and secret else ""
    if not anonymous and not (key and secret):
        creds = session.get_credentials()
        if creds is not None:
            frozen = creds.get_frozen_credentials()
            key, secret, token = frozen.access_key, frozen.secret_key, frozen.token
            source = _credential_source(getattr(creds, "method", "") or "", session)
    for s in (key, secret, token):
        register_secret(s)
    style = str(opts.get("addressing_style", "path"))
    if style not in ("path", "virtual"):
        raise errors.InvalidArgumentError(
            f"addressing_style: expected 'path' or 'virtual', got {style!r}"
        )
    timeouts = {}
    for name in ("connect_timeout", "read_timeout"):
        if name in opts:
            timeouts[name] = parse_duration(opts[name], field=name, positive=True)
    if not anonymous and not (key and secret):  # after the options' own checks
        raise errors.StoragePermissionError(no_credentials_message(where, session, opts))
    return AwsSettings(
        **timeouts,
        region=str(region),
        endpoint_url=endpoint,
        access_key_id=key,
        secret_access_key=secret,
        session_token=token,
        anonymous=anonymous,
        addressing_style=style,
        session=session,
        credential_source=source,
    )


@functools.cache
def _data_loader(data_path: str | None) -> Any:
    """One botocore data loader per ``AWS_DATA_PATH`` for the whole process.

    Each botocore session otherwise makes its own, and reads and parses S3's service model,
    endpoint rules and ``endpoints.json`` again: ~0.1 s of CPU for every store opened (each
    ``ckptio.load("s3://...")`` opens one). The loader holds only those read-only data files
    (no credentials or settings); botocore's clients of one session already share it across
    threads."""
    from botocore.loaders import create_loader

    return create_loader(data_path)


def _configured_endpoint(session: Any) -> str | None:
    """The S3 endpoint from ``AWS_ENDPOINT_URL_S3``, ``AWS_ENDPOINT_URL`` or the profile,
    through botocore's own resolver (the order the AWS SDKs use)."""
    if str(os.environ.get("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "")).lower() == "true":
        return None
    try:
        from botocore.configprovider import ConfiguredEndpointProvider

        return ConfiguredEndpointProvider(
            full_config=session.full_config,
            scoped_config=session.get_scoped_config(),
            client_name="s3",
        ).provide()
    except (ImportError, TypeError, AttributeError):  # private botocore API moved: env only
        return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")


def io_options(options: dict[str, Any]) -> tuple[int, int]:
    """Pop ``part_size`` (bytes or "8MiB") and ``streams`` and check them against S3 limits."""
    part_size = parse_size(options.pop("part_size", DEFAULT_PART_SIZE), field="part_size")
    if not MIN_PART_SIZE <= part_size <= MAX_PART_SIZE:
        raise errors.InvalidArgumentError(
            f"part_size: {part_size} bytes is outside S3's limits "
            f"({MIN_PART_SIZE} bytes = 5 MiB .. {MAX_PART_SIZE} bytes = 5 GiB)"
        )
    streams = option_int(
        options.pop("streams", DEFAULT_STREAMS),
        field="streams",
        minimum=1,
        maximum=MAX_LOCAL_PROCESSES,
    )
    return part_size, streams


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


def reject_unknown(
    name: str, options: Mapping[str, Any], valid: Iterable[str], *, spellings: bool = True
) -> None:
    """Refuse the ``options`` left over, suggesting the closest of ``valid`` (and, with
    ``spellings``, of the other spellings :data:`OPTION_SPELLINGS` accepts)."""
    if options:
        groups = [(f"{name}://", valid)]
        if spellings:
            groups.append(
                (f"{name}:// (fsspec/boto3 spellings)", [*OPTION_SPELLINGS, *NESTED_OPTIONS])
            )
        raise errors.UnknownOptionError(f"{name}://", options, groups)


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


# -- error translation -----------------------------------------------------------------------
S3_ERROR_CODES: Mapping[str, type[errors.CkptioError]] = MappingProxyType(
    {
        # missing things
        "NOSUCHKEY": errors.NotFoundError,
        "NOTFOUND": errors.NotFoundError,
        "NOSUCHBUCKET": errors.NotFoundError,
        "NOSUCHUPLOAD": errors.NotFoundError,
        "RESOURCENOTFOUND": errors.NotFoundError,
        # create-if-absent lost
        "PRECONDITIONFAILED": errors.AlreadyExistsError,
        "CONDITIONALREQUESTCONFLICT": errors.AlreadyExistsError,
        # credentials and permissions: never retried
        "ACCESSDENIED": errors.StoragePermissionError,
        "INVALIDACCESSKEYID": errors.StoragePermissionError,
        "SIGNATUREDOESNOTMATCH": errors.StoragePermissionError,
        "EXPIREDTOKEN": errors.StoragePermissionError,
        "INVALIDTOKEN": errors.StoragePermissionError,
        "ACCOUNTPROBLEM": errors.StoragePermissionError,
        "ALLACCESSDISABLED": errors.StoragePermissionError,
        "MISSINGSECURITYHEADER": errors.StoragePermissionError,
        "UNRECOGNIZEDCLIENT": errors.StoragePermissionError,
        "UNRECOGNIZEDCLIENTEXCEPTION": errors.StoragePermissionError,
        "INVALIDCLIENTTOKENID": errors.StoragePermissionError,
        # throttling: retried, counted as throttled
        "SLOWDOWN": errors.ThrottledError,
        "THROTTLING": errors.ThrottledError,
        "THROTTLINGEXCEPTION": errors.ThrottledError,
        "REQUESTLIMITEXCEEDED": errors.ThrottledError,
        "TOOMANYREQUESTS": errors.ThrottledError,
        "TOOMANYREQUESTSEXCEPTION": errors.ThrottledError,
        "REQUESTTHROTTLED": errors.ThrottledError,
        # server trouble: retried
        "INTERNALERROR": errors.TransientStorageError,
        "INTERNALFAILURE": errors.TransientStorageError,
        "SERVICEUNAVAILABLE": errors.TransientStorageError,
        "REQUESTTIMEOUT": errors.TransientStorageError,
        "REQUESTTIMEOUTEXCEPTION": errors.TransientStorageError,
        "BADDIGEST": errors.TransientStorageError,  # body damaged in flight: resend
        "XAMZCONTENTSHA256MISMATCH": errors.TransientStorageError,
        "NETWORKCONNECTION": errors.TransientStorageError,  # Arrow's name for a reset
        # full
        "QUOTAEXCEEDED": errors.NoSpaceError,
    }
)
"""S3 error code (upper case, ``_`` removed) -> ckptio error class. The one table."""

HTTP_STATUS: Mapping[int, type[errors.CkptioError]] = MappingProxyType(
    {
        404: errors.NotFoundError,
        403: errors.StoragePermissionError,
        401: errors.StoragePermissionError,
        412: errors.AlreadyExistsError,
        429: errors.ThrottledError,
        503: errors.ThrottledError,  # S3 sends 503 only as SlowDown / ServiceUnavailable
        500: errors.TransientStorageError,
        502: errors.TransientStorageError,
        504: errors.TransientStorageError,
        408: errors.TransientStorageError,
    }
)
"""HTTP status -> ckptio error class, when the response carried no known code."""

_RESET_WORDS = (
    "connection reset",
    "connection aborted",
    "connection was closed",
    "connection closed",
    "remote end closed",
    "remotedisconnected",
    "server disconnected",
    "broken pipe",
    "incomplete read",
    "incompleteread",
    "timed out",
    "timeout",
    "connection error",
    "error sending request",
    "unexpected eof",
    "response payload is not completed",
    "network_connection",
    "curl error",
)
_REFUSED_WORDS = (
    "connection refused",
    "couldn't connect",
    "could not connect",
    "name or service not known",
    "failed to resolve",
    "nodename nor servname",
    "name resolution",
    "connect error",
)


def _chain(err: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    cur: BaseException | None = err
    while cur is not None and len(out) < 10:
        out.append(cur)
        cur = cur.__cause__ or cur.__context__
    return out


def _norm(code: str) -> str:
    return code.replace("_", "").replace("-", "").upper()


def error_details(err: BaseException) -> tuple[str | None, int | None]:
    """``(S3 error code, HTTP status)`` from any client library's exception (or None)."""
    code: str | None = None
    status: int | None = None
    for e in _chain(err):
        response = getattr(e, "response", None)
        if isinstance(response, dict):  # botocore ClientError (boto3, s3fs's cause)
            code = code or response.get("Error", {}).get("Code")
            status = status or response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        text = str(e)
        if code is None:
            m = (
                re.search(r"<Code>([A-Za-z]+)</Code>", text)
                or re.search(r"AWS Error ([A-Z_]+)", text)
                or re.search(r"\(([A-Za-z]+)\) when calling", text)
            )
            if m and m.group(1) != "UNKNOWN":
                code = m.group(1)
        if status is None:
            m = re.search(r"(?:HTTP status|status(?: code)?:?)\s*(\d{3})", text, re.I)
            if m:
                status = int(m.group(1))
    if code and code.isdigit():
        status, code = status or int(code), None
    return code, status


def permission_hint(aws: AwsSettings | None) -> str:
    """What a refused request says next to the cause: an unsigned (anonymous) request names
    the bucket's access, not credentials; a signed one names where its credentials came from."""
    if aws is not None and aws.anonymous:
        return (
            " (the request was anonymous (anonymous=true / anon=True, unsigned) and was "
            "refused: the bucket or object is not public; give credentials instead of "
            "anonymous access)"
        )
    source = f" (from {aws.credential_source})" if aws is not None and aws.credential_source else ""
    return (
        f" (check the credentials{source} and their permissions: AWS_ACCESS_KEY_ID / "
        "AWS_SECRET_ACCESS_KEY / AWS_PROFILE)"
    )


def translate_error(
    err: BaseException, *, action: str, key: str, where: str, aws: AwsSettings | None = None
) -> errors.CkptioError:
    """The ckptio error for a client library's exception ``err`` (call as
    ``raise translate_error(...) from err``). The message names the action, the key and the
    cause, and holds no credential (:func:`ckptio.redact.redact`); ``aws``, the store's
    settings, tells a refused anonymous request from a refused signed one
    (:func:`permission_hint`)."""
    if isinstance(err, errors.CkptioError):
        return err
    code, status = error_details(err)
    cls: type[errors.CkptioError] | None = None
    chain = _chain(err)
    text = " | ".join(f"{type(e).__name__}: {e}" for e in chain[:3]).lower()
    if status is None and (
        any(isinstance(e, ConnectionRefusedError | socket.gaierror) for e in chain)
        or any(w in text for w in _REFUSED_WORDS)
    ):
        cls = errors.StorageError  # nobody listens there: permanent, not retried
        code = "endpoint unreachable"
    elif code:
        cls = S3_ERROR_CODES.get(_norm(code))
    if cls is None and status is not None:
        cls = HTTP_STATUS.get(status)
    if cls is None:
        if any(isinstance(e, FileNotFoundError) for e in chain):
            cls = errors.NotFoundError
        elif any(isinstance(e, PermissionError) for e in chain):
            cls = errors.StoragePermissionError
        elif any(isinstance(e, FileExistsError) for e in chain):
            cls = errors.AlreadyExistsError
        elif (
            any(isinstance(e, ConnectionError | TimeoutError | socket.timeout) for e in chain)
            or any(w in text for w in _RESET_WORDS)
            or (status is not None and status >= 500)
        ):
            cls = errors.TransientStorageError
        else:
            cls = errors.StorageError
    cause = f"{type(err).__name__}: {err}"
    if code or status:
        cause = f"{code or ''}{' ' if code and status else ''}{f'(HTTP {status})' if status else ''}: {cause}"
    hint = ""
    if cls is errors.StoragePermissionError:
        hint = permission_hint(aws)
    elif code and _norm(code) == "NOSUCHBUCKET":
        hint = " (the bucket does not exist: create it or fix the URL)"
    elif code == "endpoint unreachable":
        hint = " (is the endpoint URL right? AWS_ENDPOINT_URL / endpoint_url)"
    msg = redact(f"{where}: cannot {action} {key!r}: {cause}")[:2000] + hint
    if issubclass(cls, OSError):
        return cls(msg)
    return cls(msg)


def guard(
    action: str, key: str, where: str, fn: Callable[[], Any], aws: AwsSettings | None = None
) -> Any:
    """Run ``fn`` and translate whatever the client library raises."""
    try:
        return fn()
    except errors.CkptioError:
        raise
    except Exception as err:
        raise translate_error(err, action=action, key=key, where=where, aws=aws) from err


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
    at a time and sends whatever it gets, so larger blocks cut Python calls ~100-fold."""

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


def botocore_config(aws: AwsSettings, *, pool_connections: int) -> dict[str, Any]:
    """The ``botocore.config.Config`` options every botocore client of ckptio gets (boto3's,
    and s3fs's through ``config_kwargs``): botocore's retries off, ``aws``'s timeouts and
    addressing style, at most ``pool_connections`` connections, no extra checksums."""
    return {
        "connect_timeout": aws.connect_timeout,
        "read_timeout": aws.read_timeout,
        "retries": {"total_max_attempts": 1, "mode": "standard"},  # ours count every attempt
        "max_pool_connections": pool_connections,
        # payload integrity comes from the CRC32C we send; no SHA-256 of every byte over http
        "s3": {"addressing_style": aws.addressing_style, "payload_signing_enabled": False},
        "request_checksum_calculation": "when_required",  # we send CRC32C ourselves
        "response_checksum_validation": "when_required",  # ckptio checks CRC32C per chunk
    }


def make_boto3_client(aws: AwsSettings, *, pool_connections: int = 10, sigv4: bool = False) -> Any:
    """A botocore S3 client for ``aws`` with its own retries off and short timeouts; with
    ``sigv4`` it signs (and presigns: botocore's default for presigned S3 URLs is the
    deprecated SigV2) with Signature Version 4."""
    import botocore.session
    from botocore import UNSIGNED
    from botocore.config import Config

    config = Config(
        region_name=aws.region,
        signature_version=UNSIGNED if aws.anonymous else ("s3v4" if sigv4 else None),
        **botocore_config(aws, pool_connections=pool_connections),
    )
    session = aws.session or botocore.session.Session()
    return session.create_client(
        "s3",
        region_name=aws.region,
        endpoint_url=aws.endpoint_url,
        aws_access_key_id=aws.access_key_id,
        aws_secret_access_key=aws.secret_access_key,
        aws_session_token=aws.session_token,
        config=config,
    )


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


def copy_into(out: memoryview, data: Any) -> int:
    """Copy ``data`` (bytes or any buffer a client library returns) to the front of ``out``;
    returns its length in bytes."""
    view = memoryview(data)
    n = view.nbytes
    out[:n] = view
    return n


class S3Base(Store):
    """What the S3 backends share: bucket/prefix/key mapping, the I/O and AWS options,
    requests wrapped in translation + retries + trace, the shape of ``publish`` and
    ``read_into``, and the janitor for multipart debris (listing and aborting uploads goes
    through botocore for every backend, since pyarrow and obstore do not expose those S3
    calls)."""

    OPTIONS: tuple[str, ...] = ("part_size", "streams", *AWS_OPTIONS)
    client_packages: ClassVar[tuple[str, ...]] = ("botocore",)  # the janitor's client

    @property
    def request_size(self) -> int:
        return self.part_size

    def _setup(self, options: dict[str, Any]) -> None:
        """Take the bucket and prefix from the URL (:attr:`location`) and pop the I/O and AWS
        options (in any spelling of :data:`OPTION_SPELLINGS`); any option left over is an
        error naming the valid ones (:attr:`OPTIONS`)."""
        canon = canonical_options(options)
        options.clear()
        options.update(canon)
        self.bucket, self.prefix = self.location.bucket, self.location.prefix
        reject_unknown(
            self.name, {k: v for k, v in options.items() if k not in self.OPTIONS}, self.OPTIONS
        )
        self.part_size, self.streams = io_options(options)
        self.aws = resolve_aws(options, where=f"{self.name}://{self.bucket}")
        reject_unknown(self.name, options, self.OPTIONS)
        self._janitor_client: Any = None
        self._janitor_lock = threading.Lock()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.url!r}, endpoint={redact_url(self.aws.endpoint_url)!r})"
        )

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
    def read_into(self, key: str, offset: int, buffer: Buffer) -> int:
        """Read up to ``len(buffer)`` bytes of ``key`` from byte ``offset`` straight into
        ``buffer``, in one ranged request (retried and traced); returns the bytes read, 0 at or
        past the end of the object."""
        full = self._full(key)
        out = memoryview(buffer).cast("B")
        if offset < 0:
            raise errors.InvalidArgumentError(f"negative offset {offset} for {key!r}")
        if out.nbytes == 0:
            return 0
        prefault(out)  # the body is copied in: map its pages in one call, not one fault each
        return self._call(
            "get", key, out.nbytes, "read", lambda: self._read_range(key, full, offset, out)
        )

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
            if now - u["Initiated"].timestamp() < older_than:
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
                    with contextlib.suppress(errors.NotFoundError):  # gone already
                        guard(
                            "abort the multipart upload of",
                            key,
                            self.where,
                            lambda u=u: client.abort_multipart_upload(
                                Bucket=self.bucket, Key=full, UploadId=u["UploadId"]
                            ),
                        )

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
