"""Save leases, gc fences and retirement marks: how saves, readers, retention and gc share one
root.

The commit protocol (the manifest, written last) says when a checkpoint *exists*. This module
says when the data of a step that has no manifest may be *deleted*, and makes sure a save whose
data was deleted under it never returns OK, the same way on POSIX and on object stores, with
nothing but ``publish``/``get``/``stat``/``list``/``delete`` and read-after-write consistency
(every request sees what completed before it started: POSIX, S3 since December 2020, Ceph RGW
within one zone). It needs no create-if-absent and no agreement between clocks.

- **A save holds a lease.** Before any rank writes data, the committing rank publishes
  ``step-<N>/saving-<token>.json`` (host, process, lease length; visible at once, not made
  durable: :meth:`~ckptio.store.Store.publish_transient`) and re-publishes it every
  :data:`REFRESH_SECONDS` while the save runs; it removes it once the commit is decided. While
  a live lease is under a step, gc and retention delete nothing there.
- **A lease is live** while it was re-published less than its lease length
  (:data:`LEASE_SECONDS`) ago *by the storage's clock*: the age is the storage's time now (a
  :class:`StorageClock`: an object the judge publishes once and reads back, carried on by the
  judge's monotonic clock) less the lease object's own last-write time
  (:attr:`~ckptio.store.ObjectStat.modified`), two stamps of one clock. Neither the holder's
  clock nor the judge's enters, so hosts minutes apart judge alike. Judged on the host that
  holds it, a lease is live exactly while the holding process runs (a SIGKILLed save is dead at
  once there). A backend that reports no write time falls back to the holder's heartbeat
  against the judge's clock.
- **gc fences before it deletes; a save checks after it publishes.** Before deleting anything
  under a step, gc (and retention's sweep) publishes a fence ``step-<N>/fence-<token>.json``
  and only then lists the step again: if a manifest or a live lease appeared, it deletes
  nothing. It removes the fence after its deletes, last. A save publishes its manifest and only
  then lists its step (the one listing a commit makes): if a fence is there, or an object the
  manifest names is missing, it withdraws (deletes) the manifest and fails. Each side writes its
  flag and then reads the other's, so they cannot both go on (Dekker's argument): either gc sees
  the manifest and spares the step, or the save sees the fence, or the missing object, and does
  not return OK. A pause anywhere (SIGSTOP, swap, a stalled host) changes which side backs off,
  never that one does. A manifest that names a missing object can be visible between its
  publish and its withdrawal; a reader that meets it falls back to an older step
  (:func:`ckptio.load`).
- **A fence is a lease too**, held by gc for the few requests its deletes take: a gc killed
  between its fence and its deletes leaves a dead fence, removed as debris by the next sweep
  of that step (a save of that step meanwhile fails, safely).
- **Retention retires, then deletes.** Retention publishes ``step-<N>/retired.json`` and then
  removes the manifest, so the checkpoint stops existing at once but its data stays for
  :data:`RETIRE_GRACE_SECONDS` (by the clock that stamped the mark on the host that retired
  it, by the storage's elsewhere): a reader that opened it just before finishes. gc then
  removes the data, fenced like any other delete.

Where it ends: the storage's clock is the one that stamps an object's write time; on
filesystems whose clients stamp mtime themselves (Lustre, CephFS) that is the writing host's,
so there a skewed host can make a live lease look dead (a save then fails, safely) or a dead
one live (its debris waits). Listings must be read-after-write consistent: an NFS client that
caches directory listings (the default attribute cache) can miss a fence. A gc paused for
longer than a lease *between its fence and its deletes*, while another gc judges its fence dead
and removes it and a new save of the same step commits objects of the very same names (only
re-drains of a tiered step reuse names), could still delete under that save.

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
import weakref
from dataclasses import dataclass
from typing import Any, Self

from ckptio import format as fmt
from ckptio.store import Store

log = logging.getLogger(__name__)

__all__ = [
    "CLOCK_PREFIX",
    "LEASE_SECONDS",
    "REFRESH_SECONDS",
    "RETIRE_GRACE_SECONDS",
    "TEMP_MIN_AGE_SECONDS",
    "Fence",
    "LeaseInfo",
    "SaveLease",
    "StorageClock",
    "is_fence_key",
    "is_holder_key",
    "is_lease_key",
    "read_lease",
    "retire",
    "retired_age",
]

LEASE_SECONDS = 300.0
"""Seconds a lease stays live after its last refresh, judged from another host by the
storage's clock. Long enough that a saver stalled by a slow storage or a busy host keeps its
data; a crashed saver's debris waits this long for gc (on its own host it is collectable at
once)."""

REFRESH_SECONDS = 15.0
"""Seconds between a saver's heartbeats (each one re-publishes its lease object)."""

