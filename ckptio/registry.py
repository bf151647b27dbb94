"""URL scheme -> backend class, through the entry-point group ``ckptio.backends``.

Entry points hold ``"module:Class"`` strings and are imported only when a URL needs them, so
a missing optional dependency (boto3, obstore, ...) costs nothing until it is used, and then
fails with the pip extra to install. Third-party backends register the same way::

    [project.entry-points."ckptio.backends"]
    myfs = "mypkg.store:MyStore"

URLs are parsed strictly, by one parser (:func:`parse_url`) for every backend:

- a plain path (absolute or relative, no scheme) and any ``os.PathLike`` mean ``file://``;
  relative paths are resolved against the current directory;
- otherwise ``scheme://...``, where the scheme is registered exactly (``s3+boto3``), or is
  ``emulate+<url>`` (any accepted URL, wrapped; ``shaped+<url>``, its earlier name, too) or
  ``fsspec+<protocol>`` (a protocol fsspec knows). Anything else (``s3:/bucket``,
  ``file:relative``, ``s3+boto://``) is refused with the accepted forms (:class:`~ckptio.errors.InvalidArgumentError`,
  :class:`~ckptio.errors.UnknownSchemeError`);
- ``file://``, ``pfs://`` and ``fsspec+file://`` name a local path: the host is empty or
  ``localhost`` (``file:///abs/path``), and the path is percent-decoded (RFC 8089, so
  ``Path.as_uri()`` works);
- ``s3://`` (and its ``+client`` variants, ``fsspec+s3://``): ``bucket/prefix``, the prefix
  taken as written; credentials as user info (``s3://KEY:SECRET@bucket``) become the
  ``access_key_id``/``secret_access_key`` options;
- the query string holds options (``name=value`` pairs joined by ``&``; of a name given
  twice, the last wins); a fragment is refused.
"""

from __future__ import annotations

import importlib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import cache
from importlib.metadata import entry_points
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import parse_qsl, unquote, urlsplit

from ckptio import errors
from ckptio.redact import is_secret_name, redact_url, register_secret
from ckptio.store import Store, StoreURL

if TYPE_CHECKING:
    from ckptio.backends.parallelfs import ParallelFSStore

__all__ = [
    "BUILTIN",
    "EMULATOR",
    "GROUP",
    "THIRD_PARTY_ATTRIBUTES",
    "URL_FORMS",
    "BackendInfo",
    "accepted_forms",
    "backend_for",
    "backend_info",
    "backends",
    "client_versions",
    "emulation_url",
    "from_fsspec_url",
    "load_backend",
    "location",
    "open_store",
    "parse_url",
    "split_url",
    "store_class",
    "wrap_url",
]

GROUP = "ckptio.backends"

URL_FORMS: Mapping[str, str] = MappingProxyType(
    {
        "path": "{}:///abs/path",
        "bucket": "{}://bucket/prefix",
        "host": "{}://name/prefix",
        "protocol": "{}+<protocol>://path",
        "wrapper": "{}+<url>",
    }
)
"""How a scheme's URLs read (:attr:`BackendInfo.form`), each with the example error messages
show: ``path`` (a local directory, percent-decoded), ``bucket`` (an S3 bucket and a key
prefix, credentials as user info), ``host`` (a name and a prefix, as written), ``protocol``
(``<scheme>+<protocol>://...``: the rest is a URL of another library's protocol), ``wrapper``
(``<scheme>+<url>``: another store's URL, wrapped)."""


