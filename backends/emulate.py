"""Emulate a storage profile on any store: ``emulate+<url>?profile=cloud-s3``.

``emulate+memory://x?profile=cloud-s3`` or ``emulate+file:///tmp/x?profile=abci-lustre`` behaves
like the wrapped store (the data really goes there) but takes as long as the profile says, so a
laptop run shows the behaviour of the storage class: every data request pays the request
latency and travels through one stream at the per-stream bandwidth, through the node link and
the aggregate bandwidth (reservations on shared links: concurrent streams share them), and
metadata requests pay the metadata latency. A request the service answers with an error (not
found, denied, already there) pays its latency too. A request-rate limiter (a token bucket per key
prefix, or per store) answers requests over the rate with :class:`~ckptio.errors.
ThrottledError` ("503 SlowDown"), the same error the real S3 backend raises, so the retry
path runs and the trace records ``throttled`` attempts.

This is **emulation by sleeping, not a measurement**: results through it are marked
``emulated`` (the runner and the reports show it). Emulated time replaces the wrapped store's
own time when it is longer (the real operation runs inside the emulated window).

Options (URL query or keyword), besides the wrapped store's own:

- ``profile``: a profile name (``ckptio profiles``) or a ``.toml`` path. Default ``cloud-s3``.
- ``streams``: concurrent streams (connections) of this store. Default: the profile's.
- ``part_size``: bytes per data request (``8MiB``). Default: the profile's.
- ``ranks``: processes sharing the aggregate bandwidth and request rates (each gets 1/ranks).
  Default 1.
- ``ranks_per_node``: processes sharing one node link (each gets 1/ranks_per_node). Default 1.
- any profile figure by name (``stream_bandwidth=100MB/s``, ``request_latency=20ms``, ...).

The data path: ``write`` hands buffers to the wrapped writer at once (no copy) and queues one
emulated request per ``part_size`` bytes on the stream pool; ``close`` waits for them, then
commits. ``read_into`` splits the buffer into ``part_size`` ranged reads run on the streams.
"""

from __future__ import annotations

import builtins
import math
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from typing import Any, ClassVar, TypeVar

from ckptio import errors
from ckptio.profiles import ALL_FIGURES, Profile, load_profile
from ckptio.registry import open_store, parse_url
from ckptio.store import (
    Buffer,
    Capabilities,
    ColdReads,
    ObjectStat,
    Store,
    StoreInfo,
    Writer,
    as_byte_view,
    check_key,
    option_int,
    wait_all,
)
from ckptio.trace import Trace
from ckptio.units import MAX_LOCAL_PROCESSES, parse_size

__all__ = ["EmulatedStore"]

T = TypeVar("T")

_EMULATE_OPTIONS = ("profile", "streams", "part_size", "ranks", "ranks_per_node")


def _sleep_until(deadline: float) -> None:
    delay = deadline - time.monotonic()
    if delay > 0:
        time.sleep(delay)


