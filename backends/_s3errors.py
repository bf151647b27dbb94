"""S3 errors: the one table that translates every S3 client library's exceptions into
ckptio errors (:func:`translate_error`, :func:`guard`).

Errors (:func:`translate_error`): every backend funnels its vendor exceptions through one
table, :data:`S3_ERROR_CODES`, keyed by the S3 error code normalised to upper case without
``_`` (so botocore's ``NoSuchKey`` and Arrow's ``NO_SUCH_KEY`` meet), then by HTTP status,
then by the kind of network failure. Transient failures become
:class:`~ckptio.errors.TransientStorageError` / :class:`~ckptio.errors.ThrottledError`, which
:meth:`Store.retrying` retries and traces; the client libraries' own retries are switched off
so that every attempt is ours and is counted.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from ckptio import errors
from ckptio.redact import redact

from ._s3config import AwsSettings

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