@dataclass(frozen=True)
class BackendInfo:
    """One URL scheme and the backend that serves it: everything ckptio knows about it
    *before* a store opens (what an open store says about itself is
    :meth:`~ckptio.store.Store.describe`). ckptio's own schemes are the records of
    :data:`BUILTIN`; another distribution's are built from its entry point and the class
    attributes of the class it names (:func:`backend_info`)."""

    scheme: str
    """As written in URLs and registered as the entry point's name: ``s3+obstore``."""
    target: str
    """``module:Class``, the entry point's value."""
    distribution: str = "ckptio"
    """The pip distribution that registered it."""
    form: str = "host"
    """How its URLs read: a key of :data:`URL_FORMS`."""
    requires: tuple[str, ...] = ()
    """The client packages the backend imports when a store opens (not when its module
    loads), each named as both its pip distribution and its top-level module:
    :func:`load_backend` checks they are installed without importing them, and their
    versions go into every result's sidecar (:func:`client_versions`)."""
    extra: str = ""
    """ckptio's pip extra that installs :attr:`requires` (``s3``); empty for another
    distribution's backend."""
    install_hint: str = ""
    """What to run when :attr:`requires` are missing: ``pip install 'ckptio[s3]'`` for
    :attr:`extra`; another distribution's own words, or ``pip install <distribution>``."""
    request_size_option: str = "part_size"
    """The keyword option that sets the bytes per data request (``block_size`` on POSIX
    stores): how ``--part-size`` and a sweep over request sizes configure this backend."""
    flush_option: str | None = None
    """The boolean keyword option that, set false, skips durable flushes (``fsync`` on POSIX
    stores; DCP's ``sync_files=False``), for measuring what they cost; None where the backend
    has no such switch."""
    aliases: tuple[str, ...] = ()
    """Earlier names of the scheme, still accepted in URLs where users may have written them
    (``shaped+<url>`` for ``emulate+<url>``); a store opened through one is the same store,
    named by :attr:`scheme` (``Store.url``, results). ckptio's own records only."""

    def __post_init__(self) -> None:
        if self.form not in URL_FORMS:
            raise errors.CkptioError(
                f"backend {self.scheme!r} ({self.target}): URL form {self.form!r} is not one of "
                f"{', '.join(URL_FORMS)}"
            )
        if not self.install_hint:
            hint = (
                f"pip install 'ckptio[{self.extra}]'"
                if self.extra
                else f"pip install {self.distribution}"
            )
            object.__setattr__(self, "install_hint", hint)


def _builtin(scheme: str, target: str, **facts: Any) -> tuple[str, BackendInfo]:
    return scheme, BackendInfo(scheme, f"ckptio.backends.{target}", **facts)


_S3: dict[str, Any] = {"extra": "s3", "form": "bucket"}
_POSIX: dict[str, Any] = {
    "form": "path",
    "request_size_option": "block_size",
    "flush_option": "fsync",
}

BUILTIN: Mapping[str, BackendInfo] = MappingProxyType(
    dict(
        [
            _builtin("file", "local:LocalStore", **_POSIX),
            _builtin("pfs", "parallelfs:ParallelFSStore", **_POSIX),
            _builtin("memory", "memory:MemoryStore"),
            _builtin("emulate", "emulate:EmulatedStore", form="wrapper", aliases=("shaped",)),
            _builtin("s3", "s3:Boto3Store", requires=("botocore",), **_S3),
            _builtin("s3+boto3", "s3:Boto3Store", requires=("botocore",), **_S3),
            _builtin(
                "s3+fsspec", "fsspec:FsspecStore", requires=("fsspec", "s3fs", "botocore"), **_S3
            ),
            _builtin("s3+arrow", "arrow:ArrowStore", requires=("pyarrow", "botocore"), **_S3),
            _builtin("s3+obstore", "obstore:ObstoreStore", requires=("obstore", "botocore"), **_S3),
            _builtin(
                "fsspec", "fsspec:FsspecStore", form="protocol", requires=("fsspec",), extra="s3"
            ),
        ]
    )
)
"""ckptio's own schemes, one record each, in the order error messages list them. Each is also
an entry point in ``pyproject.toml`` (``tests/test_contract.py`` checks the two agree): adding
a scheme is its backend module, its entry point and its record here."""

THIRD_PARTY_ATTRIBUTES = (
    "url_form",
    "requires",
    "install_hint",
    "request_size_option",
    "flush_option",
)
"""The class attributes another distribution's Store class may set to say what a record of
:data:`BUILTIN` says (:func:`backend_info` reads them; ``url_form`` is
:attr:`BackendInfo.form`); those it leaves out take :class:`BackendInfo`'s defaults."""


@cache
def _entry_points() -> Mapping[str, BackendInfo]:
    """Every registered scheme: its :data:`BUILTIN` record where ckptio registered it, else
    what the entry point says (its class's attributes are read by :func:`backend_info`)."""
    found: dict[str, BackendInfo] = {}
    for ep in entry_points(group=GROUP):
        dist = ep.dist.name if ep.dist is not None else "?"
        builtin = BUILTIN.get(ep.name)
        if builtin is not None and builtin.target == ep.value:
            found[ep.name] = builtin
        else:
            found[ep.name] = BackendInfo(ep.name, ep.value, dist)
    return MappingProxyType(found)


