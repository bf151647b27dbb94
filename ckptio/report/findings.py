"""What a report found, in sentences: per target the stall, the limit that binds it, what the
lost GPU time is made of and what would cut it; which assumption moves the answer most; the
assumptions with their sources. The report puts this first.

Every figure here is a row of the projection table (:mod:`ckptio.report.projections`), in
the same words and with the same interval (:func:`ckptio.report.tables.figure_text`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ckptio.report.tables import cost_key, figure_text, value_text
from ckptio.units import human_seconds, human_size

__all__ = ["assumptions", "conclusion", "fixes", "peer_sentence"]


def _cost(p: Mapping[str, Any], part: str) -> str:
    key, unit = cost_key(part, p["price_per_gpu_hour"])
    return figure_text(p, key, unit)


def _largest(p: Mapping[str, Any]) -> str:
    """The largest part of the lost time: ``stall``, ``rework`` or ``restart``."""
    return max(("stall", "rework", "restart"), key=lambda part: p[f"{part}_share"])


def fixes(p: Mapping[str, Any]) -> list[str]:
    """What would cut a projected target's lost time, largest part first."""
    out = []
    part = _largest(p)
    opt, interval = p.get("optimum_interval_seconds"), p["interval_seconds"]
    if part == "rework" and opt and opt < interval:
        out.append(
            f"checkpoint more often: every {human_seconds(opt)} (Daly's optimum for this "
            f"stall) instead of every {human_seconds(interval)}; the work redone after a "
            "failure is the largest part"
        )
    elif part == "restart" and p.get("restore_binding_detail"):
        out.append(
            f"a faster restore (the largest part is restarts): it is bound by "
            f"{p['restore_binding_detail']}"
        )
    if p.get("remedy"):
        out.append(f"for the stall: {p['remedy']}")
    if part != "rework" and opt and abs(opt - interval) > 0.25 * interval:
        out.append(
            f"checkpoint every {human_seconds(opt)} (Daly's optimum) instead of {human_seconds(interval)}"
        )
    return out


def peer_sentence(p: Mapping[str, Any]) -> str:
    """What a target's peer copies buy and cost, in words (projected by the model)."""
    k = p["peers"]
    blocks = (
        "ends within the interval"
        if p["replication_fits_interval"]
        else f"outlasts the interval and adds {figure_text(p, 'replication_wait_seconds', 's')} "
        "to each stall"
    )
    peer = figure_text(p, "restore_peer_seconds", "s")
    durable = figure_text(p, "restore_durable_seconds", "s")
    restore = (
        f"a restore from a peer would take {peer} (bound by the {p['restore_peer_binding']}), "
        f"slower than the {durable} of the durable tier: a replacement node reads the durable "
        "tier instead, and the copies buy no restore time here"
        if p.get("peer_slower_than_durable")
        else f"a replacement node restores from a peer in {peer} (bound by the "
        f"{p['restore_peer_binding']}) instead of {durable} from the durable tier, which is "
        f"read only when every copy is lost ({p['restore_durable_probability']:.1%} of "
        "failures)"
    )
    return (
        f"With {k} peer cop{'y' if k == 1 else 'ies'} of each node's fast tier (projected), "
        f"{restore}; the expected restore is {figure_text(p, 'restore_seconds', 's')}. The "
        "replication "
        f"after each save takes {figure_text(p, 'replication_seconds', 's')} in the background "
        f"(bound by the {p['replication_binding']}) and {blocks}; each fast tier holds "
        f"{k + 1} steps' worth ({human_size(p['fast_tier_bytes_per_node'])} per node). The "
        f"node link to peers, {figure_text(p, 'peer_bandwidth', 'B/s')}: "
        f"{p['peer_bandwidth_source']}; the fan-in, {p['peer_fan_in']}: "
        f"{p['peer_fan_in_source']}."
    )


def _target_sentence(p: Mapping[str, Any]) -> str:
    name = p["name"]
    if p.get("refusal") or not p.get("write_seconds"):
        return (
            f"**{name}** ({p['kind']}): not projected — {p.get('refusal') or p['binding_detail']}."
        )
    how = "measured" if p["basis"].startswith("measured") else p["kind"]
    basis = f"{how}, {p['rounds']} rounds" if p.get("rounds") else f"{how}, deterministic"
    limit = p["binding_detail"].split(": ", 1)[-1]
    total = _cost(p, "lost")
    text = (
        f"**{name}** ({basis}): each save stalls the GPUs **{figure_text(p, 'stall_seconds', 's')}**, "
        f"bound by {limit}. Lost per day: **{total}** = stall {_cost(p, 'stall')} + rework "
        f"{_cost(p, 'rework')} + restart {_cost(p, 'restart')} (restart "
        f"{figure_text(p, 'restart_seconds', 's')})."
    )
    if p.get("drain_seconds") is not None:
        fits = "fits" if p.get("drain_fits_interval") else "does not fit"
        text += f" The drain to the durable tier takes {figure_text(p, 'drain_seconds', 's')} and {fits} the interval."
    if p.get("peers"):
        text += " " + peer_sentence(p)
    fix = fixes(p)
    if fix:
        text += " What would fix it: " + "; ".join(fix) + "."
    return text