RETIRE_GRACE_SECONDS = 60.0
"""Seconds the data of a step retired by retention stays for readers that opened it before."""

TEMP_MIN_AGE_SECONDS = 60.0
"""Seconds: retention leaves temp files and uploads younger than this under steps with no dead
lease. It runs beside other jobs' saves, and a save's lease is a temp file for the instant
before it is published (removing it would fail that save at its start). A killed save's temp
files sit beside its dead lease and go at any age; ``ckptio gc --older-than`` is literal."""

CLOCK_PREFIX = "ckptio-clock-"
"""A :class:`StorageClock` reads the storage's time from an object it publishes at the root,
``ckptio-clock-<token>.json`` (a few bytes, outside every step, so no listing of steps meets
it), and deletes at once."""

CLOCK_REPROBE_SECONDS = 3600.0
"""Seconds a process carries the storage's time on by its monotonic clock before it reads it
again (their rates differ by well under 0.1 s an hour on an NTP-disciplined host)."""

LEASE_PREFIX = "saving-"
FENCE_PREFIX = "fence-"
RETIRED_NAME = "retired.json"
_KIND = "ckptio-save-lease"
_FENCE_KIND = "ckptio-gc-fence"
_MAX_LEASE_BYTES = 4096


def _step_key(step: int, prefix: str, token: str) -> str:
    return f"{fmt.step_dir(step)}/{prefix}{token}.json"


def retired_key(step: int) -> str:
    return f"{fmt.step_dir(step)}/{RETIRED_NAME}"


def _in_step(key: str, prefix: str) -> bool:
    _head, _, tail = key.partition("/")
    return tail.startswith(prefix) and tail.endswith(".json") and "/" not in tail


def is_lease_key(key: str) -> bool:
    """``step-…/saving-<token>.json`` (a save's lease, not data)."""
    return _in_step(key, LEASE_PREFIX)


def is_fence_key(key: str) -> bool:
    """``step-…/fence-<token>.json`` (a gc's fence, not data)."""
    return _in_step(key, FENCE_PREFIX)


def is_holder_key(key: str) -> bool:
    """A lease or a fence: an object that holds its step for a process while it is live."""
    return is_lease_key(key) or is_fence_key(key)


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