def backends() -> Mapping[str, BackendInfo]:
    """Registered schemes (a read-only mapping), whether or not their dependencies import.
    Another distribution's records hold its entry point only; :func:`backend_info` adds what
    its class declares."""
    return _entry_points()


@cache
def backend_info(scheme: str) -> BackendInfo:
    """The record of ``scheme`` (a registered scheme, or a URL's scheme resolved as
    :func:`parse_url` does: ``fsspec+gs`` -> ``fsspec``). Another distribution's backend is
    imported to read its class attributes (:data:`THIRD_PARTY_ATTRIBUTES`); where it does
    not import, its entry point's record (the error comes when a store opens)."""
    table = _entry_points()
    name = _aliases().get(scheme, scheme)
    info = table.get(name) or table[_resolve(name.lower(), name)[0]]
    if BUILTIN.get(info.scheme) is info:
        return info
    try:
        cls = _import_class(info)
    except errors.CkptioError:
        return info
    declared = {name: getattr(cls, name) for name in THIRD_PARTY_ATTRIBUTES if hasattr(cls, name)}
    if "url_form" in declared:
        declared["form"] = declared.pop("url_form")
    if "requires" in declared:
        declared["requires"] = tuple(declared["requires"])
    return replace(info, **declared)


def load_backend(scheme: str) -> type[Store]:
    """The Store class for ``scheme``: a registered scheme, or a URL's scheme resolved as
    :func:`parse_url` does (``fsspec+gs`` -> ``fsspec``). Imports it on first use, after
    which its :attr:`~BackendInfo.requires` are checked to be installed (without importing
    them: the class imports them when a store opens)."""
    info = backend_info(scheme)
    cls = _import_class(info)
    for name in info.requires:
        if not _installed(name):
            missing = ModuleNotFoundError(f"No module named {name!r}", name=name)
            raise errors.missing_package(
                missing, install=info.install_hint, purpose=f"backend {info.scheme!r}"
            )
    return cls


def _import_class(info: BackendInfo) -> type[Store]:
    module_name, _, attr = info.target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise errors.missing_package(
            err, install=info.install_hint, purpose=f"backend {info.scheme!r}"
        ) from err
    cls = getattr(module, attr, None)
    if not (isinstance(cls, type) and issubclass(cls, Store)):
        raise errors.CkptioError(f"entry point {info.target!r} is not a ckptio Store class")
    return cls


def store_class(url: str | os.PathLike[str]) -> type[Store]:
    """The Store class that serves ``url`` (parsed by :func:`parse_url`), without opening a
    store."""
    return _class_for(parse_url(url))


def client_versions(url: str | os.PathLike[str]) -> dict[str, str]:
    """``{distribution: version}`` of the client packages (:attr:`BackendInfo.requires`) of
    the backend that serves ``url`` — the innermost store's where a wrapper wraps one
    (``emulate+s3://``: botocore's) — those not installed left out: what a result records
    about the client a store ran on."""
    from importlib import metadata

    loc = parse_url(url)
    while loc.inner is not None:
        loc = loc.inner
    out = {}
    for name in backend_info(loc.backend).requires:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


def _installed(module: str) -> bool:
    """Whether the top-level package of ``module`` can be imported (without importing it)."""
    import sys
    from importlib.util import find_spec

    top = module.partition(".")[0]
    if top in sys.modules:
        return sys.modules[top] is not None
    try:
        return find_spec(top) is not None
    except (ImportError, ValueError):
        return False


# -- URLs ------------------------------------------------------------------------------------

_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*):")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]")
_FSSPEC_LOCAL = ("file", "local")
_FSSPEC_S3 = ("s3", "s3a")


def accepted_forms() -> str:
    """The URL forms this installation accepts, as one line for error messages."""
    order = list(BUILTIN)
    schemes = sorted(
        _entry_points(), key=lambda s: (order.index(s) if s in order else len(order), s)
    )
    forms = [
        "/abs/path",
        "relative/path",
        *(URL_FORMS[backend_info(s).form].format(s) for s in schemes),
    ]
    return ", ".join(forms)


def _shown(text: str) -> str:
    """``text`` as an error message may show it: no credentials."""
    return redact_url(text)


