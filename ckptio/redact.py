"""Credentials are never shown: the one redaction every label, message, log line, error,
result file and report of ckptio goes through.

The rule (``***`` replaces what is hidden):

- a URL's user part (``scheme://user:password@host``) becomes ``***@host``; the host and path
  stay. A password holding ``/`` (``s3://KEY:abc/def@bucket``, which URL parsers misread as a
  host ``KEY:abc`` with a non-numeric port) is recognised too.
- a URL query parameter, store option, JSON key or environment variable is secret when its
  name says so (:func:`is_secret_name`): it contains ``secret``, ``password``, ``passwd``,
  ``pwd``, ``token``, ``credential``, ``signature`` or ``auth``, ends in ``key`` or
  ``key_id``, or is ``sig``/``sas`` — unless the name says it holds a location: it ends in
  ``_file``, ``_path``, ``_dir`` or ``_sock`` (``AWS_SHARED_CREDENTIALS_FILE``,
  ``AWS_WEB_IDENTITY_TOKEN_FILE``, ``SSH_AUTH_SOCK``: where a secret is, not the secret). Its
  value is hidden; the others stay readable (``endpoint_url``, ``region``, ``part_size``,
  ``streams``, ``profile``, ``key_layout``...). Access key ids are hidden too: AWS does not
  count them as secret, but one names an account and a user, and half of a key pair is
  nothing to print.
- a value known to be a credential (:func:`register_secret`: every credential ckptio was
  given or resolved from the environment or an AWS profile, and the value of every
  secret-named environment variable at import) is hidden wherever it appears in free text,
  raw or URL-quoted, e.g. in a vendor's error message. The shell's ``PWD`` and ``OLDPWD``
  (the current and previous directory: a path in every message about a relative path) and
  ``XAUTHORITY`` (a file) are not credentials, whatever ``pwd`` and ``auth`` in their names
  suggest.
- ``Authorization`` headers are hidden to the end of the line.

A profile's *name* is shown; its keys never are.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import quote, quote_plus, unquote_plus

__all__ = [
    "MASK",
    "MIN_SECRET_LENGTH",
    "is_secret_name",
    "redact",
    "redact_obj",
    "redact_strings",
    "redact_url",
    "register_secret",
]

MASK = "***"

_SECRET_NAME = re.compile(
    r"secret|passw(?:or)?d|pwd|token|credential|signature|auth|key$|key_?id$|^sig$|^sas$",
    re.IGNORECASE,
)
MIN_SECRET_LENGTH = 8
"""Shorter values are not replaced in free text (``token=true`` must not turn every ``true``
of a JSON document into ``***``); name-based rules still hide them."""

_SECRETS: set[str] = set()
_LOCK = threading.Lock()
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:/*")
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>`]+")
_NAMED_VALUES = (
    re.compile(r"(?P<name>[A-Za-z_][\w.-]*)(?P<sep>=)(?P<value>[^&\s,;'\"}]+)"),  # name=value
    # 'name': 'value' (a dict's repr, JSON)
    re.compile(
        r"(?P<q>['\"])(?P<name>[A-Za-z_][\w.-]*)(?P=q)(?P<sep>\s*:\s*['\"]?)"
        r"(?P<value>[^&\s,;'\"}]+)"
    ),
)
_AUTHORIZATION = re.compile(r"(?i)(authorization['\"]?\s*[:=]\s*['\"]?)[^\n'\"]+")


_LOCATION_NAME = re.compile(r"_(?:file|path|dir|sock)$", re.IGNORECASE)
"""A name that says its value is where something is (a file, a directory, a socket)."""
_NOT_CREDENTIALS = frozenset({"PWD", "OLDPWD", "XAUTHORITY"})
"""Environment variables whose names match the secret-name rule but that hold paths: the
shell's current and previous directory, and the X server's cookie file."""


def is_secret_name(name: str) -> bool:
    """Whether a parameter, option, key or environment variable called ``name`` holds a
    credential (the rule in the module docstring)."""
    name = str(name).replace("-", "_")
    return bool(_SECRET_NAME.search(name)) and not _LOCATION_NAME.search(name)


def register_secret(value: Any) -> None:
    """Remember ``value`` (a credential ckptio was given or resolved) so that :func:`redact`
    hides it wherever it appears, also URL-quoted. Short values are ignored
    (:data:`MIN_SECRET_LENGTH`)."""
    if isinstance(value, str) and len(value) >= MIN_SECRET_LENGTH:
        with _LOCK:
            _SECRETS.update({value, quote(value, safe=""), quote_plus(value)})


def _known_secrets() -> list[str]:
    """The registered credentials, longest first (a secret that holds another is replaced
    whole)."""
    with _LOCK:
        return sorted(_SECRETS, key=len, reverse=True)


def _register_environment() -> None:
    """Register the values of this process's secret-named environment variables
    (``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``*_TOKEN``, ``*_PASSWORD``...), once,
    at import. Credentials a store resolves later (from a changed environment or a profile)
    are registered when it resolves them."""
    for name, value in os.environ.items():
        if name not in _NOT_CREDENTIALS and is_secret_name(name):
            register_secret(value)


def redact_url(url: str) -> str:
    """``url`` with its user part and the values of secret-named query parameters replaced
    by ``***``; everything else as written. Plain paths pass unchanged; so does a URL that
    holds no credential."""
    if not isinstance(url, str):
        return url
    if "://" in url:
        scheme, _, rest = url.partition("://")
        scheme += "://"
    else:  # a malformed URL in an error message ("s3:/KEY:SECRET@bucket"), or a plain path
        m = _SCHEME.match(url)
        if m is None or ("@" not in url and "?" not in url):
            return url
        scheme, rest = m[0], url[m.end() :]
    rest, hash_, fragment = rest.partition("#")
    head, qmark, query = rest.partition("?")
    authority, slash, path = head.partition("/")
    if "@" in authority:
        authority = f"{MASK}@{authority.rpartition('@')[2]}"
    elif ":" in authority and "@" in path and not authority.rpartition(":")[2].isdigit():
        # "KEY:abc/def@bucket/run": a password with '/' cut the user part short
        authority, slash, path = path.partition("@")[2].partition("/")
        authority = f"{MASK}@{authority}"
    if query:
        pairs = []
        for pair in query.split("&"):
            name, eq, _value = pair.partition("=")
            pairs.append(f"{name}={MASK}" if eq and is_secret_name(unquote_plus(name)) else pair)
        query = "&".join(pairs)
    return f"{scheme}{authority}{slash}{path}{qmark}{query}{hash_}{fragment}"


def _named_value(m: re.Match[str]) -> str:
    # a bare "key" in free text is an object key ("--option KEY=VALUE", {"key": "step-1/..."})
    if m["name"].lower() == "key" or not is_secret_name(m["name"]):
        return m[0]
    return m[0][: m.start("value") - m.start()] + MASK


def redact(text: str) -> str:
    """Free ``text`` (a message, a log line, a label) with every credential hidden: URLs in
    it through :func:`redact_url`, ``name=value`` and ``'name': 'value'`` pairs with a secret
    name (but the bare word ``key``: in free text it names an object), ``Authorization``
    headers, and every known secret value."""
    return _redact(text if isinstance(text, str) else str(text), _known_secrets())


def redact_strings(texts: Iterable[str | None]) -> list[str | None]:
    """:func:`redact` over many strings (``None`` kept), the known secrets gathered once."""
    known = _known_secrets()
    return [None if t is None else _redact(t, known) for t in texts]


def _redact(text: str, known: list[str]) -> str:
    if "://" in text:
        text = _URL.sub(lambda m: redact_url(m[0]), text)
    if "uthorization" in text or "UTHORIZATION" in text:
        text = _AUTHORIZATION.sub(rf"\1{MASK}", text)
    if "=" in text or ":" in text:
        for pattern in _NAMED_VALUES:
            text = pattern.sub(_named_value, text)
    for secret in known:
        if secret in text:
            text = text.replace(secret, MASK)
    return text


def redact_obj(obj: Any) -> Any:
    """A JSON-able copy of ``obj`` (a result sidecar, a configuration): secret-named keys
    keep their name with the value ``***``, environment dumps (keys ``env``, ``environ``,
    ``environment``) are left out, strings go through :func:`redact`."""
    if isinstance(obj, Mapping):
        out = {}
        for k, v in obj.items():
            name = str(k)
            if name.lower() in ("env", "environ", "environment"):
                continue
            hidden = is_secret_name(name) and v is not None and v != "" and not isinstance(v, bool)
            out[name] = MASK if hidden else redact_obj(v)
        return out
    if isinstance(obj, list | tuple):
        return [redact_obj(v) for v in obj]
    if isinstance(obj, str):
        return redact(obj)
    if obj is None or isinstance(obj, bool | int | float):
        return obj
    return redact(str(obj))


_register_environment()
