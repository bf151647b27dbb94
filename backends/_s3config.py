"""S3 client configuration: the S3 limits the options are checked against, the AWS
resolution of credentials, region and endpoint (:func:`resolve_aws`), the one table of option
spellings (:func:`canonical_options`), and the botocore client every S3 backend uses for the
requests its own library lacks (:func:`make_boto3_client`).

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

s3fs's ``config_kwargs`` (botocore ``Config`` settings, :func:`from_botocore_config`) maps
what has a ckptio meaning — ``connect_timeout``, ``read_timeout``, ``region_name``,
``s3={"addressing_style": ...}``, ``signature_version=botocore.UNSIGNED`` (``anonymous``) —
and refuses the rest, saying what ckptio does instead (retries, connection pool). s3fs's and
boto3's ``use_ssl`` is checked against the endpoint, where ckptio takes http or https from:
``use_ssl=False`` needs an ``http://`` endpoint.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, TypedDict

from ckptio import errors
from ckptio.redact import redact_url, register_secret
from ckptio.store import option_int
from ckptio.units import MAX_LOCAL_PROCESSES, parse_duration, parse_size

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
per-request latency is amortised, small enough that a client with few cores keeps several
parts in flight (``benchmarks/s3_peers.py --part-size`` compares sizes)."""
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

NESTED_OPTIONS = ("storage_options", "client_kwargs", "config_kwargs")
"""Options that hold a dict of options: fsspec's ``storage_options`` (what pandas, Lightning,
xarray pass on to a filesystem), s3fs's ``client_kwargs`` (what it passes to the boto
client: ``endpoint_url``, ``region_name``, ``use_ssl``, ...) and its ``config_kwargs`` (botocore
``Config`` settings, read by :func:`from_botocore_config`)."""

BOTOCORE_CONFIG: Mapping[str, str] = MappingProxyType(
    {"connect_timeout": "connect_timeout", "read_timeout": "read_timeout", "region_name": "region"}
)
"""botocore ``Config`` settings (s3fs's ``config_kwargs``) that are ckptio options, by name."""

BOTOCORE_REFUSED: Mapping[str, str] = MappingProxyType(
    {
        "retries": "ckptio retries every request itself (jittered exponential backoff, each "
        "attempt traced) and turns botocore's retries off",
        "max_pool_connections": "ckptio sizes the connection pool from streams= (requests in "
        "flight): give streams= instead",
        "proxies": "ckptio's clients take proxies from the environment (HTTPS_PROXY, "
        "HTTP_PROXY, NO_PROXY)",
        "request_checksum_calculation": "ckptio sends and checks a CRC32C of every chunk itself",
        "response_checksum_validation": "ckptio sends and checks a CRC32C of every chunk itself",
    }
)
"""botocore ``Config`` settings refused with what ckptio does instead (any other one is
refused with the list of those it maps)."""


