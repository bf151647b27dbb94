"""Request events: every backend reports each storage request here.

The comparison suite explains stalls from these records, so a backend must report *every*
request it sends, including each retry attempt. Times are wall-clock seconds since the epoch
(``time.time()``) so events from different processes and nodes can be merged.

Recording is cheap (one small object appended under a lock per request of typically
megabytes), and bounded: a :class:`Trace` keeps at most ``max_events`` events (oldest dropped
and counted) so a long training job does not grow without limit.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

__all__ = ["OPS", "Outcome", "RequestEvent", "Trace"]

Outcome = Literal["ok", "retry", "throttled", "error"]

#: Operation names used by the built-in backends. Metadata operations are timed separately
#: from data transfer so a report can tell metadata stalls from bandwidth stalls.
OPS = (
    "put",  # a whole small object (publish, single PUT)
    "write",  # one part / block of a streamed writer
    "create",  # open/create an object or file, start a multipart upload
    "commit",  # close: complete multipart upload, fsync + rename
    "fsync",
    "rename",
    "abort",
    "get",  # a (ranged) read
    "list",
    "head",  # size / exists
    "delete",
    "open",
    "close",
)


@dataclass(slots=True)
class RequestEvent:
    """One storage request, or one attempt of it."""

    op: str
    """Operation, one of :data:`OPS` (backends may add their own)."""
    key: str
    """Object key relative to the store's root."""
    nbytes: int
    """Payload bytes sent or received by this request (0 for metadata requests)."""
    start: float
    """Wall-clock start, seconds since the epoch."""
    end: float
    """Wall-clock end, seconds since the epoch."""
    attempt: int = 1
    """1 for the first try, 2 for the first retry, ..."""
    outcome: Outcome = "ok"
    """ok; retry (failed, will be retried); throttled (the service said slow down); error."""
    backend: str = ""
    """Backend name (``file``, ``s3+boto3``, ...)."""
    error: str = ""
    """For failed attempts: the error class and message (never credentials)."""
    thread: int = field(default_factory=threading.get_ident)
    """Thread that issued the request: a proxy for the stream it used."""

    @property
    def seconds(self) -> float:
        return self.end - self.start

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class Trace:
    """A thread-safe, bounded collector of :class:`RequestEvent`.

    Note for implementers of backends: call :meth:`request` around each request (the context
    manager marks failures itself), or :meth:`record` when you already have start and end.
    """

    def __init__(self, *, max_events: int | None = 1_000_000) -> None:
        self._events: deque[RequestEvent] = deque(maxlen=max_events)
        self._lock = threading.Lock()
        self.dropped = 0
        """Events dropped because ``max_events`` was reached."""

    def record(self, event: RequestEvent) -> None:
        with self._lock:
            if self._events.maxlen is not None and len(self._events) == self._events.maxlen:
                self.dropped += 1
            self._events.append(event)

    @contextmanager
    def request(
        self, op: str, key: str, nbytes: int = 0, *, backend: str = "", attempt: int = 1
    ) -> Iterator[RequestEvent]:
        """Time one request. The yielded event may be edited (e.g. ``nbytes`` once known,
        ``outcome='throttled'``). An exception marks it ``error`` (or ``retry``/``throttled`` if
        the caller already set that) and propagates."""
        event = RequestEvent(op, key, nbytes, time.time(), 0.0, attempt, "ok", backend)
        try:
            yield event
        except BaseException as err:
            if event.outcome == "ok":
                event.outcome = "error"
            event.error = f"{type(err).__name__}: {err}"[:500]
            raise
        finally:
            event.end = time.time()
            self.record(event)

    def events(self) -> list[RequestEvent]:
        """A copy of the events recorded so far, oldest first."""
        with self._lock:
            return list(self._events)

    def clear(self) -> None:
        with self._lock:
            self._events.clear()
            self.dropped = 0

    def __len__(self) -> int:
        return len(self._events)

    def summary(self) -> dict[str, dict[str, float]]:
        """Per-op counts, bytes and outcome counts: a quick look without pyarrow."""
        out: dict[str, dict[str, float]] = {}
        for ev in self.events():
            s = out.setdefault(ev.op, {"requests": 0, "bytes": 0, "seconds": 0.0})
            s["requests"] += 1
            s["bytes"] += ev.nbytes
            s["seconds"] += ev.seconds
            s[ev.outcome] = s.get(ev.outcome, 0) + 1
        return out