def _malformed(text: str, why: str) -> errors.InvalidArgumentError:
    return errors.InvalidArgumentError(
        f"malformed URL {_shown(text)!r}: {why}; expected a path or scheme://..., e.g. {accepted_forms()}"
    )


@cache
def _aliases() -> Mapping[str, str]:
    """Every :attr:`BackendInfo.aliases` name of a registered scheme -> that scheme (a name
    registered as a scheme of its own stays that scheme)."""
    table = _entry_points()
    return MappingProxyType(
        {a: s for s, info in table.items() for a in info.aliases if a not in table}
    )


def _resolve(scheme: str, text: str) -> tuple[str, str]:
    """``(registered scheme, suffix)`` for the lower-cased ``scheme`` of ``text``: a
    registered scheme as it is, or ``<wrapper>+<inner>`` / ``<fsspec>+<protocol>``; an alias
    (:attr:`BackendInfo.aliases`) as the scheme it names."""
    table = _entry_points()
    head, plus, tail = scheme.partition("+")
    if head in _aliases():
        scheme = f"{_aliases()[head]}{plus}{tail}"
    if scheme in table and _form(scheme) not in ("wrapper", "protocol"):
        return scheme, ""
    head, plus, tail = scheme.partition("+")
    if head in table and (form := _form(head)) in ("wrapper", "protocol"):
        if plus and tail:
            return head, tail
        need = "must wrap another store" if form == "wrapper" else "needs a protocol"
        raise _malformed(text, f"{head}:// {need}: {URL_FORMS[form].format(head)}")
    import difflib  # error path only

    close = difflib.get_close_matches(scheme, list(table), n=1)
    raise errors.UnknownSchemeError(
        f"no backend for URL scheme {scheme!r} in {_shown(text)!r}"
        + (f" (did you mean {close[0]!r}?)" if close else "")
        + f"; installed schemes: {', '.join(sorted(table))}; accepted forms: {accepted_forms()}"
    )


def _form(scheme: str) -> str:
    """The URL form of the registered ``scheme`` (:attr:`BackendInfo.form`)."""
    return backend_info(scheme).form


def _query(query: str, text: str) -> dict[str, str]:
    if not query:
        return {}
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=True)
    except ValueError:
        raise _malformed(text, "the query must be name=value options joined by '&'") from None
    if any(not name for name, _ in pairs):
        raise _malformed(text, "an option in the query has no name")
    return dict(pairs)  # a name given twice: the last one wins


def _local(
    path: str,
    scheme: str = "file",
    backend: str = "file",
    options: dict[str, str] | None = None,
    protocol: str = "",
) -> StoreURL:
    if "\0" in path:
        raise errors.InvalidArgumentError(f"a path cannot contain a NUL character: {path!r}")
    return StoreURL(
        scheme, backend, "", os.path.abspath(path), options or {}, protocol=protocol, local=True
    )


