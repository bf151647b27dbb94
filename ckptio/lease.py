"""Save leases and retirement marks: how saves, readers, retention and gc share one root.

The commit protocol (the manifest, written last) says when a checkpoint *exists*. This module
says when the data of a step that has no manifest may be *deleted*, the same way on POSIX and
on object stores, with nothing but ``publish``/``get``/``list``/``delete``:

- **A save holds a lease.** Before any rank writes data, the committing rank publishes
  ``step-<N>/saving-<token>.json`` (host, process, heartbeat time, lease length; visible at
  once, not made durable: :meth:`~ckptio.store.Store.publish_transient`) and refreshes
  it every :data:`REFRESH_SECONDS` while the save runs; it removes it after the manifest is
  published (or the save's data is discarded). While a live lease is under a step, gc and
  retention delete nothing under that step but its own debris-free lease files: not the data
  of the save (committed or not), not a competing save's data, not temp files or open uploads.
- **A lease is live** while its heartbeat is younger than its lease length (:data:`LEASE_SECONDS`)
  by the clock of whoever judges it, or, judged on the host that holds it, exactly while the
  holding process runs (a SIGKILLed save is dead at once there, not after the lease runs out).
- **A save that lost its lease does not commit.** Before publishing the manifest the saver
  checks that its last successful refresh is younger than half the lease (so clocks may differ
  by up to that much between the saver and a gc elsewhere) and that every object the manifest
  names is listed; otherwise the save fails and publishes nothing.
- **Retention retires, then deletes.** Retention publishes ``step-<N>/retired.json`` and then
  removes the manifest, so the checkpoint stops existing at once but its data stays for
  :data:`RETIRE_GRACE_SECONDS`: a reader that opened it just before finishes. gc removes a
  retired step's objects once its mark is older than the grace. A reader that still finds an
  object gone (a slower one) re-lists and falls back to the newest complete step.

Why not a lock: object stores have no locks, and a lease that expires cannot wedge a root
after a crash; the liveness check on the holder's own host makes a killed save's debris
collectable at once there.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

from ckptio import errors
from ckptio import format as fmt
from ckptio.store import Store

log = logging.getLogger(__name__)

__all__ = [
    "LEASE_SECONDS",
    "REFRESH_SECONDS",
    "RETIRE_GRACE_SECONDS",
    "TEMP_MIN_AGE_SECONDS",
    "LeaseInfo",
    "SaveLease",
    "is_lease_key",
    "read_lease",
    "retire",
    "retired_at",
]

LEASE_SECONDS = 300.0
"""Seconds a lease stays live after its last heartbeat, judged from another host. Long enough
that a saver stalled by a slow storage or a busy host keeps its data; a crashed saver's debris
waits this long for gc (on its own host it is collectable at once)."""

REFRESH_SECONDS = 15.0
"""Seconds between a saver's heartbeats (each one re-publishes its lease object)."""

RETIRE_GRACE_SECONDS = 60.0
"""Seconds the data of a step retired by retention stays for readers that opened it before."""

TEMP_MIN_AGE_SECONDS = 60.0
"""Seconds: retention leaves temp files and uploads younger than this under steps with no dead
lease. It runs beside other jobs' saves, and a save's lease is a temp file for the instant
before it is published (removing it would fail that save at its start). A killed save's temp
files sit beside its dead lease and go at any age; ``ckptio gc --older-than`` is literal."""

LEASE_PREFIX = "saving-"
RETIRED_NAME = "retired.json"
_KIND = "ckptio-save-lease"
_MAX_LEASE_BYTES = 4096


def lease_key(step: int, token: str) -> str:
    return f"{fmt.step_dir(step)}/{LEASE_PREFIX}{token}.json"


def retired_key(step: int) -> str:
    return f"{fmt.step_dir(step)}/{RETIRED_NAME}"


def is_lease_key(key: str) -> bool:
    """``step-…/saving-<token>.json`` (a lease, not data)."""
    _head, _, tail = key.partition("/")
    return tail.startswith(LEASE_PREFIX) and tail.endswith(".json") and "/" not in tail


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def _start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (with its pid, it names one process
    for the life of the machine: pids are reused, start times are not), None if it is gone or a
    zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 2 :].split()
    if not fields or fields[0] in (b"Z", b"X"):  # ended; not yet reaped by its parent
        return None
    return int(fields[19])


_HOST = socket.gethostname()
_BOOT = _boot_id()


def runs_here(host: str, pid: int) -> bool | None:
    """Whether process ``pid`` of ``host`` still runs: known only on that host (True or
    False), None for another host's process, which this one cannot see."""
    if host != _HOST:
        return None
    return _start_ticks(pid) is not None


@dataclass(frozen=True)
class LeaseInfo:
    """A lease as read back: who holds it and when it last beat."""

    key: str
    step: int
    token: str
    host: str
    pid: int
    heartbeat: float
    """Unix time of the last refresh, by the holder's clock."""
    lease_seconds: float
    boot_id: str = ""
    start_ticks: int | None = None

    def live(self, now: float | None = None) -> bool:
        """Whether the save holding it may still be running (see the module docstring)."""
        if (
            self.host == _HOST
            and self.boot_id
            and self.boot_id == _BOOT
            and self.start_ticks is not None
        ):
            return _start_ticks(self.pid) == self.start_ticks
        now = time.time() if now is None else now
        return now - self.heartbeat < self.lease_seconds

    def holder(self) -> str:
        return f"pid {self.pid} on {self.host}"

    def mine(self) -> bool:
        """Held by this process."""
        return self.host == _HOST and self.pid == os.getpid() and self.boot_id == _BOOT