class S3Options(TypedDict, total=False):
    """The options of every S3 store (``s3://``, ``s3+boto3://``, ``s3+fsspec://``,
    ``s3+arrow://``, ``s3+obstore://``), each documented once, here: keyword arguments of the
    store's constructor (``**options: Unpack[S3Options]``) or ``name=value`` pairs of its URL's
    query (``s3://bucket/run?part_size=16MiB``), and of ``ckptio.save``/``load``/
    ``Checkpointer``, which pass them on. An option left None is not given: it takes the
    default named here, or the value another spelling or ``storage_options`` sets. A name
    outside these is refused when the store opens (:class:`~ckptio.errors.UnknownOptionError`,
    naming the closest valid one).

    Where an option is not given, credentials, region and endpoint are resolved the AWS way
    (:func:`resolve_aws`): the environment variable named with each, then the profile in
    ``~/.aws/credentials`` and ``~/.aws/config`` (``AWS_SHARED_CREDENTIALS_FILE``,
    ``AWS_CONFIG_FILE``), then instance metadata. ``s3+boto3://`` takes two more
    (:class:`~ckptio.backends.s3.Boto3Options`); ``fsspec+<protocol>://`` takes
    ``part_size``, ``streams`` and ``storage_options`` only, for a protocol other than S3."""

    part_size: int | str | None
    """Bytes per part of a multipart upload (``8388608``, ``"16MiB"``), 5 MiB .. 5 GiB (S3's
    limits). Default 8 MiB. **Environment variable**: none."""
    streams: int | str | None
    """Requests in flight per store: parts of one object and of different objects together.
    Default 8. **Environment variable**: none."""
    endpoint_url: str | None
    """``http(s)://host[:port]`` of the S3 service (MinIO, Ceph RGW, a moto server); http or
    https is taken from it. Default: AWS's endpoint for the region. **Environment
    variables**: ``AWS_ENDPOINT_URL_S3``, then ``AWS_ENDPOINT_URL`` (or ``endpoint_url`` in the
    profile; none of them when ``AWS_IGNORE_CONFIGURED_ENDPOINT_URLS=true``)."""
    region: str | None
    """The bucket's region. Default ``us-east-1``. **Environment variables**: ``AWS_REGION``,
    then ``AWS_DEFAULT_REGION`` (or ``region`` in the profile)."""
    profile: str | None
    """A profile of ``~/.aws/credentials`` / ``~/.aws/config`` to take credentials, region and
    endpoint from. Default: ``default``. **Environment variable**: ``AWS_PROFILE``."""
    access_key_id: str | None
    """The access key (also ``s3://KEY:SECRET@bucket``). **Environment variable**:
    ``AWS_ACCESS_KEY_ID``."""
    secret_access_key: str | None
    """The secret key; never shown in messages, logs or result files. **Environment
    variable**: ``AWS_SECRET_ACCESS_KEY``."""
    session_token: str | None
    """The session token of temporary credentials. **Environment variable**:
    ``AWS_SESSION_TOKEN``."""
    anonymous: bool | str | None
    """Send unsigned requests (public buckets); no credentials are looked for. Default False.
    **Environment variable**: none."""
    addressing_style: str | None
    """``"path"`` (``endpoint/bucket/key``: MinIO, Ceph RGW, moto) or ``"virtual"``
    (``bucket.endpoint/key``). Default ``"path"``. **Environment variable**: none."""
    connect_timeout: float | str | None
    """Seconds to open a connection (``3``, ``"3s"``). Default 3 s. **Environment variable**:
    none."""
    read_timeout: float | str | None
    """Seconds without a byte from the server before a request times out (then retried).
    Default 60 s. **Environment variable**: none."""
    use_ssl: bool | str | None
    """s3fs's and boto3's switch, checked against ``endpoint_url``, where ckptio takes http or
    https from: False needs an ``http://`` endpoint. **Environment variable**: none."""
    storage_options: Mapping[str, Any] | None
    """A dict of these options as fsspec passes them (what pandas, Lightning, xarray hand to
    a filesystem), under any spelling below, nested as fsspec nests them. For
    ``fsspec+<protocol>://`` other than S3: the options of ``fsspec.filesystem``.
    **Environment variable**: none."""
    # the other libraries' spellings (OPTION_SPELLINGS, NESTED_OPTIONS; the module docstring's
    # table): each means the option it maps to
    key: str | None
    """fsspec/s3fs: ``access_key_id``."""
    secret: str | None
    """fsspec/s3fs: ``secret_access_key``."""
    token: str | None
    """fsspec/s3fs: ``session_token``."""
    anon: bool | str | None
    """fsspec/s3fs: ``anonymous``."""
    aws_access_key_id: str | None
    """boto3: ``access_key_id``."""
    aws_secret_access_key: str | None
    """boto3: ``secret_access_key``."""
    aws_session_token: str | None
    """boto3: ``session_token``."""
    region_name: str | None
    """boto3: ``region``."""
    profile_name: str | None
    """boto3: ``profile``."""
    client_kwargs: Mapping[str, Any] | None
    """s3fs: a dict of options for its boto client (``endpoint_url``, ``region_name``,
    ``use_ssl``, ...)."""
    config_kwargs: Mapping[str, Any] | None
    """s3fs: botocore ``Config`` settings, those with a ckptio meaning
    (:func:`from_botocore_config`)."""


def own_options(options: type[Any]) -> tuple[str, ...]:
    """The keys of an options ``TypedDict`` (:class:`S3Options` or one that extends it) under
    ckptio's own names: without the other libraries' spellings and the nested dicts."""
    return tuple(
        k for k in options.__annotations__ if k not in OPTION_SPELLINGS and k not in NESTED_OPTIONS
    )


AWS_OPTIONS = tuple(k for k in own_options(S3Options) if k not in ("part_size", "streams"))
"""The :class:`S3Options` of the connection (beyond the I/O options)."""


def given(options: Mapping[str, Any]) -> dict[str, Any]:
    """The options an S3 store's constructor was given: those not None (None means not given:
    the documented default, or a value another spelling or ``storage_options`` sets).
    :func:`canonical_options` (in :meth:`S3Base._setup`) renames and flattens them."""
    return {k: v for k, v in options.items() if v is not None}


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
                take(
                    from_botocore_config(value, where) if name == "config_kwargs" else value, where
                )
                continue
            canon = OPTION_SPELLINGS.get(name, name)
            if canon in out and out[canon] != value:
                raise errors.InvalidArgumentError(
                    f"{where} and {spelt[canon]} both set {canon!r}, to different values; give it once"
                )
            out[canon], spelt[canon] = value, where

    take(options, "")
    return out