class _Link:
    """A shared link of ``rate`` bytes/s: transfers reserve it first come, first served."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self._free_at = 0.0
        self._lock = threading.Lock()

    def reserve(self, nbytes: int, start: float) -> float:
        """Monotonic time at which ``nbytes`` starting no earlier than ``start`` are through."""
        if math.isinf(self.rate):
            return start
        with self._lock:
            begin = max(start, self._free_at)
            self._free_at = begin + nbytes / self.rate
            return self._free_at


class _RateLimiter:
    """Token buckets of ``rate`` requests/s (burst: one second's worth), one per scope key."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.burst = max(1.0, rate)
        self._buckets: dict[str, tuple[float, float]] = {}  # scope -> (tokens, at)
        self._lock = threading.Lock()

    def admit(self, scope: str) -> bool:
        if math.isinf(self.rate):
            return True
        now = time.monotonic()
        with self._lock:
            tokens, at = self._buckets.get(scope, (self.burst, now))
            tokens = min(self.burst, tokens + (now - at) * self.rate)
            if tokens >= 1.0:
                self._buckets[scope] = (tokens - 1.0, now)
                return True
            self._buckets[scope] = (tokens, now)
            return False


class _PageCacheDrops(ColdReads):
    """The wrapped store's page-cache drop (``fadvise``) passes through; its reads are not
    switched to direct I/O (what a read costs here is the profile's)."""

    def __init__(self, inner: ColdReads) -> None:
        self._inner = inner

    @property
    def modes(self) -> tuple[str, ...]:
        return tuple(m for m in self._inner.modes if m == "fadvise")

    def start(self, keys: Sequence[str], mode: str) -> str:
        if mode not in self.modes:
            raise self.refuse(mode, "an emulated store")
        return self._inner.start(keys, mode)

    def end(self) -> bool:
        return self._inner.end()


class _EmulatedWriter(Writer):
    def __init__(self, store: EmulatedStore, key: str, size_hint: int | None) -> None:
        self.key = key
        self._store = store
        self._nbytes = 0
        self._pending = 0  # bytes not yet sent as an emulated part
        self._parts: list[Future[None]] = []
        self._done = False
        self._inner: Writer = store._metadata(
            "create", key, lambda: store.inner.open_writer(key, size_hint=size_hint)
        )

    def _send_part(self, nbytes: int) -> None:
        s = self._store
        self._parts.append(s._pool.submit(s._data, "write", self.key, nbytes, _noop, False))

    def write(self, data: Buffer) -> None:
        if self._done:
            raise errors.InvalidArgumentError(f"write to {self.key!r} after close/abort")
        n = as_byte_view(data).nbytes
        self._inner.write(data)
        self._nbytes += n
        self._pending += n
        part = self._store.part_size
        while self._pending >= part:
            self._send_part(part)
            self._pending -= part

    def _wait(self) -> None:
        parts, self._parts = self._parts, []
        wait_all(parts)

    def close(self) -> None:
        if self._done:
            return
        if self._pending or (not self._parts and self._nbytes == 0):
            self._send_part(self._pending)
            self._pending = 0
        try:
            self._wait()
            self._store._metadata("commit", self.key, self._inner.close)
        except BaseException:
            self.abort()
            raise
        self._done = True

    def abort(self) -> None:
        # parts not started yet are dropped; those in flight are waited for
        self._parts = [f for f in self._parts if not f.cancel()]
        try:
            self._wait()
        except errors.CkptioError:
            pass  # the write is being discarded; its failure is what the caller is handling
        finally:
            self._done = True
            self._inner.abort()


def _noop() -> None:
    return None


class EmulatedStore(Store):
    """Any store, slowed down to a storage profile (see the module docstring for options)."""

    schemes: ClassVar[tuple[str, ...]] = ("emulate",)
    name: ClassVar[str] = "emulate"

    def __init__(
        self,
        url: str,
        *,
        trace: Trace | None = None,
        profile: str | Profile = "cloud-s3",
        streams: int | str | None = None,
        part_size: int | str | None = None,
        ranks: int | str = 1,
        ranks_per_node: int | str = 1,
        **options: Any,
    ) -> None:
        """Options: see the module docstring. ``streams`` and ``part_size`` left None take the
        profile's; ``**options`` holds profile figures by name (:data:`~ckptio.profiles.ALL_FIGURES`) and the
        wrapped store's own options (which that store checks)."""
        super().__init__(url, trace=trace)
        inner_loc = parse_url(url).inner
        if inner_loc is None:
            raise errors.InvalidArgumentError(
                f"emulate URL must wrap another store, e.g. emulate+memory://x?profile=cloud-s3 or "
                f"emulate+file:///tmp/x?profile=abci-lustre; got {url!r}"
            )
        figures = {k: options.pop(k) for k in list(options) if k in ALL_FIGURES}
        shape = load_profile(profile, figures)
        if streams is not None:
            shape = replace(
                shape,
                streams=option_int(
                    streams, field="streams", minimum=1, maximum=MAX_LOCAL_PROCESSES
                ),
            )
        if part_size is not None:
            shape = replace(shape, part_size=parse_size(part_size, field="part_size"))
        self.profile: Profile = shape
        self.ranks = option_int(ranks, field="ranks", minimum=1)
        self.ranks_per_node = option_int(ranks_per_node, field="ranks_per_node", minimum=1)
        self.streams = shape.streams
        self.part_size = max(1, shape.part_size)

        inner_url = inner_loc.bare
        # The wrapped store's own requests are not the emulated service's: a private trace.
        try:
            self.inner: Store = open_store(inner_url, trace=Trace(max_events=10_000), **options)
        except errors.UnknownOptionError as err:
            raise err.widened(
                "emulate+", (*_EMULATE_OPTIONS, *ALL_FIGURES), f"emulate+{err.where}"
            ) from None
        self.name = f"emulate:{shape.name}+{self.inner.name}"  # type: ignore[misc]
        # per instance: what the wrapped store can do (positional writes are not emulated)
        self.capabilities: Capabilities = replace(  # type: ignore[misc]
            self.inner.capabilities, positional_writes=False
        )

        self._node = _Link(shape.node_bandwidth / self.ranks_per_node)
        # the read side's own figures where the profile has them (else the shared ones)
        self._read_node = (
            _Link(shape.value("read_node_bandwidth") / self.ranks_per_node)
            if "read_node_bandwidth" in shape.figures
            else self._node
        )
        self._aggregate = _Link(shape.aggregate_bandwidth / self.ranks)
        self._write_rate = _RateLimiter(shape.write_request_rate / self.ranks)
        self._read_rate = _RateLimiter(shape.read_request_rate / self.ranks)
        self._pool = ThreadPoolExecutor(
            max_workers=self.streams, thread_name_prefix="ckptio-emulate"
        )
        self._cold_reads = _PageCacheDrops(self.inner.describe().cold_reads)

    # -- emulated requests ----------------------------------------------------------------
    def _scope(self, key: str) -> str:
        if self.profile.rate_scope == "prefix":
            return key.rpartition("/")[0]
        return ""

    def _admit(self, key: str, *, read: bool) -> None:
        if self.profile.rate_scope == "none":
            return
        limiter = self._read_rate if read else self._write_rate
        if not limiter.admit(self._scope(key)):
            # the service answers after one round trip
            time.sleep(self.profile.request_latency)
            rate = limiter.rate * self.ranks
            raise errors.ThrottledError(
                f"emulated {self.profile.name}: {self.profile.throttle.split(';')[0] or 'throttled'}"
                f" (over {rate:g} requests/s per {self.profile.rate_scope})"
            )

    def _data(self, op: str, key: str, nbytes: int, fn: Callable[[], T], read: bool) -> T:
        """One data request of ``nbytes`` on the calling thread (one stream)."""

        def attempt() -> T:
            self._admit(key, read=read)
            p = self.profile
            start = time.monotonic() + p.side("request_latency", read=read)
            done = max(
                start + nbytes / p.side("stream_bandwidth", read=read),
                (self._read_node if read else self._node).reserve(nbytes, start),
                self._aggregate.reserve(nbytes, start),
            )
            try:
                result = fn()
            except OSError:  # the service's answer (not found, denied, exists): a round trip
                _sleep_until(start)
                raise
            _sleep_until(done)
            return result

        return self.retrying(op, key, nbytes, attempt)

    def _metadata(self, op: str, key: str, fn: Callable[[], T], *, read: bool = False) -> T:
        def attempt() -> T:
            if op != "commit":  # completing an upload is not rate limited separately
                self._admit(key, read=read)
            done = time.monotonic() + self.profile.metadata_latency
            try:
                result = fn()
            finally:  # a HEAD that finds nothing takes its round trip too
                _sleep_until(done)
            return result

        return self.retrying(op, key, 0, attempt)

    # -- the Store contract ---------------------------------------------------------------
    def open_writer(self, key: str, *, size_hint: int | None = None) -> Writer:
        check_key(key)
        return _EmulatedWriter(self, key, size_hint)

    def publish(self, key: str, data: bytes, *, overwrite: bool = True) -> None:
        self._metadata("put", key, lambda: self.inner.publish(key, data, overwrite=overwrite))

    def read_into(self, key: str, offset: int, buffer: Buffer) -> int:
        out = as_byte_view(buffer)
        part = self.part_size
        pieces = [(lo, min(part, out.nbytes - lo)) for lo in range(0, out.nbytes, part)] or [(0, 0)]

        def one(lo: int, n: int) -> int:
            return self._data(
                "get",
                key,
                n,
                lambda: self.inner.read_into(key, offset + lo, out[lo : lo + n]),
                True,
            )

        if len(pieces) == 1 or threading.current_thread().name.startswith("ckptio-emulate"):
            counts = [one(lo, n) for lo, n in pieces]
        else:
            counts = [f.result() for f in [self._pool.submit(one, lo, n) for lo, n in pieces]]
        total = 0
        for (_, n), got in zip(pieces, counts, strict=True):
            total += got
            if got < n:
                break
        return total

    def list(self, prefix: str = "") -> builtins.list[str]:
        return self._metadata("list", prefix or "-", lambda: self.inner.list(prefix), read=True)

    def size(self, key: str) -> int:
        return self._metadata("head", key, lambda: self.inner.size(key), read=True)

    def stat(self, key: str) -> ObjectStat:
        return self._metadata("head", key, lambda: self.inner.stat(key), read=True)

    def delete(self, keys: Iterable[str]) -> None:
        keys = list(keys)
        self._metadata("delete", keys[0] if keys else "-", lambda: self.inner.delete(keys))

    def list_incomplete(self, prefix: str = "") -> builtins.list[str]:
        return self.inner.list_incomplete(prefix)

    def cleanup_incomplete(self, prefix: str = "", *, older_than: float = 0.0) -> int:
        return self.inner.cleanup_incomplete(prefix, older_than=older_than)

    # -- what the suite records: the emulated service's figures, the wrapped store's local facts
    def describe(self) -> StoreInfo:
        inner = self.inner.describe()
        return StoreInfo(
            self.name,
            request_size=self.part_size,
            streams=self.streams,
            emulated=True,
            local_path=inner.local_path,
            cold_reads=self._cold_reads,
        )

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self.inner.close()
