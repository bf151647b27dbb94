"""The peer copies of a tiered target in the stall model (``Conditions.peers`` > 0; the
model is :mod:`ckptio.stallmodel`, whose docstring states it): a node's link to its peers
and where that figure comes from, and the replication and the peer restore from the times
the stall model gives them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ckptio.costmodel import DEFAULT_P_LOSE_ANOTHER, backpressure
from ckptio.units import human_rate, human_seconds, human_size

if TYPE_CHECKING:
    from ckptio.profiles import Profile
    from ckptio.stallmodel import Conditions

__all__ = ["peer_figures", "peer_link"]


def peer_link(c: Conditions, durable: Profile) -> tuple[float, str]:
    """A node's network link to the other nodes (bytes/s) and where the figure comes from:
    ``c.peer_bandwidth``, else the durable profile's ``node_bandwidth`` (the same node's link,
    to the storage: peers and storage share one network link)."""
    if c.peer_bandwidth is not None:
        return c.peer_bandwidth, c.peer_bandwidth_source or "given (--peer-bandwidth)"
    fig = durable.figures["node_bandwidth"]
    return fig.value, (
        f"{durable.name}'s node_bandwidth ({fig.source}); assumption: peer copies cross the "
        "same node link"
    )


def peer_figures(
    c: Conditions,
    durable: Profile,
    local: str,
    node: int,
    fast_copies: float,
    peer_fast: float,
    save: float,
    fan_in: tuple[int, str],
) -> dict[str, Any]:
    """The peer copies of a tiered target (``c.peers`` > 0; see
    :mod:`ckptio.stallmodel`'s docstring): the replication after each save and the restore
    of a replacement node from a peer, given ``node`` (a node's bytes of one step) and the
    fast tier's (``local``) times: ``fast_copies``, writing the ``k`` copies received and
    reading the step sent; ``peer_fast``, a surviving peer's read of its own step and the
    ``f`` copies it sends; ``save``, one step's write (the replacement's, as it receives); ``fan_in``: the
    replacement nodes one surviving peer serves and where that figure comes from
    (:func:`ckptio.stallmodel.peer_fan_in`)."""
    k, (f, f_source) = c.peers, fan_in
    link, link_source = peer_link(c, durable)
    # save side: each node sends its step to k partners and receives k partners' steps (the
    # link is full duplex); the drain's bytes to the durable tier cross the same link
    repl_terms = {
        "node link": (k + 1) * node / link,
        "fast tier": fast_copies,
    }
    repl_binding = max(repl_terms, key=lambda t: repl_terms[t])
    replication = repl_terms[repl_binding]
    # restore side: a surviving peer reads its own step (its own restart) and the copies of
    # the f replacement nodes it serves from its fast tier, and sends f copies over its link
    peer_send = f * node / link
    # the replacement node writes what it receives onto its fast tier as it arrives (kept
    # for a second loss; not read back: the bytes go straight into the arrays)
    restore_terms = {
        "peer's fast tier": peer_fast,
        "peer's node link": peer_send,
        "replacement's fast tier": save,
    }
    restore_binding = max(restore_terms, key=lambda t: restore_terms[t])
    return {
        "peers": k,
        "peer_fan_in": f,
        "peer_bandwidth": link,
        "peer_bandwidth_source": link_source,
        "peer_fan_in_source": f_source,
        "p_lose_another": c.p_lose_another,
        "p_lose_another_source": "assumption (DEFAULT_P_LOSE_ANOTHER: no published figure for "
        "simultaneous node losses)"
        if c.p_lose_another == DEFAULT_P_LOSE_ANOTHER
        else "given (--p-lose-another)",
        "replication_seconds": replication,
        "replication_binding": repl_binding,
        "replication_detail": f"{k} cop{'y' if k == 1 else 'ies'} of {human_size(node)} per "
        f"node: sent and received over a {human_rate(link)} node link with the drain's "
        f"{human_size(node)} ({human_seconds(repl_terms['node link'])}), written to and read "
        f"from {local} ({human_seconds(repl_terms['fast tier'])})",
        "replication_bytes_per_node": k * node,
        "replication_wait_seconds": backpressure(save + replication, c.interval),
        "replication_fits_interval": save + replication <= c.interval,
        "fast_tier_bytes_per_node": (1 + k) * node,
        "restore_peer_seconds": restore_terms[restore_binding],
        "restore_peer_binding": restore_binding,
        "restore_peer_detail": f"{human_size(node)} per replacement node from a surviving peer "
        f"serving {f}: its {local} reads {1 + f} steps ({human_seconds(peer_fast)}), "
        f"its {human_rate(link)} link sends {f} ({human_seconds(peer_send)}); the "
        f"replacement writes its {local} ({human_seconds(save)})",
    }
