"""URL scheme -> backend class, through the entry-point group ``ckptio.backends``.

Entry points hold ``"module:Class"`` strings and are imported only when a URL needs them, so
a missing optional dependency (boto3, obstore, ...) costs nothing until it is used, and then
fails with the pip extra to install. Third-party backends register the same way::

    [project.entry-points."ckptio.backends"]
    myfs = "mypkg.store:MyStore"

Scheme resolution: the full scheme first (``s3+boto3``), then the part before the first
``+`` (``shaped+file`` -> ``shaped``, ``fsspec+gs`` -> ``fsspec``). A plain path with no
scheme is ``file``.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib.metadata import entry_points
from types import MappingProxyType
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from ckptio import errors
from ckptio.redact import is_secret_name, register_secret
from ckptio.store import Store

GROUP = "ckptio.backends"

#: The pip extra that brings each built-in backend's dependencies.
INSTALL_HINTS: Mapping[str, str] = MappingProxyType(
    {
        "s3": "s3",
        "s3+boto3": "s3",
        "s3+fsspec": "s3",
        "s3+arrow": "s3",
        "s3+obstore": "s3",
        "fsspec": "s3",
    }
)


@dataclass(frozen=True)
class BackendInfo:
    scheme: str
    target: str
    """``module:Class`` as registered."""
    distribution: str


@cache
def _entry_points() -> Mapping[str, BackendInfo]:
    found: dict[str, BackendInfo] = {}
    for ep in entry_points(group=GROUP):
        dist = ep.dist.name if ep.dist is not None else "?"
        found[ep.name] = BackendInfo(ep.name, ep.value, dist)
    return MappingProxyType(found)


def backends() -> Mapping[str, BackendInfo]:
    """Registered schemes (a read-only mapping), whether or not their dependencies import."""
    return _entry_points()


def load_backend(scheme: str) -> type[Store]:
    """The Store class for ``scheme``; imports it on first use."""
    table = _entry_points()
    info = table.get(scheme) or table.get(scheme.split("+", 1)[0])
    if info is None:
        raise errors.UnknownSchemeError(
            f"no backend for URL scheme {scheme!r}; installed schemes: {', '.join(sorted(table))}"
            " (a compound scheme like 'shaped+file' resolves to its first part)"
        )
    module_name, _, attr = info.target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        extra = INSTALL_HINTS.get(info.scheme) or INSTALL_HINTS.get(scheme)
        hint = f"pip install 'ckptio[{extra}]'" if extra else f"install {info.distribution}'s dependencies"
        raise errors.BackendUnavailableError(
            f"backend {info.scheme!r} needs a module that is not installed ({err.name or err}); {hint}"
        ) from err
    cls = getattr(module, attr)
    if not (isinstance(cls, type) and issubclass(cls, Store)):
        raise errors.CkptioError(f"entry point {info.target!r} is not a ckptio Store class")
    return cls


def split_url(url: str) -> tuple[str, str, dict[str, str]]:
    """``(scheme, url_without_query, options_from_query)``; a plain path gets ``file``."""
    if not isinstance(url, str) or not url:
        raise errors.InvalidArgumentError(f"expected a storage URL or path, got {url!r}")
    parts = urlsplit(url)
    # "C:..." or a bare path: no scheme. A scheme needs "://" here.
    if "://" not in url:
        return "file", url, {}
    options = dict(parse_qsl(parts.query, keep_blank_values=True))
    # not urlunsplit: it drops the "//" of schemes it does not know (pfs:///x -> pfs:/x)
    bare = f"{parts.scheme}://{parts.netloc}{parts.path}"
    return parts.scheme.lower(), bare, options


def open_store(url: str | Store, **options: Any) -> Store:
    """A Store for ``url``. Options come from the URL's query string and from ``options``
    (which win). An existing Store is returned as it is. Credentials among them are never
    shown afterwards (:mod:`ckptio.redact`)."""
    if isinstance(url, Store):
        return url
    scheme, bare, query = split_url(url)
    _register_credentials(bare, {**query, **options})
    cls = load_backend(scheme)
    return cls(bare, **{**query, **options})


def _register_credentials(bare: str, options: Mapping[str, Any]) -> None:
    """Every credential given in ``options`` (secret-named, :func:`ckptio.redact.is_secret_name`)
    or in the URL's user part becomes a value no message, log line or result shows."""
    for name, value in options.items():
        if is_secret_name(name):
            register_secret(value)
    authority = bare.partition("://")[2].partition("/")[0]
    if "@" in authority:
        user, _, password = unquote(authority.rpartition("@")[0]).partition(":")
        register_secret(user)
        register_secret(password)