class StorageClock:
    """The storage's clock, as one judge of leases sees it.

    On the first :meth:`now` that needs it (a lease or mark written on another host), it
    publishes an object (:data:`CLOCK_PREFIX`), reads back its write time and deletes it (three
    requests, once per process and store an hour: :meth:`of`), then carries that time on by
    this process's monotonic clock. A read-only root, or a backend that reports no
    write time, leaves it on this host's clock (:attr:`exact` False). ``probe=False`` (a
    read-only look, ``ckptio ls``) never writes and uses this host's clock."""

    def __init__(self, store: Store, *, probe: bool = True) -> None:
        self.store = store
        self._probe = probe and store.capabilities.shared
        self._base: tuple[float, float] | None = None  # (storage time, monotonic) at the probe
        self.exact = False

    @classmethod
    def of(cls, store: Store) -> StorageClock:
        """The clock of ``store`` for this process: one per store object, probed again after
        :data:`CLOCK_REPROBE_SECONDS` (a job's retention after every save probes about once
        an hour, not once a save)."""
        with _CLOCKS_LOCK:
            clock = _CLOCKS.get(store)
            if clock is None or clock.stale():
                clock = _CLOCKS[store] = cls(store)
            return clock

    def stale(self) -> bool:
        return self._base is not None and time.monotonic() - self._base[1] > CLOCK_REPROBE_SECONDS

    def now(self) -> float:
        """Unix seconds by the storage's clock (never later than the storage's own now)."""
        if self._base is None:
            self._base = self._read()
        storage, mono = self._base
        return storage + (time.monotonic() - mono)

    def _read(self) -> tuple[float, float]:
        if self._probe:
            key = f"{CLOCK_PREFIX}{secrets.token_hex(4)}.json"
            try:
                self.store.publish_transient(key, json.dumps({"host": _HOST}).encode())
                try:
                    modified = self.store.stat(key).modified
                    # anchored after the stat returned: the write time lies before it, so
                    # ages measured from here are never overstated
                    anchor = time.monotonic()
                finally:
                    self.store.delete([key])
                if modified is not None:
                    self.exact = True
                    return modified, anchor
            except Exception as err:  # a read-only root: judged by this host's clock
                log.debug("cannot read the storage's clock of %s: %s", self.store.url, err)
        return time.time(), time.monotonic()


_CLOCKS: weakref.WeakKeyDictionary[Store, StorageClock] = weakref.WeakKeyDictionary()
_CLOCKS_LOCK = threading.Lock()


@dataclass(frozen=True)
class LeaseInfo:
    """A lease (or a fence) as read back: who holds it and when it was last written."""

    key: str
    step: int
    token: str
    host: str
    pid: int
    heartbeat: float
    """Unix time of the last refresh, by the holder's clock (used only where the storage
    reports no write time)."""
    lease_seconds: float
    boot_id: str = ""
    start_ticks: int | None = None
    modified: float | None = None
    """Unix time of the last refresh by the storage's clock (:meth:`Store.stat`)."""
    purpose: str = ""
    """What holds it: ``save``, ``run`` (a benchmark run's save: :mod:`ckptio.runner`), ``gc``."""

    def live(self, clock: StorageClock | None = None) -> bool:
        """Whether the process holding it may still be running (see the module docstring):
        on its own host, whether it runs; elsewhere, whether it was refreshed less than a
        lease ago by the storage's clock (``clock``; this host's clock without one)."""
        if (
            self.host == _HOST
            and self.boot_id
            and self.boot_id == _BOOT
            and self.start_ticks is not None
        ):
            return _start_ticks(self.pid) == self.start_ticks
        if self.modified is not None:
            now = clock.now() if clock is not None else time.time()
            return now - self.modified < self.lease_seconds
        return time.time() - self.heartbeat < self.lease_seconds

    def holder(self) -> str:
        return f"pid {self.pid} on {self.host}"

    def mine(self) -> bool:
        """Held by this process."""
        return self.host == _HOST and self.pid == os.getpid() and self.boot_id == _BOOT


def read_lease(store: Store, key: str) -> LeaseInfo | None:
    """The lease or fence at ``key``; None if it is gone. One that does not parse (not one of
    ours, or damaged) reads as a dead one, so it never blocks gc."""
    step = fmt.parse_step_dir(key.partition("/")[0]) or 0
    dead = LeaseInfo(key, step, "", "?", 0, 0.0, 0.0)
    try:
        st = store.stat(key)
        if st.size > _MAX_LEASE_BYTES:
            return dead
        data = store.get(key)
    except FileNotFoundError:
        return None
    try:
        doc = json.loads(data)
        if not isinstance(doc, dict) or doc.get("kind") not in (_KIND, _FENCE_KIND):
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
            st.modified,
            str(doc.get("purpose", "")),
        )
    except (ValueError, KeyError, TypeError):
        return dead