def read_lease(store: Store, key: str) -> LeaseInfo | None:
    """The lease at ``key``; None if it is gone. A lease that does not parse (not one of ours,
    or damaged) reads as a dead one, so it never blocks gc."""
    step = fmt.parse_step_dir(key.partition("/")[0]) or 0
    dead = LeaseInfo(key, step, "", "?", 0, 0.0, 0.0)
    try:
        if store.size(key) > _MAX_LEASE_BYTES:
            return dead
        data = store.get(key)
    except FileNotFoundError:
        return None
    try:
        doc = json.loads(data)
        if not isinstance(doc, dict) or doc.get("kind") != _KIND:
            return dead
        ticks = doc.get("start_ticks")
        return LeaseInfo(
            key,
            step,
            str(doc["token"]),
            str(doc["host"]),
            int(doc["pid"]),
            float(doc["heartbeat"]),
            float(doc["lease_seconds"]),
            str(doc.get("boot_id", "")),
            int(ticks) if isinstance(ticks, int) else None,
        )
    except (ValueError, KeyError, TypeError):
        return dead


class SaveLease:
    """The lease of one save of ``step``, held by the process that commits it.

    ``acquire`` publishes it (before any data is written), a daemon thread refreshes it, and
    ``release`` removes it (after the manifest is published or the data discarded).
    :meth:`check` raises :class:`~ckptio.errors.SaveFailedError` if the lease may have lapsed:
    called before the commit, it keeps a save whose data gc may have taken from publishing.
    """

    def __init__(
        self,
        store: Store,
        step: int,
        token: str | None = None,
        *,
        lease_seconds: float | None = None,
        refresh_seconds: float | None = None,
    ) -> None:
        self.store = store
        self.step = step
        self.token = token or secrets.token_hex(4)
        self.key = lease_key(step, self.token)
        self.lease_seconds = LEASE_SECONDS if lease_seconds is None else lease_seconds
        self.refresh_seconds = REFRESH_SECONDS if refresh_seconds is None else refresh_seconds
        self._beat = 0.0  # time.monotonic() of the last successful publish
        self._error: BaseException | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _doc(self) -> bytes:
        return json.dumps(
            {
                "kind": _KIND,
                "version": 1,
                "step": self.step,
                "token": self.token,
                "host": _HOST,
                "boot_id": _BOOT,
                "pid": os.getpid(),
                "start_ticks": _start_ticks(os.getpid()),
                "heartbeat": time.time(),
                "lease_seconds": self.lease_seconds,
            }
        ).encode()

    def _publish(self) -> None:
        t = time.monotonic()
        # visible at once, not durable: only processes that run beside the save read it, and a
        # crash ends the save (the store still makes the step's directories durable)
        self.store.publish_transient(self.key, self._doc())
        self._beat = t

    def acquire(self) -> SaveLease:
        self._publish()  # a failure here fails the save before anything is written
        self._thread = threading.Thread(target=self._run, name="ckptio-lease", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.refresh_seconds):
            try:
                self._publish()
                self._error = None
            except Exception as err:  # judged by check(): a lapse fails the commit
                self._error = err
                log.warning(
                    "could not refresh the lease of the save of step %d: %s", self.step, err
                )

    def check(self) -> None:
        """Raise if the last successful refresh is older than half the lease."""
        age = time.monotonic() - self._beat
        if age >= self.lease_seconds / 2:
            cause = f" (last refresh failed: {self._error})" if self._error else ""
            raise errors.SaveFailedError(
                f"the save of step {self.step} held its lease {self.key} unrefreshed for {age:.0f} s "
                f"(lease {self.lease_seconds:.0f} s){cause}; a gc may have taken its data, so it "
                "does not commit"
            )

    def release(self) -> None:
        """Stop refreshing and remove the lease (once; later calls do nothing)."""
        if self._stop.is_set():
            return
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        self._thread = None
        try:
            self.store.delete([self.key])
        except Exception as err:  # a dead lease left behind is debris that gc removes
            log.warning("could not remove the lease %s: %s", self.key, err)

    def __enter__(self) -> SaveLease:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def retire(store: Store, step: int) -> None:
    """Retention's delete of a committed step: mark it retired, then remove its manifest; its
    data stays for :data:`RETIRE_GRACE_SECONDS` (gc removes it after)."""
    store.publish(retired_key(step), json.dumps({"retired": time.time()}).encode(), overwrite=True)
    store.delete([fmt.manifest_key(step)])


def retired_at(store: Store, step: int) -> float | None:
    """Unix time the step was retired; None if not retired (or the mark is gone). A mark that
    does not parse reads as retired long ago (it blocks nothing)."""
    try:
        if store.size(retired_key(step)) > _MAX_LEASE_BYTES:
            return 0.0
        data = store.get(retired_key(step))
    except FileNotFoundError:
        return None
    with contextlib.suppress(ValueError, TypeError, AttributeError, KeyError):
        doc: Any = json.loads(data)
        return float(doc["retired"])
    return 0.0
