"""The steps under a root over time: listing, retention, deletion, garbage collection.

- Retention retires (:func:`ckptio.lease.retire`) all but the newest ``keep_last`` committed
  steps after a commit: the manifest goes first, so the step stops existing at once, and its
  data stays ``grace`` seconds for readers that opened it just before.
- Garbage collection (:func:`collect_garbage`, and the sweep after each retention) removes
  debris of interrupted or losing saves and the data of retired steps. It never touches a
  committed checkpoint's objects nor a step whose save holds a live lease, and it lists the
  leases and checks the manifest again just before removing anything of a step."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from ckptio import errors
from ckptio import format as fmt
from ckptio.checkpoint.read import committed_steps, read_manifest
from ckptio.lease import (
    RETIRE_GRACE_SECONDS,
    TEMP_MIN_AGE_SECONDS,
    LeaseInfo,
    is_lease_key,
    read_lease,
    retire,
    retired_at,
    retired_key,
)
from ckptio.store import Store, is_key

__all__ = [
    "StepInfo",
    "collect_garbage",
    "delete_step",
    "doomed_steps",
    "list_steps",
    "retain",
]


@dataclass
class StepInfo:
    step: int
    complete: bool
    """Has a manifest that validates."""
    nbytes: int
    """Bytes of all objects under the step."""
    objects: int
    created: str = ""
    problem: str = ""


def list_steps(store: Store) -> list[StepInfo]:
    """Every step under the root, committed or not, with its size (for ``ckptio ls``)."""
    by_step: dict[int, list[str]] = {}
    for key in filter(is_key, store.list("step-")):  # not a foreign key (a folder marker)
        step = fmt.parse_step_dir(key.partition("/")[0])
        if step is not None:
            by_step.setdefault(step, []).append(key)

    def size(key: str) -> int:
        try:
            return store.size(key)
        except (FileNotFoundError, PermissionError):  # deleted meanwhile, or refused
            return 0

    out = []
    for step, keys in sorted(by_step.items()):
        nbytes = sum(map(size, keys))
        info = StepInfo(step, False, nbytes, len(keys))
        if fmt.manifest_key(step) in keys:
            try:
                m = read_manifest(store, step)
                info.complete, info.created = True, m.created
            except errors.CkptioError as err:
                info.problem = str(err)
        elif live := _live_leases(store, keys, time.time()):
            info.problem = "save in progress (" + ", ".join(lease.holder() for lease in live) + ")"
        elif retired_key(step) in keys:
            info.problem = "retired by retention (its data stays for readers, then gc removes it)"
        else:
            info.problem = "no manifest (incomplete or interrupted save)"
        out.append(info)
    return out


def doomed_steps(steps: Sequence[int], newest: int, keep_last: int | None) -> list[int]:
    """Of the committed ``steps`` (ascending), those retention retires after a commit of
    ``newest``: all but the newest ``keep_last`` up to ``newest`` (none with ``None``)."""
    return [s for s in steps if s <= newest][:-keep_last] if keep_last else []


def retain(
    store: Store,
    newest: int,
    keep_last: int | None,
    *,
    grace: float = RETIRE_GRACE_SECONDS,
    doomed: Callable[[Sequence[int], int], list[int]] | None = None,
) -> _Sweep:
    """Retention and debris after a commit of ``newest`` (every Checkpointer and the DCP
    writer): retire the committed steps ``doomed`` names (default :func:`doomed_steps`), then
    sweep debris as :func:`collect_garbage` does with ``before_step=newest``, leaving temp
    files younger than :data:`~ckptio.lease.TEMP_MIN_AGE_SECONDS`."""
    steps = committed_steps(store)
    for s in doomed(steps, newest) if doomed else doomed_steps(steps, newest, keep_last):
        retire(store, s)
    return _sweep(store, before_step=newest, grace=grace, temp_min_age=TEMP_MIN_AGE_SECONDS)


def delete_step(store: Store, step: int) -> None:
    """Delete one checkpoint: the manifest first (so it stops existing at once), then data."""
    prefix = fmt.step_dir(step) + "/"
    store.delete([fmt.manifest_key(step)])
    store.delete([k for k in store.list(prefix) if is_key(k)])
    store.cleanup_incomplete(prefix)


def collect_garbage(
    store: Store,
    *,
    before_step: int | None = None,
    older_than: float = 0.0,
    unfinished: bool = False,
    dry_run: bool = False,
    grace: float = RETIRE_GRACE_SECONDS,
) -> list[str]:
    """Remove debris of interrupted or losing saves and the data of retired steps; never
    touches a committed checkpoint nor a save in flight.

    Nothing is removed under a step while a save holds a live lease there (see
    :mod:`ckptio.lease`): not its data, not a competing save's, not temp files or open uploads.
    Elsewhere it removes: objects under a committed step that its manifest does not name (a
    losing concurrent save), leases of dead saves, the data of a step retired by retention more
    than ``grace`` seconds ago, every object of a step without a manifest whose save's lease is
    dead, or that is older than ``before_step`` (default: the newest committed step), or, with
    ``unfinished``, of any step without a manifest, and temp files / open multipart uploads older than ``older_than``
    seconds (of any age under a step whose save's lease is dead: that save was killed). Before removing anything of a step it lists the step's leases again and checks its
    manifest once more, so a save that started or committed meanwhile keeps its data. Returns
    the keys removed (with ``dry_run``, that would be removed).
    """
    return _sweep(
        store,
        before_step=before_step,
        older_than=older_than,
        unfinished=unfinished,
        dry_run=dry_run,
        grace=grace,
    ).removed


@dataclass
class _Sweep:
    removed: list[str]
    live: list[LeaseInfo]
    """Leases of saves in flight (every step)."""


def _live_leases(store: Store, keys: Iterable[str], now: float) -> list[LeaseInfo]:
    infos = (read_lease(store, k) for k in keys if is_lease_key(k))
    return [i for i in infos if i is not None and i.live(now)]


def _sweep(
    store: Store,
    *,
    before_step: int | None = None,
    older_than: float = 0.0,
    unfinished: bool = False,
    dry_run: bool = False,
    grace: float = RETIRE_GRACE_SECONDS,
    temp_min_age: float = 0.0,
) -> _Sweep:
    """:func:`collect_garbage`, also returning the live leases. ``temp_min_age``: temp files and
    uploads younger than this are left under steps without a dead lease, whatever
    ``older_than`` says (retention passes :data:`~ckptio.lease.TEMP_MIN_AGE_SECONDS`: it runs
    beside other jobs' saves, whose lease is itself a temp file for an instant)."""
    by_step: dict[int, list[str]] = {}
    for key in filter(is_key, store.list("step-")):  # foreign keys are left alone
        s = fmt.parse_step_dir(key.partition("/")[0])
        if s is not None:
            by_step.setdefault(s, []).append(key)
    committed = [s for s, keys in by_step.items() if fmt.manifest_key(s) in keys]
    limit = before_step if before_step is not None else max(committed, default=None)
    now = time.time()
    removed: list[str] = []
    live: list[LeaseInfo] = []
    quiet: list[str] = []  # prefixes of steps with no save in flight
    over: list[str] = []  # quiet prefixes with a dead lease: their saves ended (killed)
    for s, keys in sorted(by_step.items()):
        prefix = fmt.step_dir(s) + "/"
        leases = _live_leases(store, keys, now)
        if leases:
            live.extend(leases)
            continue
        quiet.append(prefix)
        if any(map(is_lease_key, keys)):
            over.append(prefix)
        mkey = fmt.manifest_key(s)
        if mkey in keys:
            try:
                manifest = read_manifest(store, s)
            except (errors.CorruptCheckpointError, PermissionError):
                continue  # damaged or refused: leave it for a person to look at
            except FileNotFoundError:
                manifest = None  # retired meanwhile: judged as such on the next sweep
            if manifest is None:
                continue
            keep = {prefix + k for k in manifest.objects} | {mkey, retired_key(s)}
            stray = [k for k in keys if k not in keep]
        else:
            when = retired_at(store, s) if retired_key(s) in keys else None
            if when is not None:
                if now - when < grace:
                    continue
            elif not (
                unfinished or (limit is not None and s < limit) or any(map(is_lease_key, keys))
            ):
                continue  # may be a save in flight; a dead lease proves its save is over
            stray = keys
        # a save may have started (its lease listed after its first data) or committed since
        # the listing: its lease is published before its data, the manifest before its lease
        # is removed, so leases are listed again first and the manifest checked after them
        again = _live_leases(store, store.list(prefix), time.time())
        if again:
            live.extend(again)
            continue
        if mkey not in keys and store.exists(mkey):
            continue
        if stray and not dry_run:
            store.delete(stray)
        removed.extend(stray)
    if not dry_run:
        # temp files and open uploads: under every step when no save is in flight (that also
        # reaches steps with no listed object), else under the quiet steps only
        for prefix in quiet if live else ["step-"]:
            store.cleanup_incomplete(prefix, older_than=max(older_than, temp_min_age))
        # the temp files of a save whose lease is dead (a killed save) are debris at any age;
        # the leases are listed once more first, as above
        for prefix in over:
            if max(older_than, temp_min_age) > 0 and not _live_leases(
                store, store.list(prefix), time.time()
            ):
                store.cleanup_incomplete(prefix)
    return _Sweep(removed, live)
