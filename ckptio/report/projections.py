"""What each target would cost at full scale: one row per preset and target, every figure
with its interval or a statement of why it has none.

- A **measured** target is projected with the figures fitted from its steady rounds, pooled;
  each round is projected on its own too, and their spread gives every figure its 95%
  interval (:func:`ckptio.calibration.with_intervals`). A target whose rounds are too few,
  too short, not steady or too noisy is not projected: its row says why, and what would do.
- An **emulated** target is projected with its profile: the profile's figures are the
  model's inputs, exact by construction, so its projection is deterministic and says so.
- A **mock** target is not projected (moto tests correctness, not speed).
- A **tiered** target is projected with the model's tiered projection
  (:func:`ckptio.stallmodel.project` with ``local``): each tier from its profile (emulated)
  or from its measured rounds (the fast tier's saves and restores, the durable tier's drains
  and restores), with intervals where a tier is measured. A tiered target with peer copies
  (``+peer``, ``+peerK``: its run's configuration says how many) is projected with them:
  the replication and the restore from a peer are the model's (**projected**, from the fast
  tier's figures and a node link; its kind says ``projected peers``). The node link is
  fitted from the run's measured restores from a peer (its ``restore-peer`` phase:
  :func:`ckptio.calibration.fit_peer_link`, with the spread of its rounds in the intervals)
  where the run has them, else the durable profile's node link (an assumption); the row's
  ``peer_bandwidth_source`` says which (with the check of ``f * node / link`` against
  restores at a higher fan-in where the run has them), and ``peer_fan_in_source`` where the
  fan-in comes from (the restore planner's on the job's ring, or given).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ckptio.calibration import PeerLinkFit, fit_peer_link
from ckptio.profiles import Profile
from ckptio.stallmodel import (
    DEFAULT_INTERVAL,
    DEFAULT_PRICE_PER_GPU_HOUR,
    Conditions,
    Workload,
    preset_workload,
)

__all__ = [
    "DEFAULT_PROJECTIONS",
    "DETERMINISTIC",
    "Scenario",
    "Storage",
    "projection_rows",
    "storage_of",
]

#: Full-scale projection used when none is asked for: GPT-3 175B as its preset lays it out.
DEFAULT_PROJECTIONS = ("gpt3-175b",)

DETERMINISTIC = "deterministic: from the profile (its figures are the inputs; no interval)"
"""What an emulated target's projection says instead of an interval."""


@dataclass(frozen=True)
class Scenario:
    """What a report projects its targets to: full-scale workloads (preset, GPUs or None for
    the preset's) under the report's stated assumptions (:meth:`Conditions.reference`: the
    MTBF scaled to each workload's GPUs), with this interval, price and restart (None: a
    fixed overhead plus each target's projected restore)."""

    presets: tuple[tuple[str, int | None], ...] = tuple((p, None) for p in DEFAULT_PROJECTIONS)
    interval: float = DEFAULT_INTERVAL
    price: float = DEFAULT_PRICE_PER_GPU_HOUR
    restart: float | None = None

    def conditions(self, workload: Workload) -> Conditions:
        return Conditions.reference(
            workload.gpus,
            interval=self.interval,
            price_per_gpu_hour=self.price,
            restart_seconds=self.restart,
        )


_NESTED = ("profile", "local_profile", "write", "read")


def _flat(p: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in p.items() if k not in _NESTED}


def _how(cal: Any, what: str) -> str:
    from ckptio.units import human_rate, human_seconds

    return (
        f"{what}: {human_seconds(cal.request_latency)} latency, "
        f"{human_rate(cal.stream_bandwidth)} per stream, {human_rate(cal.aggregate_bandwidth)} "
        f"steady from one node ({cal.rounds} rounds)"
    )


def _refused(head: dict[str, Any], why: str, basis: str = "") -> dict[str, Any]:
    return {
        **head,
        "profile": "-",
        "write_seconds": None,
        "binding_detail": why,
        "refusal": why,
        "basis": basis or f"not projected: {why}",
    }


@dataclass
class Storage:
    """What a target is projected with: the profile (and a tiered target's fast tier,
    ``local``), the same per measured round (empty: emulated, deterministic), in words, or
    why it cannot be projected."""

    profile: Profile | None = None
    local: Profile | None = None
    rounds: list[tuple[Profile, Profile | None]] = field(default_factory=list)
    how: str = ""
    refusal: str | None = None
    basis: str = ""
    kind: str = ""
    notes: list[str] = field(default_factory=list)
    peers: int = 0
    """Peer copies of a tiered target's fast tier (projected: :mod:`ckptio.stallmodel`)."""
    peer_link: PeerLinkFit | None = None
    """The node link to peers, fitted from the run's measured restores from a peer."""


def _tier(t: Mapping[str, Any], which: str) -> tuple[Profile | None, list[Profile], str, list[str]]:
    """A tiered target's fast (``local``) or durable tier: its pooled profile, its per-round
    profiles (empty: emulated), how it was made (or, with no profile, why not), notes."""
    from ckptio.calibration import fit_target
    from ckptio.profiles import load_profile

    tiers = t["tiers"]
    if not tiers.get(f"{which}_measured"):
        return load_profile(tiers[which]), [], f"profile {tiers[which]} (emulated)", []
    # the fast tier's saves are its writes, its restores its reads; the durable tier's
    # drains are its writes, the restores from it (a replaced node) its reads
    names = ("save", "restore") if which == "local" else ("drain", "restore-durable")
    fit = fit_target(
        f"{t['name']} {which} tier", t["requests"], t["rows"], t["phases"], phase_names=names
    )
    if fit.refusal or fit.pooled is None:
        return None, [], fit.refusal or "nothing to fit", fit.notes
    label = f"{tiers[which]} (fitted)"
    what = (
        "this machine's disk, fitted (measured)"
        if which == "local"
        else f"{tiers[which]}, fitted from its drains (measured)"
    )
    rounds = [cal.as_profile(name=label) for cal in fit.per_round]
    return fit.pooled.as_profile(name=label), rounds, _how(fit.pooled, what), fit.notes


