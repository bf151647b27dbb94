"""What was measured: result rows grouped into targets, and their figures at the scale that
was run, each with its interval over the rounds.

A *target* is one storage under test in one *session* at one *site*: runs of different
sessions (two ``ckptio compare`` invocations, two ``ckptio run`` commands) are separate
measurements and never averaged as iterations of one (:meth:`ckptio.results.Results.sessions`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from ckptio.intervals import mean_interval
from ckptio.units import human_size

__all__ = [
    "KIND_NOTE",
    "KIND_STYLE",
    "MEASURED_NOTES",
    "finite",
    "group_targets",
    "measured_note",
    "point_text",
    "run_kind",
    "run_point",
    "summary_rows",
]

#: Colours per kind of figure, used in every plot and legend.
KIND_STYLE = {
    "measured": {"color": "#1f77b4", "hatch": ""},
    "emulated": {"color": "#ff7f0e", "hatch": "//"},
    "mock": {"color": "#9e9e9e", "hatch": "xx"},
    "projected": {"color": "#2ca02c", "hatch": ".."},
}
KIND_NOTE = {
    "measured": "measured",
    "emulated": "emulated (emulate backend: a profile imposed by sleeping)",
    "mock": "mock — not a performance figure",
    "projected": "projected by the model",
}

MEASURED_NOTES = {
    "rgw": "measured — Ceph RGW on loopback",
    "cephfs": "measured — CephFS (ceph-fuse) on loopback",
}
"""What a measured target of ``ckptio compare`` is, where its name alone does not say: ``rgw``
is a real S3 implementation run on this machine (:mod:`ckptio.rgwserver`), not a cloud
service; ``cephfs`` a real parallel filesystem from the same Ceph (the same OSD)."""


def measured_note(target: str) -> str:
    """``measured``, or what :data:`MEASURED_NOTES` says about ``target``."""
    return MEASURED_NOTES.get(target, "measured")


def run_kind(row: Mapping[str, Any]) -> str:
    """``mock``, ``emulated`` or ``measured`` for a row of the runs table."""
    if row.get("mock"):
        return "mock"
    if row.get("emulated"):
        return "emulated"
    return "measured"


def finite(x: Any) -> float | None:
    """``x`` as a float, or ``None`` for None/NaN/inf (so JSON output stays valid)."""
    return float(x) if isinstance(x, int | float) and math.isfinite(x) else None


def group_targets(
    runs: Sequence[Mapping[str, Any]],
    sidecars: Sequence[Mapping[str, Any]],
    phases: Sequence[Mapping[str, Any]],
    requests: Sequence[Mapping[str, Any]],
    sessions: Mapping[str, str],
) -> list[dict[str, Any]]:
    """One entry per (session, site, target): its label, kind, run rows, requests and
    phases. A tiered target (:mod:`ckptio.tierbench`) also has ``tiers`` (its sidecar's, with
    ``peers`` where the run made peer copies, ``ckptio run --replicas K``, or its
    configuration names them for the projection, and ``peers_run`` saying which) and
    ``phase_kinds`` (measured or emulated, per phase); a plain one ``fit``
    (:func:`ckptio.calibration.fit_target` of its best point: the one with the highest write
    throughput), whose steady rounds the summary and the projection both use."""
    from ckptio.calibration import fit_target
    from ckptio.results import session_name
    from ckptio.tierbench import PEER_NOTE, ran_peers_note, tier_kinds

    by_id = {s.get("run_id"): s for s in sidecars}
    sites = {r.get("site") or "" for r in runs}
    groups: dict[tuple[str, str, str], list[Mapping[str, Any]]] = {}
    for r in runs:
        key = (sessions.get(r["run_id"], r["run_id"]), r.get("site") or "", r["target"])
        groups.setdefault(key, []).append(r)
    # a target measured in several sessions is named with each session's time
    seen: dict[tuple[str, str], int] = {}
    for _, site, target in groups:
        seen[(site, target)] = seen.get((site, target), 0) + 1
    out = []
    for (session, site, target), rows in groups.items():
        kind = run_kind(rows[0])
        name = f"{target} @ {site}" if len(sites) > 1 and site else target
        if seen[(site, target)] > 1:
            name += f" [{session_name(session)}]"
        tag = {
            "mock": "mock",
            "emulated": f"emulated {rows[0].get('profile') or ''}".strip(),
            "measured": measured_note(target),
        }[kind]
        ids = {r["run_id"] for r in rows}
        entry: dict[str, Any] = {
            "name": name,
            "label": f"{name} ({tag})",
            "kind": kind,
            "site": site,
            "session": session,
            "target": target,
            "rows": [dict(r) for r in rows],
            "requests": [r for r in requests if r["run_id"] in ids],
            "phases": [p for p in phases if p["run_id"] in ids],
            "profile": rows[0].get("profile") or "",
            "backend": rows[0].get("backend") or "",
        }
        side = by_id.get(rows[0]["run_id"])
        kinds = (
            tier_kinds(dict(side) if side else None) if rows[0].get("kind") == "tiered" else None
        )
        if side and kinds:
            tiers = dict(side["tiers"])
            ran = side.get("peers") or {}  # `ckptio run --replicas K`: copies made and restored
            peers = int(ran.get("replicas") or (side.get("config") or {}).get("peers") or 0)
            if peers:  # else `compare`'s tiered target: its peer copies are the model's
                note = ran_peers_note(ran) if ran else PEER_NOTE
                tiers.update(peers=peers, peers_run=bool(ran), note=f"{tiers['note']}; {note}")
            entry.update(label=f"{name} ({tiers['note']})", tiers=tiers, phase_kinds=kinds)
        else:
            best = _best_point(entry["rows"])
            entry["fit"] = fit_target(
                name,
                [r for r in entry["requests"] if (r["run_id"], r["iteration"]) in best],
                [r for r in entry["rows"] if (r["run_id"], r["iteration"]) in best],
                entry["phases"],
            )
        out.append(entry)
    order = {"measured": 0, "emulated": 1, "mock": 2}
    return sorted(out, key=lambda t: (order[t["kind"]], t["name"]))


def _best_point(rows: Sequence[Mapping[str, Any]]) -> set[tuple[str, int]]:
    """(run_id, iteration) of the rows of the point with the highest mean write throughput."""
    points: dict[tuple[str, int, int, int, int], list[Mapping[str, Any]]] = {}
    for r in rows:
        points.setdefault(run_point(r), []).append(r)

    def speed(p: tuple[str, int, int, int, int]) -> float:
        vals = [r.get("write_GBps") or 0.0 for r in points[p]]
        return sum(vals) / len(vals)

    best = max(points, key=speed)
    return {(r["run_id"], int(r["iteration"])) for r in points[best]}


def run_point(row: Mapping[str, Any]) -> tuple[str, int, int, int, int]:
    """What a row of the runs table measured: (kind, streams, part size, checkpoint bytes,
    ranks). Iterations of one point are averaged in summaries; different points never are."""
    sweep = row.get("kind") == "sweep"
    streams = (row.get("sweep_streams") if sweep else None) or row.get("streams") or 0
    part = (row.get("sweep_part_size") if sweep else None) or row.get("part_size") or 0
    return (
        "sweep" if sweep else "run",
        int(streams),
        int(part),
        int(row.get("checkpoint_bytes") or 0),
        int(row.get("ranks") or 0),
    )


def point_text(
    point: tuple[str, int, int, int, int], *, size: bool = False, ranks: bool = False
) -> str:
    """``sweep: 4 streams, 8 MiB parts`` (with the checkpoint size and the ranks when asked:
    the things that differ between a target's points)."""
    kind, streams, part, nbytes, n_ranks = point
    bits = [
        f"{streams} stream{'s' if streams != 1 else ''}" if streams else "",
        f"{human_size(part)} parts" if part else "",
        human_size(nbytes) if size else "",
        f"{n_ranks} rank{'s' if n_ranks != 1 else ''}" if ranks else "",
    ]
    text = ", ".join(b for b in bits if b)
    return f"sweep: {text}" if kind == "sweep" else text


#: The measured figures of a summary row that get an interval over its rounds.
SUMMARY_FIGURES = (
    "write_seconds",
    "read_seconds",
    "write_GBps",
    "read_GBps",
    "drain_seconds",
    "restore_durable_seconds",
)


def _figure(out: dict[str, Any], key: str, values: Sequence[float | None]) -> None:
    """``out[key]`` the mean of ``values`` and, with two or more, ``key_low``/``key_high``."""
    vals = [v for v in (finite(x) for x in values) if v is not None and v > 0]
    out[key] = sum(vals) / len(vals) if vals else None
    iv = mean_interval(vals)
    out[f"{key}_low"] = iv.low if iv else None
    out[f"{key}_high"] = iv.high if iv else None


def _phase_seconds(
    t: Mapping[str, Any], rows: Sequence[Mapping[str, Any]]
) -> dict[str, list[float]]:
    """A tiered target's phases (save, drain, restore, restore-durable): seconds per round,
    the slowest rank's."""
    rounds = {(r["run_id"], int(r["iteration"])) for r in rows}
    out: dict[str, dict[tuple[str, int], float]] = {}
    for p in t["phases"]:
        key = (p["run_id"], int(p["iteration"]))
        if key in rounds:
            per = out.setdefault(p["phase"], {})
            per[key] = max(per.get(key, 0.0), float(p["seconds"]))
    return {ph: list(v.values()) for ph, v in out.items()}


def summary_rows(targets: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per target and point (:func:`run_point`): its kind and mean figures over the
    rounds of that point, each with its 95% interval (``<figure>_low``/``_high``, None with
    one round); rounds a target's fit found to be warm-ups are left out (``warmup_rounds``
    counts them). A target run at several points (a sweep; runs with other streams, part
    sizes, sizes or ranks) gets one row per point, named in ``point``; runs come before sweep
    points."""
    out = []
    for t in targets:
        fit = t.get("fit")
        warm = {(r.run_id, r.iteration) for r in fit.warmup} if fit else set()
        points: dict[tuple[str, int, int, int, int], list[Mapping[str, Any]]] = {}
        for r in t["rows"]:
            points.setdefault(run_point(r), []).append(r)
        order = sorted(points, key=lambda p: (p[0] == "sweep", p[3], p[4], p[1], p[2]))
        several = len(points) > 1
        size = len({p[3] for p in points}) > 1
        ranks = len({p[4] for p in points}) > 1
        for key in order:
            every = points[key]
            rows = [r for r in every if (r["run_id"], int(r["iteration"])) not in warm] or every
            r0 = rows[0]
            row: dict[str, Any] = {
                "target": t["name"],
                "label": t["label"],
                "kind": t["kind"],
                "site": t["site"],
                "session": t["session"],
                "backend": t["backend"],
                "profile": t["profile"],
                "point": point_text(key, size=size, ranks=ranks)
                if several or key[0] == "sweep"
                else "",
                "streams": key[1],
                "part_size": key[2],
                "sweep": key[0] == "sweep",
                "preset": r0.get("preset"),
                "scale": r0.get("scale"),
                "ranks": r0.get("ranks"),
                "checkpoint_bytes": r0.get("checkpoint_bytes"),
                # tiered targets: the stall is the fast tier's save, the restore is from the
                # fast tier; drain and the restore from the durable tier are phases
                "tiered": bool(t.get("tiers")),
                "tiers_note": (t.get("tiers") or {}).get("note", ""),
                "phase_kinds": t.get("phase_kinds"),
                "requests": sum(int(r.get("requests") or 0) for r in rows),
                "retries": sum(int(r.get("retries") or 0) for r in rows),
                "throttled": sum(int(r.get("throttled") or 0) for r in rows),
                "iterations": len(rows),
                "rounds": len(rows),
                "warmup_rounds": len(every) - len(rows),
                "note": KIND_NOTE[t["kind"]],
            }
            for fig in ("write_seconds", "read_seconds", "write_GBps", "read_GBps"):
                _figure(row, fig, [r.get(fig) for r in rows])
            _figure(row, "min_rank_write_GBps", [r.get("min_rank_write_GBps") for r in rows])
            phases = _phase_seconds(t, rows) if t.get("tiers") else {}
            _figure(row, "drain_seconds", phases.get("drain", []))
            _figure(row, "restore_durable_seconds", phases.get("restore-durable", []))
            out.append(row)
    return out