def parse_url(url: str | os.PathLike[str]) -> StoreURL:
    """Take a storage URL or path apart (the rules are in this module's docstring), or raise
    :class:`~ckptio.errors.InvalidArgumentError` naming what is wrong and the accepted
    forms (:class:`~ckptio.errors.UnknownSchemeError` for a scheme no backend serves)."""
    if isinstance(url, os.PathLike):
        path = os.fspath(url)
        if not isinstance(path, str):
            raise errors.InvalidArgumentError(f"expected a str path, got {path!r}")
        return _local(path)
    if not isinstance(url, str):
        raise errors.InvalidArgumentError(
            f"expected a storage URL, a path or a Store, got {type(url).__name__} {url!r}"
        )
    if not url:
        raise errors.InvalidArgumentError(
            f"empty storage URL; expected a path or scheme://..., e.g. {accepted_forms()}"
        )
    if _CONTROL.search(url):
        raise _malformed(url, "it contains a control character")
    m = _SCHEME.match(url)
    if m is None:
        if "://" in url:
            raise _malformed(
                url, "a scheme is letters, digits, '+', '-', '.' and starts with a letter"
            )
        return _local(url)
    if not url.startswith("//", m.end()):
        raise _malformed(
            url,
            f"'{m.group(1)}:' must be followed by '//' (a local path with a "
            f"':' in its first part: write ./{_shown(url)})",
        )
    scheme = m.group(1).lower()
    backend, suffix = _resolve(scheme, url)
    form = _form(backend)
    if form == "wrapper":
        inner = parse_url(url.split("+", 1)[1])  # after the wrapper's name as written
        return StoreURL(scheme, backend, options=dict(inner.options), inner=inner)
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a malformed port
    except ValueError as err:
        raise _malformed(url, str(err)) from None
    if parts.fragment or "#" in url:
        raise _malformed(url, "a storage URL has no #fragment ('#' in a path: write it as %23)")
    options = _query(parts.query, url)
    userinfo, at, host = parts.netloc.rpartition("@")
    if form == "protocol":
        _check_protocol(suffix, url)
        form = (
            "path" if suffix in _FSSPEC_LOCAL else "bucket" if suffix in _FSSPEC_S3 else "verbatim"
        )
    if form == "path":
        if at or host.lower() not in ("", "localhost"):
            raise _malformed(
                url,
                f"a {scheme}:// URL names a local path, so its host must be empty or 'localhost' "
                f"(got {host!r}): write {scheme}:///abs/path, or a plain path (no scheme) for a "
                "relative one",
            )
        if not parts.path:
            raise _malformed(url, f"{scheme}:// needs an absolute path ({scheme}:///abs/path)")
        return _local(unquote(parts.path), scheme, backend, options, suffix)
    if form == "verbatim":  # fsspec's other protocols: fsspec reads host and path
        return StoreURL(scheme, backend, parts.netloc, parts.path, options, protocol=suffix)
    if form == "bucket":
        if at:
            key, colon, secret = userinfo.partition(":")
            if not (key and colon and secret):
                raise _malformed(url, "credentials as user info are KEY:SECRET@bucket")
            for name in ("access_key_id", "secret_access_key"):
                if name in options:
                    raise _malformed(url, f"credentials given both as user info and as {name}")
            options.update(access_key_id=unquote(key), secret_access_key=unquote(secret))
        if not host:
            raise _malformed(url, f"{scheme}:// needs a bucket ({scheme}://bucket/prefix)")
        if not _BUCKET.fullmatch(host):
            raise _malformed(
                url,
                f"{host!r} is not a valid S3 bucket name (3-63 characters: lower-case letters, "
                "digits, '.', '-')",
            )
        return StoreURL(scheme, backend, host, parts.path, options, protocol=suffix)
    if at:
        raise _malformed(url, f"{scheme}:// takes no user info")
    return StoreURL(scheme, backend, host, parts.path, options, protocol=suffix)


def _check_protocol(protocol: str, text: str) -> None:
    """``fsspec+<protocol>``: refuse a protocol fsspec does not know (where fsspec is
    installed; without it, opening the store names the extra to install)."""
    try:
        import fsspec
    except ImportError:
        return
    known = set(fsspec.available_protocols())
    if protocol not in known:
        import difflib  # error path only

        close = difflib.get_close_matches(protocol, sorted(known), n=1)
        raise errors.UnknownSchemeError(
            f"fsspec knows no protocol {protocol!r} in {_shown(text)!r}"
            + (f" (did you mean 'fsspec+{close[0]}'?)" if close else "")
            + f"; accepted forms: {accepted_forms()}"
        )


def wrap_url(wrapper: str, url: str | os.PathLike[str]) -> str:
    """``<wrapper>+<url>`` for a URL or a plain path (``emulate`` + ``/tmp/x`` gives
    ``emulate+file:///tmp/x``); the URL's query stays as written."""
    loc = parse_url(url)
    if isinstance(url, str) and _SCHEME.match(url):
        return f"{wrapper}+{url}"
    return f"{wrapper}+{loc.bare}"


EMULATOR = "emulate"
"""The backend that emulates storage profiles on any store (``emulate+<url>?profile=...``)."""


def emulation_url(url: str | os.PathLike[str]) -> str:
    """``url`` wrapped in the backend that emulates storage profiles (:data:`EMULATOR`): the
    store it opens takes a ``profile`` option and times every request as the profile says."""
    return wrap_url(EMULATOR, url)


_FSSPEC_ALIKE = (*_FSSPEC_LOCAL, *_FSSPEC_S3)
"""Schemes whose URLs name the same storage in ckptio as in fsspec (a local path, an S3
bucket): every other scheme fsspec knows means, in fsspec's hands, fsspec's own filesystem."""


