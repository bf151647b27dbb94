"""The session fixture ``cluster`` (registered by the ckptio pytest plugin)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ckptio.testing.cluster.core import (
    INSTALL_HINT,
    Cluster,
    ClusterUnavailable,
    start_cluster,
    unavailable_reason,
)
from ckptio.testing.services import service_or_skip

__all__ = ["cluster", "start_or_raise"]


def start_or_raise() -> Cluster:
    """The session's cluster: 3 nodes, Slurm, Ceph (RGW + CephFS) and GlusterFS. Raises
    :class:`ClusterUnavailable` naming the install step where the machine cannot run it."""
    reason = unavailable_reason(gluster=True)
    if reason:
        raise ClusterUnavailable(reason if INSTALL_HINT in reason else f"{reason}; {INSTALL_HINT}")
    return start_cluster(3, gluster=True)


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    """A 3-node namespace cluster (:mod:`ckptio.testing.cluster`) for the whole session, torn
    down at its end (and by its reaper if the session dies). Skips with the install step
    where the machine cannot run it (not root, no ``ip netns``, packages missing); fails
    instead under ``CI=true``."""
    yield from service_or_skip(
        "namespace cluster", start_or_raise, Cluster.down, ClusterUnavailable
    )
