"""The steps under a root over time: listing, retention, deletion, garbage collection.

- Retention retires (:func:`ckptio.lease.retire`) all but the newest ``keep_last`` committed
  steps after a commit: the manifest goes first, so the step stops existing at once, and its
  data stays ``grace`` seconds for readers that opened it just before.
- Garbage collection (:func:`collect_garbage`, and the sweep after each retention) removes
  debris of interrupted or losing saves and the data of retired steps. It never touches a
  committed checkpoint's objects nor a step whose save holds a live lease (judged by the
  storage's clock), and before removing anything of a step it publishes a fence there and
  lists the step again (:func:`_fenced_delete`): a save that committed meanwhile keeps its data,
  and one that commits later finds the fence and withdraws (see :mod:`ckptio.lease`)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from ckptio import errors
from ckptio import format as fmt
from ckptio.checkpoint.read import committed_steps, read_manifest
from ckptio.lease import (
    RETIRE_GRACE_SECONDS,
    TEMP_MIN_AGE_SECONDS,
    Fence,
    LeaseInfo,
    StorageClock,
    is_holder_key,
    is_lease_key,
    read_lease,
    retire,
    retired_age,
    retired_key,
)
from ckptio.store import Store, is_key

log = logging.getLogger(__name__)

__all__ = [
    "StepInfo",
    "collect_garbage",
    "delete_step",
    "doomed_steps",
    "list_steps",
    "retain",
    "retire_newer",
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
    state: str = "incomplete"
    """``complete``; ``damaged`` (its manifest does not validate, or names an object that is
    missing or of another size: loads skip it); ``saving`` (a save holds it); ``retired``;
    ``incomplete`` (no manifest: an interrupted save's debris)."""


def list_steps(store: Store) -> list[StepInfo]:
    """Every step under the root, committed or not, with its size (for ``ckptio ls``). A step
    is complete when its manifest validates and every object it names is there with the size
    it declares; a save in flight is judged by this host's clock (nothing is written)."""
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

    clock = StorageClock(store, probe=False)
    out = []
    for step, keys in sorted(by_step.items()):
        sizes = {k: size(k) for k in keys}
        info = StepInfo(step, False, sum(sizes.values()), len(keys))
        if fmt.manifest_key(step) in keys:
            try:
                m = read_manifest(store, step)
                info.created = m.created
                info.problem = _damage(step, m.objects, sizes)
            except errors.CkptioError as err:
                info.problem = str(err)
            info.complete = not info.problem
            info.state = "damaged" if info.problem else "complete"
        elif live := _live_holders(store, keys, clock):
            info.state = "saving"
            info.problem = "save in progress (" + ", ".join(lease.holder() for lease in live) + ")"
        elif retired_key(step) in keys:
            info.state = "retired"
            info.problem = "retired by retention (its data stays for readers, then gc removes it)"
        else:
            info.problem = "no manifest (incomplete or interrupted save)"
        out.append(info)
    return out


def _damage(step: int, objects: Mapping[str, int], sizes: Mapping[str, int]) -> str:
    """What is wrong with the objects a manifest of ``step`` names, given the listed keys'
    ``sizes``: the first missing or mis-sized one, or empty."""
    prefix = fmt.step_dir(step) + "/"
    missing = [k for k in objects if prefix + k not in sizes]
    if missing:
        return f"{len(missing)} object(s) missing, e.g. {prefix}{missing[0]}"
    wrong = [k for k, n in objects.items() if sizes[prefix + k] != n]
    if wrong:
        k = wrong[0]
        return f"{prefix}{k} is {sizes[prefix + k]} bytes, the manifest says {objects[k]}"
    return ""


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


def retire_newer(store: Store, step: int, *, keep: Iterable[int] = ()) -> list[int]:
    """After a resume restored ``step`` as the newest step complete for every rank, the
    committed steps newer than it on this fast root (``keep`` aside) belong to a step some
    rank's data of which is gone everywhere (a node lost before the step was drained or
    copied): retired, with a warning each, so that the resumed run saves those step numbers
    afresh instead of finding them taken. Returns the steps retired."""
    keep = set(keep)
    gone = [s for s in committed_steps(store) if s > step and s not in keep]
    for s in gone:
        log.warning(
            "step %d on %s is not complete anywhere for every rank (a node was lost before "
            "it was drained or copied): retired; the run resumes from step %d",
            s,
            store.url,
            step,
        )
        retire(store, s)
    return gone


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
    ``unfinished``, of any step without a manifest, and temp files / open multipart uploads
    older than ``older_than`` seconds (of any age under a step whose save's lease is dead:
    that save was killed). Before removing anything of a step it publishes a fence there and
    lists the step again (:func:`_fenced_delete`), so a save that started or committed
    meanwhile keeps its data and one that commits later withdraws. Returns the keys removed
    (with ``dry_run``, that would be removed: judged on one listing, no fence).
    """
    return _sweep(
        store,
        before_step=before_step,
        older_than=older_than,
        unfinished=unfinished,
        dry_run=dry_run,
        grace=grace,
    ).removed


def _named(store: Store, step: int) -> set[str] | None:
    """The keys a committed step keeps (its manifest, its objects, its retirement mark); None
    if the manifest is damaged or refused (left for a person to look at) or gone meanwhile
    (retired: judged as such on the next sweep)."""
    try:
        manifest = read_manifest(store, step)
    except (errors.CorruptCheckpointError, PermissionError, FileNotFoundError):
        return None
    prefix = fmt.step_dir(step) + "/"
    return {prefix + k for k in manifest.objects} | {fmt.manifest_key(step), retired_key(step)}


def _fenced_delete(
    store: Store, step: int, stray: list[str], listed: list[str], clock: StorageClock
) -> tuple[list[str], list[LeaseInfo]]:
    """Delete ``stray`` (keys of ``step``, from the listing ``listed``) under a fence: publish
    the fence, list the step again, and delete only if no live lease or other gc holds it and
    no manifest appeared (a committed step: only what its manifest, read again, does not name);
    the fence goes last. Returns the keys deleted and the live holders that stopped it.

    The fence is published *before* the step is listed again, and a save lists its step only
    *after* publishing its manifest, so one of the two sees the other (see :mod:`ckptio.lease`).
    Costs one PUT and one DELETE (the fence) and one LIST per step with something to delete."""
    prefix = fmt.step_dir(step) + "/"
    mkey = fmt.manifest_key(step)
    with Fence(store, step) as fence:
        now = [k for k in store.list(prefix) if k != fence.key]
        holders = _live_holders(store, now, clock)
        if holders:
            return [], holders
        if mkey in now:
            if mkey not in listed:
                return [], []  # committed since the listing: its own sweep judges it
            keep = _named(store, step)  # read again: a save may have replaced it
            if keep is None:
                return [], []
            stray = [k for k in stray if k not in keep]
        stray = [k for k in stray if k in now]  # (a save's lease, say, released meanwhile)
        if stray:
            store.delete(stray)
    return stray, []


@dataclass
class _Sweep:
    removed: list[str]
    live: list[LeaseInfo]
    """Leases of saves in flight (every step; not the fences of other gcs)."""


def _live_holders(
    store: Store, keys: Iterable[str], clock: StorageClock, gone: set[str] | None = None
) -> list[LeaseInfo]:
    """The live leases and fences among ``keys`` (saves in flight, gcs deleting); those
    removed since ``keys`` were listed are added to ``gone``."""
    live = []
    for key in filter(is_holder_key, keys):
        info = read_lease(store, key)
        if info is None:
            if gone is not None:
                gone.add(key)
        elif info.live(clock):
            live.append(info)
    return live


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
    clock = StorageClock.of(store)
    removed: list[str] = []
    live: list[LeaseInfo] = []
    busy = False  # a save or another gc holds some step: temp files only under quiet steps
    quiet: list[str] = []  # prefixes of steps with no save in flight
    over: list[str] = []  # quiet prefixes with a dead lease: their saves ended (killed)
    for s, listed in sorted(by_step.items()):
        prefix = fmt.step_dir(s) + "/"
        released: set[str] = set()  # leases removed since the listing (a save just committed)
        holders = _live_holders(store, listed, clock, released)
        keys = [k for k in listed if k not in released]
        if holders:
            live.extend(h for h in holders if is_lease_key(h.key))
            busy = True
            continue
        quiet.append(prefix)
        if any(map(is_lease_key, keys)):
            over.append(prefix)
        mkey = fmt.manifest_key(s)
        if mkey in keys:
            keep = _named(store, s)
            if keep is None:
                continue
            stray = [k for k in keys if k not in keep]
        else:
            age = retired_age(store, s, clock) if retired_key(s) in keys else None
            if age is not None:
                if age < grace:
                    continue
            elif not (
                unfinished or (limit is not None and s < limit) or any(map(is_holder_key, keys))
            ):
                continue  # may be a save in flight; a dead lease proves its save is over
            stray = keys
        if not stray:
            continue
        if dry_run:
            removed.extend(stray)
            continue
        gone, again = _fenced_delete(store, s, stray, keys, clock)
        if again:
            live.extend(h for h in again if is_lease_key(h.key))
            busy = True
        removed.extend(gone)
    if not dry_run:
        # temp files and open uploads: under every step when no save is in flight (that also
        # reaches steps with no listed object), else under the quiet steps only
        for prefix in quiet if busy else ["step-"]:
            store.cleanup_incomplete(prefix, older_than=max(older_than, temp_min_age))
        # the temp files of a save whose lease is dead (a killed save) are debris at any age;
        # the leases are listed once more first, as above
        for prefix in over:
            if max(older_than, temp_min_age) > 0 and not _live_holders(
                store, store.list(prefix), clock
            ):
                store.cleanup_incomplete(prefix)
    return _Sweep(removed, live)
