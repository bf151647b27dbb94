"""``ckptio compare``: one small scaled checkpoint workload against several targets, then a
report that says why each one stalls and what that costs at full scale.

Default targets (a laptop needs nothing else):

- ``local``: the local file system, in a temporary directory (measured);
- ``mock-s3``: an embedded moto S3 server started and stopped here (mock — it tests the S3
  code path, **not a performance figure**); skipped, with a clear line, when moto or boto3 is
  not installed;
- ``rgw`` (by default where Debian's ``radosgw``, ``ceph-mon`` and ``ceph-osd`` are
  installed): a single-node Ceph RADOS Gateway started on loopback and stopped here
  (:mod:`ckptio.rgwserver`): **measured — Ceph RGW on loopback**, a real S3 implementation
  on this machine (memstore: objects in the OSD's memory), not a cloud service;
- ``cephfs`` (asked for by name, where the Ceph packages, ``ceph-mds`` and ``ceph-fuse`` are
  installed and the process may mount): CephFS mounted with ``ceph-fuse`` from the same
  single-node Ceph as ``rgw`` (one Ceph serves both when both run: the same OSD behind a POSIX
  and an S3 interface), reached as ``pfs://``: **measured — CephFS (ceph-fuse) on loopback**;
  skipped with the reason where it cannot start;
- one emulated target per profile (default ``cloud-s3``, ``abci-lustre``): the shaped backend
  over ``memory://`` (emulated: the profile imposed by sleeping, not the real service);
- tiered targets ``DURABLE+LOCAL`` (default ``cloud-s3+local-nvme``): the workload's state
  saved through :class:`~ckptio.tiered.TieredCheckpointer` on a node-local fast tier and
  drained to an emulated durable one (:mod:`ckptio.tierbench`): ``LOCAL`` is ``disk`` (a
  directory on this machine: measured) or a profile (emulated over such a directory); save
  (the stall), drain and restore (from either tier) are timed.

Any URL can be given as a target too (``file:///mnt/lustre/x``, ``s3://bucket/prefix``): those
are measured. Results go to ``<out>/results/`` (Parquet + JSON, mergeable with results from
other machines by ``ckptio report``), the report to ``<out>/``.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

from ckptio import errors
from ckptio.redact import redact_url

__all__ = [
    "DEFAULT_OBJECT_SIZE",
    "DEFAULT_PRESET",
    "DEFAULT_PROFILES",
    "DEFAULT_TARGETS",
    "DEFAULT_TOTAL_SIZE",
    "MOCK_BUCKET",
    "RGW_BUCKET",
    "SPECIAL_TARGETS",
    "Target",
    "compare",
    "default_targets",
    "mock_s3_server",
    "resolve_targets",
    "rgw_s3_server",
]

DEFAULT_TARGETS = ("local", "mock-s3")
"""Always run by default; ``rgw`` joins them where its packages are installed
(:func:`default_targets`)."""
DEFAULT_PROFILES = ("cloud-s3", "abci-lustre")
DEFAULT_TIERED = ("cloud-s3+local-nvme",)
"""The fix the report recommends for a stalling cloud run, emulated: cloud-s3 drained from a
node-local NVMe tier (the ``local-nvme`` profile over a directory of this machine)."""
DEFAULT_PRESET = "llama3-8b"
DEFAULT_TOTAL_SIZE = "256MiB"
"""Small enough that every default target finishes in well under a minute on 2 cores."""
DEFAULT_OBJECT_SIZE = "16MiB"
MOCK_BUCKET = "ckptio-compare"
SPECIAL_TARGETS = ("local", "mock-s3", "rgw", "cephfs", "memory")
RGW_BUCKET = "ckptio-compare"


@dataclass(frozen=True)
class Target:
    """One target of a comparison."""

    name: str
    """Label in tables and plots (a URL's credentials hidden)."""
    url: str
    emulate: str | None = None
    """Profile name when the target is emulated through the shaped backend."""
    mock: bool = False
    rgw: bool = False
    """A Ceph RGW started for the run (measured, on loopback)."""
    cephfs: bool = False
    """CephFS from a Ceph started for the run (measured, on loopback; the same Ceph as
    ``rgw``'s when both run)."""


def default_targets() -> tuple[str, ...]:
    """:data:`DEFAULT_TARGETS`, plus ``rgw`` where its packages are installed."""
    from ckptio.rgwserver import unavailable_reason

    return DEFAULT_TARGETS if unavailable_reason() else (*DEFAULT_TARGETS, "rgw")


@contextmanager
def _aws_env(env: dict[str, str]) -> Iterator[None]:
    """This process's environment with ``env`` set; restored afterwards."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextmanager
def rgw_s3_server() -> Iterator[str]:
    """Start a single-node Ceph RGW on loopback (:func:`ckptio.rgwserver.start_ceph`), point
    this process's AWS environment at it, create a bucket; yield an ``s3://`` URL. Stops every
    daemon and deletes its directory afterwards. Raises
    :class:`~ckptio.errors.BackendUnavailableError` where it cannot start (the reason says
    why: missing packages, with the install hint)."""
    with ExitStack() as stack, tempfile.TemporaryDirectory(prefix="ckptio-rgw-") as tmp:
        yield _Ceph(stack, tmp, rgw=True, cephfs=False).url(Target("rgw", "", rgw=True))


class _Ceph:
    """The one Ceph of a comparison, started at the first of ``rgw`` and ``cephfs`` that runs
    (with both services when both are targets) and stopped at the end."""

    def __init__(self, stack: ExitStack, tmp: str, *, rgw: bool, cephfs: bool) -> None:
        from ckptio.rgwserver import unavailable_reason

        # CephFS needs more than RGW (root, FUSE, the MDS and ceph-fuse): without it, rgw
        # still runs and cephfs alone is skipped with the reason
        self.cephfs_missing = unavailable_reason(cephfs=True) if cephfs else None
        self.stack, self.tmp, self.rgw = stack, tmp, rgw
        self.cephfs = cephfs and self.cephfs_missing is None
        self.server: Any = None
        self.error: errors.BackendUnavailableError | None = None

    def url(self, target: Target) -> str:
        """The target's URL on the started Ceph; raises BackendUnavailableError (the same
        reason for both targets when Ceph could not start)."""
        from ckptio.rgwserver import RgwUnavailable, mount_cephfs, start_ceph, stop_ceph

        if target.cephfs and self.cephfs_missing:
            raise errors.BackendUnavailableError(f"the cephfs target: {self.cephfs_missing}")
        if self.error is not None:
            raise self.error
        if self.server is None:
            try:
                self.server = start_ceph(rgw=self.rgw, cephfs=self.cephfs)
            except RgwUnavailable as err:
                what = "rgw and cephfs" if self.rgw and self.cephfs else target.name
                self.error = errors.BackendUnavailableError(f"the {what} target: {err}")
                raise self.error from err
            self.stack.callback(stop_ceph, self.server)
            if self.cephfs:
                mount_cephfs(self.server, os.path.join(self.tmp, "cephfs"))
            if self.rgw:
                self.stack.enter_context(_aws_env(self.server.env()))
                client = self.server.client()
                client.create_bucket(Bucket=RGW_BUCKET)
                client.close()
        if target.cephfs:
            return f"pfs://{os.path.join(self.tmp, 'cephfs', 'compare')}"
        return f"s3://{RGW_BUCKET}/compare"


@contextmanager
def mock_s3_server() -> Iterator[str]:
    """Start an embedded moto S3 server on 127.0.0.1 (port 0), point this process's AWS
    environment at it (fake credentials), create a bucket; yield an ``s3://`` URL. Stops the
    server and restores the environment afterwards. Raises
    :class:`~ckptio.errors.BackendUnavailableError` when moto/boto3 are not installed."""
    try:
        from ckptio.mockserver import aws_env, boto3_client, start_moto_server
    except ImportError as err:
        raise errors.BackendUnavailableError(
            f"the mock S3 target needs moto[server] and boto3 ({err.name} is missing); "
            "pip install 'ckptio[all]'"
        ) from err
    try:
        server, endpoint = start_moto_server()
    except ImportError as err:
        raise errors.BackendUnavailableError(
            f"the mock S3 target needs moto[server] ({err.name} is missing); "
            "pip install 'ckptio[all]'"
        ) from err
    try:
        with _aws_env(aws_env(endpoint)):
            client = boto3_client(endpoint)
            client.create_bucket(Bucket=MOCK_BUCKET)
            client.close()
            yield f"s3://{MOCK_BUCKET}/compare"
    finally:
        server.stop()


def resolve_targets(names: list[str], profiles: list[str], *, tmp: str) -> list[Target]:
    """Targets from names (``local``, ``mock-s3``, ``rgw``, ``memory`` or any URL) and profiles (each
    emulated over ``memory://``). Unknown profiles raise an error listing the valid ones."""
    from ckptio.profiles import load_profile

    out: list[Target] = []
    for name in names:
        if name == "local":
            out.append(Target("local", f"file://{os.path.join(tmp, 'local')}"))
        elif name == "mock-s3":
            out.append(Target("mock-s3", "", mock=True))
        elif name == "rgw":
            out.append(Target("rgw", "", rgw=True))
        elif name == "cephfs":
            out.append(Target("cephfs", "", cephfs=True))
        elif name == "memory":
            out.append(Target("memory", "memory://ckptio-compare-memory"))
        elif "://" in name or name.startswith("/"):
            out.append(Target(redact_url(name), name))
        else:
            raise errors.InvalidArgumentError(
                f"unknown target {name!r}; valid: {', '.join(SPECIAL_TARGETS)}, or a URL "
                "(file:///path, s3://bucket/prefix, ...)"
            )
    for prof in profiles:
        load_profile(prof)  # fail early, listing the valid names
        out.append(Target(prof, f"memory://ckptio-compare-{prof}", emulate=prof))
    return out


def compare(
    *,
    targets: list[str] | None = None,
    profiles: list[str] | None = None,
    preset: str = DEFAULT_PRESET,
    total_size: str | None = DEFAULT_TOTAL_SIZE,
    scale: float | None = None,
    object_size: str = DEFAULT_OBJECT_SIZE,
    iterations: int = 1,
    out: str = "ckptio-report",
    site: str | None = None,
    presets: list[tuple[str, int | None]] | None = None,
    interval: float = 7200.0,
    price: float | None = None,
    restart: float | None = None,
    tiered: list[str] | None = None,
    say: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run the workload against every target, write results and the report under ``out``.

    Returns :func:`ckptio.report.build_report`'s result plus ``skipped`` (targets that could
    not run, with the reason). Runs in this process (one rank writes every logical rank).
    ``say`` gets the progress: ``running TARGET (kind) ...``, a line per phase, ``TARGET done
    in N s``. ``tiered``: tiered targets (``DURABLE+LOCAL``, :func:`ckptio.tierbench.
    parse_tiered`; default :data:`DEFAULT_TIERED`). ``restart`` None: each target's restart is
    the fixed overhead plus its projected restore (:func:`ckptio.report.build_report`).
    """
    from ckptio.dist import SingleProcess
    from ckptio.registry import open_store
    from ckptio.report import (
        DEFAULT_PRICE_PER_GPU_HOUR,
        build_report,
        measured_note,
        plots_unavailable,
    )
    from ckptio.runner import run_workload
    from ckptio.tierbench import parse_tiered, run_tiered
    from ckptio.workload import make_plan

    if iterations < 1:
        raise errors.InvalidArgumentError(f"iterations must be >= 1, got {iterations}")
    specs = [parse_tiered(t) for t in (DEFAULT_TIERED if tiered is None else tiered)]
    no_plots = plots_unavailable()  # said before the measurements, not after them
    if no_plots:
        say(f"warning: {no_plots}; the report will be written without plots")
    plan = make_plan(
        preset,
        scale=scale,
        total_size=None if scale is not None else total_size,
        object_size=object_size,
    )
    results_dir = os.path.join(out, "results")
    os.makedirs(results_dir, exist_ok=True)
    skipped: list[dict[str, str]] = []
    run_ids: list[str] = []
    with tempfile.TemporaryDirectory(prefix="ckptio-compare-") as tmp:
        chosen = resolve_targets(
            list(targets if targets is not None else default_targets()),
            list(profiles if profiles is not None else DEFAULT_PROFILES),
            tmp=tmp,
        )
        for t in chosen:  # a wrong URL or store option fails here, before any target runs
            if t.url and not t.emulate:
                open_store(t.url).close()
        ceph_stack = ExitStack()
        ceph = _Ceph(
            ceph_stack,
            tmp,
            rgw=any(t.rgw for t in chosen),
            cephfs=any(t.cephfs for t in chosen),
        )
        for t in chosen:
            with ExitStack() as stack:
                url = t.url
                if t.mock or t.rgw or t.cephfs:
                    try:
                        url = stack.enter_context(mock_s3_server()) if t.mock else ceph.url(t)
                    except errors.BackendUnavailableError as err:
                        say(f"skipped {t.name}: {err}")
                        skipped.append({"target": t.name, "reason": str(err)})
                        continue
                kind = (
                    "mock — not a performance figure"
                    if t.mock
                    else f"emulated {t.emulate}"
                    if t.emulate
                    else measured_note(t.name)
                )
                say(f"running {t.name} ({kind}) ...")
                start = time.perf_counter()
                summary = run_workload(
                    url,
                    plan,
                    iterations=iterations,
                    comm=SingleProcess(),
                    out_dir=results_dir,
                    label=t.name,
                    site=site,
                    emulate=t.emulate,
                    mock=t.mock,
                    config={"command": "compare", "target": t.name},
                    say=lambda line: say(f"  {line}"),
                )
                say(f"{t.name} done in {time.perf_counter() - start:.1f} s")
                run_ids.append(summary.run_id)
        ceph_stack.close()  # the Ceph of rgw and cephfs, once both have run
        for spec in specs:
            say(f"running {spec.name} (tiered: {spec.note}) ...")
            start = time.perf_counter()
            run_ids.append(
                run_tiered(
                    spec,
                    plan,
                    out_dir=results_dir,
                    iterations=iterations,
                    site=site,
                    config={"command": "compare", "target": spec.name},
                    tmp=tmp,
                    say=lambda line: say(f"  {line}"),
                )
            )
            say(f"{spec.name} done in {time.perf_counter() - start:.1f} s")
    if not run_ids:
        raise errors.CkptioError("no target could run; see the lines above")
    files = [os.path.join(results_dir, f"{rid}.run.parquet") for rid in run_ids]
    report = build_report(
        files,
        out,
        presets=presets,
        interval=interval,
        price=DEFAULT_PRICE_PER_GPU_HOUR if price is None else price,
        restart=restart,
        title=f"ckptio compare: {preset} scaled to {plan.total_bytes / 2**20:.0f} MiB",
    )
    report["skipped"] = skipped
    report["results_dir"] = results_dir
    return report