class _Held:
    """An object that holds a step for this process while it is live (see the module
    docstring): published by :meth:`acquire`, re-published every ``refresh_seconds`` by a
    daemon thread, removed by :meth:`release`."""

    prefix = LEASE_PREFIX
    kind = _KIND
    purpose = "save"

    def __init__(
        self,
        store: Store,
        step: int,
        token: str | None = None,
        *,
        lease_seconds: float | None = None,
        refresh_seconds: float | None = None,
        purpose: str | None = None,
    ) -> None:
        self.store = store
        self.step = step
        self.purpose = purpose or self.purpose
        self.token = token or secrets.token_hex(4)
        self.key = _step_key(step, self.prefix, self.token)
        self.lease_seconds = LEASE_SECONDS if lease_seconds is None else lease_seconds
        self.refresh_seconds = REFRESH_SECONDS if refresh_seconds is None else refresh_seconds
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _doc(self) -> bytes:
        return json.dumps(
            {
                "kind": self.kind,
                "version": 1,
                "step": self.step,
                "token": self.token,
                "host": _HOST,
                "boot_id": _BOOT,
                "pid": os.getpid(),
                "start_ticks": _start_ticks(os.getpid()),
                "heartbeat": time.time(),
                "lease_seconds": self.lease_seconds,
                "purpose": self.purpose,
            }
        ).encode()

    def _publish(self) -> None:
        # visible at once, not durable: only processes that run beside it read it, and a
        # crash ends its holder (the store still makes the step's directories durable)
        self.store.publish_transient(self.key, self._doc())

    def acquire(self) -> Self:
        self._publish()  # a failure here fails the holder before it does anything
        self._thread = threading.Thread(target=self._run, name="ckptio-lease", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.refresh_seconds):
            try:
                self._publish()
            except Exception as err:  # the lease may lapse: gc may fence the step, whose
                # commit then fails (a save) or which is then another gc's (a fence)
                log.warning("could not refresh %s: %s", self.key, err)

    def release(self) -> None:
        """Stop refreshing and remove it (once; later calls do nothing)."""
        if self._stop.is_set():
            return
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        self._thread = None
        try:
            self.store.delete([self.key])
        except Exception as err:  # a dead one left behind is debris that gc removes
            log.warning("could not remove %s: %s", self.key, err)

    def __enter__(self) -> Self:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


class SaveLease(_Held):
    """The lease of one save of ``step``, held by the process that commits it.

    ``acquire`` publishes it (before any data is written), a daemon thread refreshes it, and
    ``release`` removes it (after the commit is decided). It keeps gc and retention off the
    step while it is live; a save that loses it (paused past it) is caught by the fence check
    after its manifest is published (:func:`ckptio.checkpoint.commit.publish_manifest`)."""


class Fence(_Held):
    """A gc's fence on ``step``: published before it lists the step a last time and deletes,
    removed after its deletes. A save that finds one after publishing its manifest withdraws
    it (see the module docstring)."""

    prefix = FENCE_PREFIX
    kind = _FENCE_KIND
    purpose = "gc"


def retire(store: Store, step: int) -> None:
    """Retention's delete of a committed step: mark it retired, then remove its manifest; its
    data stays for :data:`RETIRE_GRACE_SECONDS` (gc removes it after)."""
    mark = {"retired": time.time(), "host": _HOST, "boot_id": _BOOT}
    store.publish(retired_key(step), json.dumps(mark).encode(), overwrite=True)
    store.delete([fmt.manifest_key(step)])


def retired_age(store: Store, step: int, clock: StorageClock) -> float | None:
    """Seconds since the step was retired: by this host's clock when this host retired it
    (the clock that stamped the mark), else by the storage's (the mark's write time against
    ``clock``; the retiring host's stamp where the store reports no write time). None if not
    retired (or the mark is gone); a mark that does not parse reads as retired long ago (it
    blocks nothing)."""
    key = retired_key(step)
    try:
        st = store.stat(key)
        data = store.get(key) if st.size <= _MAX_LEASE_BYTES else b""
    except FileNotFoundError:
        return None
    with contextlib.suppress(ValueError, TypeError, AttributeError, KeyError):
        doc: Any = json.loads(data)
        when = float(doc["retired"])
        if st.modified is None or (doc.get("host") == _HOST and doc.get("boot_id") == _BOOT):
            return time.time() - when
        return clock.now() - st.modified
    return float("inf")