def from_fsspec_url(url: str | os.PathLike[str]) -> str:
    """The ckptio URL of the storage that fsspec (and so Lightning, pandas, ...) means by
    ``url``. A plain path, ``file://`` and ``s3://`` mean the same in both and are returned as
    they are; another scheme fsspec knows means its fsspec filesystem here too:
    ``memory://x`` (fsspec's in-process filesystem, not ckptio's ``memory://``) becomes
    ``fsspec+memory://x``, ``gs://b/p`` becomes ``fsspec+gs://b/p``. A scheme fsspec does not
    know (``pfs://``, ``s3+obstore://``) is ckptio's own and stays."""
    if isinstance(url, os.PathLike):
        return os.fspath(url)
    m = _SCHEME.match(url)
    if m is None or not url.startswith("//", m.end()):
        return url
    scheme = m.group(1).lower()
    if scheme in _FSSPEC_ALIKE:
        return url
    try:
        import fsspec
    except ImportError:
        return url
    if scheme not in fsspec.available_protocols():
        return url
    return f"fsspec+{scheme}{url[m.end(1) :]}"


def location(url: str | os.PathLike[str]) -> str:
    """Where ``url``'s objects live, the same whichever client or spelling reaches them: a
    local directory's real path (``file:///data/run``, ``pfs:///data/run``, ``data/run``, a
    symlink to it: ``file:///data/run``), a bucket's prefix whichever S3 client
    (``s3+obstore://b/run/`` and ``fsspec+s3://b/run``: ``s3://b/run``), a wrapped URL's
    (``emulate+<url>``) own. No credentials, options or endpoint: what a tiered checkpointer
    records as the owner of its fast root."""
    loc = parse_url(url)
    while loc.inner is not None:
        loc = loc.inner
    if loc.local:
        return f"file://{os.path.realpath(loc.path)}"
    family = loc.protocol or loc.scheme.split("+")[0]
    return f"{family}://{loc.host}/{loc.prefix}"


def split_url(url: str | os.PathLike[str]) -> tuple[str, str, dict[str, str]]:
    """``(scheme, canonical URL without query, options)`` of :func:`parse_url`."""
    loc = parse_url(url)
    return loc.scheme, loc.bare, dict(loc.options)


def open_store(url: str | os.PathLike[str] | Store, **options: Any) -> Store:
    """A Store for ``url`` (parsed by :func:`parse_url`). Options come from the URL's query
    string (and user info) and from ``options`` (which win). An existing Store is returned as
    it is. Credentials among them are never shown afterwards (:mod:`ckptio.redact`)."""
    if isinstance(url, Store):
        return url
    loc = parse_url(url)
    _register_credentials(loc, options)
    return _class_for(loc)(loc.bare, **{**loc.options, **options})


def _class_for(loc: StoreURL) -> type[Store]:
    """The class that serves ``loc``: its backend's (:func:`_serving`)."""
    return load_backend(_serving(loc))


def _serving(loc: StoreURL) -> str:
    """The registered scheme whose backend serves ``loc``: its own; for a ``file://`` URL
    whose root lies on a parallel filesystem, ``pfs`` (``ParallelFSStore``: the same options
    plus striping ones)."""
    if loc.backend == "file" and "pfs" in _entry_points():
        pfs = cast("type[ParallelFSStore]", load_backend("pfs"))
        if pfs.claims(loc.path):
            return "pfs"
    return loc.backend


def backend_for(url: str | os.PathLike[str]) -> BackendInfo:
    """The record of the backend that serves ``url`` (parsed by :func:`parse_url`), without
    opening a store: a wrapper's own for a wrapped URL (``emulate+file://``: ``emulate``'s),
    ``pfs``'s for a ``file://`` URL on a parallel filesystem. What the CLI and the runner read
    before a store opens (:attr:`BackendInfo.request_size_option`, ...)."""
    return backend_info(_serving(parse_url(url)))


def _register_credentials(loc: StoreURL, options: Mapping[str, Any]) -> None:
    """Every credential of a URL (secret-named query options, user info) and of ``options``
    becomes a value no message, log line or result file shows (:mod:`ckptio.redact`)."""
    while loc.inner is not None:
        loc = loc.inner
    for name, value in {**loc.options, **options}.items():
        if is_secret_name(name):
            register_secret(value)
    userinfo, at, _ = loc.host.rpartition("@")  # hosts of fsspec's other protocols keep theirs
    if at:
        user, _, password = unquote(userinfo).partition(":")
        register_secret(user)
        register_secret(password)