def _tiered_storage(t: Mapping[str, Any]) -> Storage:
    durable, d_rounds, d_how, d_notes = _tier(t, "durable")
    local, l_rounds, l_how, l_notes = _tier(t, "local")
    if local is None or durable is None:
        return Storage(refusal=l_how if local is None else d_how)
    measured = bool(t["tiers"].get("local_measured")) + bool(t["tiers"].get("durable_measured"))
    n = min([len(r) for r in (d_rounds, l_rounds) if r] or [0])
    peers = int(t["tiers"].get("peers") or 0)
    link = fit_peer_link(t["phases"]) if peers else None
    return Storage(
        durable,
        local,
        [
            (d_rounds[i] if d_rounds else durable, l_rounds[i] if l_rounds else local)
            for i in range(n)
        ],
        how=f"durable: {d_how}; fast: {l_how}",
        kind={2: "measured", 1: "measured + emulated", 0: "emulated"}[measured]
        + (" + projected peers" if peers else "")
        + (" (peer link measured)" if link is not None else ""),
        notes=d_notes + l_notes,
        peers=peers,
        peer_link=link,
    )


def storage_of(t: Mapping[str, Any]) -> Storage:
    """What target ``t`` (an entry of :func:`ckptio.report.data.group_targets`) is projected
    with, or why it is not (see the module docstring)."""
    from ckptio import errors
    from ckptio.profiles import load_profile

    if t.get("tiers"):
        return _tiered_storage(t)
    if t["kind"] == "mock":
        return Storage(refusal="mock — not projected", basis="mock: not a performance figure")
    if t["kind"] == "emulated":
        try:
            prof = load_profile(t["profile"])
        except errors.InvalidArgumentError as err:  # a profile from another install: say so
            return Storage(refusal=f"profile {t['profile']!r} unknown here ({err})")
        return Storage(prof, how=f"profile {t['profile']} (emulated)", kind="emulated")
    fit = t["fit"]
    if fit.refusal or fit.pooled is None:
        return Storage(refusal=fit.refusal or "nothing to fit", notes=fit.notes)
    return Storage(
        fit.pooled.as_profile(name=t["name"]),
        rounds=[(cal.as_profile(name=t["name"]), None) for cal in fit.per_round],
        how=_how(fit.pooled, "fitted"),
        kind="measured",
        notes=fit.notes,
    )


def _row(t: Mapping[str, Any], w: Workload, c: Conditions, head: dict[str, Any]) -> dict[str, Any]:
    """One target's row at one workload (see :func:`projection_rows`)."""
    from ckptio.calibration import project_rounds

    s = storage_of(t)
    if s.profile is None or s.refusal:
        return _refused(head, s.refusal or "not projected", s.basis)
    c = replace(c, peers=s.peers)
    done = _flat(
        project_rounds(w, c, (s.profile, s.local), s.rounds, what=t["name"], peer_link=s.peer_link)
    )
    if done.get("refusal"):
        return _refused(head, done["refusal"])
    basis = f"measured, {done['rounds']} rounds: 95% interval" if s.rounds else DETERMINISTIC
    if not s.rounds and done.get("rounds"):
        basis = (
            f"tiers from their profiles (exact); the peer link measured, "
            f"{done['rounds']} rounds: 95% interval"
        )
    return {
        **done,
        **head,
        "kind": s.kind,
        "profile": s.how,
        "basis": basis,
        "notes": s.notes,
        "peer_link_measured": s.peer_link is not None,
    }


def projection_rows(
    targets: Sequence[Mapping[str, Any]], scenario: Scenario
) -> list[dict[str, Any]]:
    """Full-scale projections: for each preset of ``scenario`` and each target, the model's
    figures (:func:`ckptio.stallmodel.project`: stall, binding limit, restore, restart, the
    stall, rework and restart costs and their sum, ...) with ``<figure>_low``/``_high``
    where the target was measured, ``basis`` (how the figures were made, or why there is no
    interval) and ``refusal`` (why a target is not projected; its figures are then None)."""
    rows = []
    for preset, gpus in scenario.presets:
        w = preset_workload(preset, gpus=gpus)
        c = scenario.conditions(w)
        base = {
            "preset": preset,
            "gpus": w.gpus,
            "writing_ranks": w.writing_ranks,
            "checkpoint_bytes": w.total_bytes,
            "interval_seconds": c.interval,
            "mtbf_seconds": c.mtbf,
            "price_per_gpu_hour": c.price_per_gpu_hour,
            "refusal": None,
        }
        for t in targets:
            head = {
                **base,
                "target": t["label"],
                "name": t["name"],
                "kind": t["kind"],
                "session": t["session"],
                "site": t["site"],
            }
            row = _row(t, w, c, head)
            if row.get("write_seconds"):
                row["write_GBps"] = w.total_bytes / row["write_seconds"] / 1e9
            rows.append(row)
    return rows
