"""``python -m ckptio.testing.cluster up|down|exec|status|kill-node|start-node`` (see the
package docstring)."""

from __future__ import annotations

import os
import sys

from ckptio.cli import ArgumentParser  # argparse is the CLI layer's (tests/test_layers.py)
from ckptio.testing.cluster.core import (
    DEFAULT_NODES,
    Cluster,
    ClusterUnavailable,
    reap,
    reap_stale,
    start_cluster,
)
from ckptio.testing.cluster.state import (
    ClusterState,
    leftovers,
    load_state,
    registered,
    same_process,
    stale,
    teardown,
)


def _pick(cluster_id: str | None) -> ClusterState:
    """The cluster named, or the only one recorded."""
    if cluster_id:
        return load_state(cluster_id)
    live = registered()
    if len(live) != 1:
        ids = ", ".join(s.id for s in live) or "none"
        raise SystemExit(f"name a cluster: {len(live)} recorded ({ids})")
    return live[0]


def _describe(c: Cluster) -> str:
    lines = [
        f"cluster {c.id}: {', '.join(c.state.nodes)} on {c.state.bridge} ({c.state.subnet}.0/24)",
        f"  work directory   {c.workdir}",
        f"  node-local dir   {c.local} (a private tmpfs on each node)",
        f"  shared dir       {c.shared}",
    ]
    if c.state.options.get("slurm"):
        lines.append(f"  SLURM_CONF       {c.slurm_conf}")
    if c.state.ceph:
        lines.append(f"  CephFS           {c.cephfs}")
        lines.append(f"  RGW (S3)         {c.rgw_endpoint}")
    if c.state.gluster:
        lines.append(f"  GlusterFS        {c.gluster}")
    for n in c.state.nodes.values():
        up = "up" if same_process(n.pid, n.start) else "DOWN"
        lines.append(f"  {n.name:<6} {n.ip:<15} {up}  enter: nsenter -t {n.pid} -a")
    if stale(c.state):
        lines.append("  (its owner is gone: `down` removes it)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = ArgumentParser(prog="python -m ckptio.testing.cluster")
    sub = p.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start a cluster that stays until `down`")
    up.add_argument("-n", "--nodes", type=int, default=DEFAULT_NODES)
    up.add_argument("--no-slurm", action="store_true")
    up.add_argument("--no-ceph", action="store_true")
    up.add_argument("--gluster", action="store_true")
    down = sub.add_parser("down", help="tear a cluster down (the only one, or ID)")
    down.add_argument("id", nargs="?")
    down.add_argument("--all", action="store_true", help="every recorded cluster")
    down.add_argument("--stale", action="store_true", help="those whose owner is gone")
    ex = sub.add_parser("exec", help="run a command in a node: exec [ID] NODE -- CMD...")
    ex.add_argument("words", nargs="...")  # argparse.REMAINDER
    st = sub.add_parser("status", help="the recorded clusters")
    st.add_argument("id", nargs="?")
    for name in ("kill-node", "start-node"):
        k = sub.add_parser(name, help=f"{name.replace('-', ' ')}: [ID] NODE")
        k.add_argument("words", nargs="+")
    rp = sub.add_parser("reap", help="==SUPPRESS==")  # argparse.SUPPRESS: internal
    rp.add_argument("id")
    args = p.parse_args(argv)

    if args.command == "reap":
        return reap(args.id)
    if args.command == "up":
        try:
            c = start_cluster(
                args.nodes,
                slurm=not args.no_slurm,
                ceph=not args.no_ceph,
                gluster=args.gluster,
                owned=False,
            )
        except ClusterUnavailable as err:
            print(f"cannot start the cluster: {err}", file=sys.stderr)
            return 1
        print(_describe(c))
        return 0
    if args.command == "down":
        if args.stale:
            problems = reap_stale()
        else:
            states = registered() if args.all else [_pick(args.id)]
            problems = [p for s in states for p in teardown(s)]
        for line in problems:
            print(line, file=sys.stderr)
        return 1 if problems else 0
    if args.command == "status":
        states = [_pick(args.id)] if args.id else registered()
        for s in states:
            print(_describe(Cluster(s)))
            left = leftovers(s)
            if not left:
                print("  (nothing of it is on this machine any more)")
        if not states:
            print("no cluster recorded")
        return 0
    words = list(args.words)
    if args.command == "exec":
        if "--" not in words:
            raise SystemExit("usage: exec [ID] NODE -- COMMAND...")
        cut = words.index("--")
        head, cmd = words[:cut], words[cut + 1 :]
        cluster_id, node = (head[0], head[1]) if len(head) == 2 else (None, head[0])
        c = Cluster(_pick(cluster_id))
        os.execvpe(c.enter(node)[0], [*c.enter(node), *cmd], c.env())
    cluster_id, node = (words[0], words[1]) if len(words) == 2 else (None, words[0])
    c = Cluster(_pick(cluster_id))
    if args.command == "kill-node":
        c.kill_node(node)
    else:
        c.start_node(node)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