def conclusion(
    proj: Sequence[Mapping[str, Any]],
    sens: Mapping[str, Sequence[Mapping[str, Any]]],
) -> list[str]:
    """The report's conclusion as paragraphs (``**bold**`` marks a figure), for the rows of the
    first workload of ``proj`` and the sensitivity ``sens`` (per target name)."""
    if not proj:
        return ["No target could be projected: no results."]
    first = proj[0]
    rows = [p for p in proj if p["preset"] == first["preset"] and p["gpus"] == first["gpus"]]
    done = sorted(
        (p for p in rows if p.get("write_seconds") and not p.get("refusal")),
        key=lambda p: p["lost_share"],
    )
    key, unit = cost_key("lost", first["price_per_gpu_hour"])
    out = [
        f"Projected to {first['preset']} on {first['gpus']:,} GPUs checkpointing "
        f"{human_size(first['checkpoint_bytes'])} every {human_seconds(first['interval_seconds'])}"
        f" (a failure every {human_seconds(first['mtbf_seconds'])}): "
        + (
            f"**{done[0]['name']}** loses least ({value_text(done[0][key], unit)} a day), "
            f"**{done[-1]['name']}** most ({value_text(done[-1][key], unit)})."
            if len(done) > 1
            else (
                f"one target projected, {done[0]['name']}."
                if done
                else "no target could be projected."
            )
        )
    ]
    out += [_target_sentence(p) for p in rows if p["kind"] != "mock"]
    if done:
        parts = {_largest(p) for p in done}
        if parts == {"rework"}:
            out.append(
                "For every target the largest part of the lost time is **rework**: at this "
                "interval and failure rate the work redone after a failure costs more than the "
                "saves themselves. A faster storage shortens the stall, which lets the job "
                "checkpoint more often, and that is where most of the saving is."
            )
    # in words for the target that loses least (what a reader would choose), else the first
    order = [p["name"] for p in done if p["name"] in sens] + list(sens)
    for name in dict.fromkeys(order):
        top = [r for r in sens[name] if r["swing"] > 0]
        if not top:
            continue
        measurable = [r for r in top if r["assumption"] != "price"]
        lead = ", then ".join(f"{r['words']} ({r['value']})" for r in top[:3])
        text = (
            f"Which assumption moves the answer most, for {name}: {lead} "
            f"(each halved and doubled: {top[0]['low']:,.0f} to {top[0]['high']:,.0f} a day for "
            f"the first)."
        )
        if measurable:
            text += f" Measure first on your own cluster: the {measurable[0]['words']}."
        out.append(text)
        break  # one target's tornado in words; the table and the plot have every target
    return out


def assumptions(proj: Sequence[Mapping[str, Any]]) -> list[str]:
    """The assumptions the projections make, each with its source (as list items)."""
    from ckptio.stallmodel import ASSUMPTIONS

    first = proj[0] if proj else {}
    items = dict(ASSUMPTIONS)
    if first:
        items["interval"] = f"{human_seconds(first['interval_seconds'])} between checkpoints" + (
            " (the founding example's: a generative-AI job on ABCI; DDN talk)"
            if first["interval_seconds"] == 7200
            else " (given)"
        )
        items["mtbf"] = (
            f"a failure every {human_seconds(first['mtbf_seconds'])} at {first['gpus']:,} GPUs: "
            + ASSUMPTIONS["mtbf"]
        )
    items["model"] = (
        "the model's limits (per-stream bandwidth, request latency, node link, aggregate "
        "bandwidth, request rate, metadata, client CPU): docs/suite.md, ckptio/stallmodel.py; "
        "the cost (stall + rework + restart): Daly (2006), ckptio/costmodel.py"
    )
    items["profiles"] = (
        "emulated targets: the storage profiles' figures, each with its source (below)"
    )
    items["measured"] = (
        "measured targets: one node's figures fitted from its steady rounds, the aggregate and "
        "request-rate limits of the storage not measurable from one node (unbounded)"
    )
    return list(items.values())