def from_botocore_config(config: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The ckptio options that botocore ``Config`` settings (s3fs's ``config_kwargs``, at
    ``where``) mean; a setting ckptio has no option for is an
    :class:`~ckptio.errors.InvalidArgumentError` saying what ckptio does instead."""
    out: dict[str, Any] = {}
    for name, value in config.items():
        at = f"{where}[{name!r}]"
        if name in BOTOCORE_CONFIG:
            out[BOTOCORE_CONFIG[name]] = value
        elif name == "s3" and isinstance(value, Mapping) and set(value) <= {"addressing_style"}:
            out.update(value)
        elif name == "signature_version" and _unsigned(value):
            out["anonymous"] = True
        elif name == "signature_version" and value in ("s3v4", "v4"):
            pass  # what ckptio's clients sign with
        elif name in BOTOCORE_REFUSED:
            raise errors.InvalidArgumentError(f"{at}: not taken: {BOTOCORE_REFUSED[name]}")
        else:
            raise errors.InvalidArgumentError(
                f"{at}: ckptio takes no such botocore setting; of config_kwargs it maps "
                f"{', '.join(BOTOCORE_CONFIG)}, s3={{'addressing_style': ...}} and botocore's "
                "UNSIGNED signature version (anonymous=True)"
            )
    return out


def _unsigned(value: Any) -> bool:
    """botocore's ``UNSIGNED`` (a sentinel object), without importing botocore for it."""
    return type(value).__name__ == "_UNSIGNED" or value is _botocore_unsigned()


def _botocore_unsigned() -> Any:
    try:
        from botocore import UNSIGNED
    except ImportError:
        return None
    return UNSIGNED


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
    if "use_ssl" in opts:  # s3fs/boto3: ckptio takes http or https from the endpoint
        use_ssl = option_bool(opts["use_ssl"], field="use_ssl")
        scheme = "https" if endpoint is None else endpoint.partition(":")[0]
        if use_ssl != (scheme == "https"):
            raise errors.InvalidArgumentError(
                f"{where}: use_ssl={use_ssl} but the endpoint is "
                + (redact_url(endpoint) if endpoint else "AWS's (https)")
                + ": ckptio takes http or https from the endpoint URL; "
                + (
                    "give endpoint_url='http://host:port' (or AWS_ENDPOINT_URL) for a plain-HTTP "
                    "service"
                    if not use_ssl
                    else "give an https:// endpoint_url, or drop use_ssl"
                )
            )
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
    """One botocore data loader per ``AWS_DATA_PATH`` for the whole process, parsing its
    files into plain dicts.

    Each botocore session otherwise makes its own, and reads and parses S3's service model,
    endpoint rules and ``endpoints.json`` again for every store opened (each
    ``ckptio.load("s3://...")`` opens one): a cost paid once per process instead of once per
    store. The loader holds only those read-only data files (no credentials or settings);
    botocore's clients of one session already share it across threads.

    Plain dicts (:class:`_PlainJSONFileLoader`, through the loader's ``file_loader``
    argument) instead of botocore's ``OrderedDict``: a dict keeps its order as well, and the
    ``OrderedDict`` hook makes the parse of ``endpoints.json`` (1.2 MB: every AWS service's
    endpoints, read for any client) and S3's model 2-2.5x slower. The first store of a
    process opens in ~55 ms instead of ~72 (``benchmarks/s3_peers.py`` records it as
    ``open_s``): a restart's first load waits for it."""
    from botocore.loaders import Loader

    paths = (
        [os.path.expanduser(os.path.expandvars(p)) for p in data_path.split(os.pathsep)]
        if data_path
        else None
    )
    return Loader(extra_search_paths=paths, file_loader=_plain_json_loader())


@functools.cache
def _plain_json_loader() -> Any:
    """botocore's ``JSONFileLoader`` parsing into plain dicts (see :func:`_data_loader`)."""
    import json

    from botocore.loaders import JSONFileLoader

    class _PlainJSONFileLoader(JSONFileLoader):  # type: ignore[misc]  # botocore is untyped
        def _load_file(self, full_path: str, open_method: Any) -> Any:
            # botocore's own, less its OrderedDict hook (and its debug log line); where a
            # later botocore renames this method, its own runs instead: slower, not wrong
            if not os.path.isfile(full_path):
                return None
            with open_method(full_path, "rb") as fp:
                return json.loads(fp.read())

    return _PlainJSONFileLoader()


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
