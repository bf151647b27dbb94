#!/usr/bin/env bash
# A throwaway GlusterFS volume on this machine: glusterd (started directly, no systemd), a
# distributed volume of BRICKS (default 2) brick directories under DIR, mounted through FUSE
# at DIR/mnt. Needs root, /dev/fuse and glusterfs-server/-client (scripts/install-system-deps.sh).
#
#   scripts/gluster.sh start /tmp/gv [BRICKS]   # prints the mount point
#   scripts/gluster.sh stop  /tmp/gv            # unmount, stop + delete the volume, stop glusterd
#
# The tests do the same through the session fixture `gluster_volume` (ckptio.testing.gluster).
set -euo pipefail
cd "$(dirname "$0")/.."
py=python3
[ -x .venv/bin/python ] && py=.venv/bin/python
exec "$py" -m ckptio.testing.gluster "$@"
