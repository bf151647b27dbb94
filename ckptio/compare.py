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
  skipped with the reason where it cannot start (``rgw`` still runs);
- one emulated target per profile (default ``cloud-s3``, ``abci-lustre``): the emulate backend
  over ``memory://`` (emulated: the profile imposed by sleeping, not the real service);
- tiered targets ``DURABLE+LOCAL`` (default ``cloud-s3+local-nvme``): the workload's state
  saved through :class:`~ckptio.tiered.TieredCheckpointer` on a node-local fast tier and
  drained to an emulated durable one (:mod:`ckptio.tierbench`): ``LOCAL`` is ``disk`` (a
  directory on this machine: measured) or a profile (emulated over such a directory); save
  (the stall), drain and restore (from either tier) are timed. ``DURABLE+LOCAL+peer`` (or
  ``+peerK``; default ``cloud-s3+local-nvme+peer``) runs the same and is projected with
  ``K`` peer copies of each node's fast tier: the replication and the restore from a peer
  are the model's (**projected**: one process has no peer node to copy to).

Any URL can be given as a target too (``file:///mnt/lustre/x``, ``s3://bucket/prefix``): those
are measured.

**Rounds.** A measured target runs :data:`AUTO_ROUNDS` rounds (checkpoints written and read
back), then more, within :data:`AUTO_BUDGET` seconds, until its full-scale projection is known
within ±20% (:data:`AUTO_TARGET`; :mod:`ckptio.calibration` says how a projection gets its
interval, and when it is refused). Emulated and mock targets run one round: an emulated
target is projected from its profile, deterministically, and a mock one not at all.

**Where it writes.** Each compare is a *session* of its own: by default it writes to
``ckptio-report/<session>/`` (the session id starts with its UTC time), results under
``results/`` there (Parquet + JSON, mergeable with results from other machines by ``ckptio
report``), the report beside them; ``--out DIR`` names the directory, which must not hold an
earlier run's results. ``ckptio report ckptio-report`` merges every session, labelled, never
averaging two sessions as rounds of one.
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
    "AUTO_TARGET",
    "DEFAULT_OBJECT_SIZE",
    "DEFAULT_PRESET",
    "DEFAULT_PROFILES",
    "DEFAULT_TARGETS",
    "DEFAULT_TOTAL_SIZE",
    "MOCK_BUCKET",
    "RGW_BUCKET",
    "SPECIAL_TARGETS",
    "CompareWorkload",
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
DEFAULT_TIERED = ("cloud-s3+local-nvme", "cloud-s3+local-nvme+peer")
"""The fix the report recommends for a stalling cloud run, emulated: cloud-s3 drained from a
node-local NVMe tier (the ``local-nvme`` profile over a directory of this machine), and the
same with one peer copy of each node's fast tier (``+peer``: the run is the tiered one, the
peer copies are the model's projection, :mod:`ckptio.stallmodel`)."""
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
    """Profile name when the target is emulated through the emulate backend."""
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
    (with both services when both are targets) and stopped with ``stack``."""

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


AUTO_ROUNDS = 4
"""Rounds a measured target runs first when ``iterations`` is not given: three to fit and
an interval, and one more that may turn out to be a warm-up."""
AUTO_TARGET = 0.2
"""The relative interval (±20%) ``compare`` aims its measured targets' projections at: it runs
more rounds, within :data:`AUTO_BUDGET`, until their write time's interval is this narrow."""
AUTO_BUDGET = 30.0
"""Seconds of measuring one target may take to reach :data:`AUTO_TARGET`."""
AUTO_MOST = 16
"""Rounds one target runs at most."""


@dataclass(frozen=True)
class CompareWorkload:
    """What ``compare`` runs against each target: a preset scaled to ``total_size`` (or by
    ``scale``), objects of at most ``object_size``, and ``iterations`` rounds per target
    (None: one for emulated and mock targets, and for measured ones as many as their
    projection needs to be within ±20%, :data:`AUTO_TARGET`)."""

    preset: str = DEFAULT_PRESET
    total_size: str | None = DEFAULT_TOTAL_SIZE
    scale: float | None = None
    object_size: str = DEFAULT_OBJECT_SIZE
    iterations: int | None = None


def _session_dir(out: str | None, session: str) -> str:
    """Where a compare writes: ``ckptio-report/<session>/`` by default, or ``out``, which must
    not hold another compare's results (a second run would overwrite its report)."""
    import json

    if out is None:
        return os.path.join("ckptio-report", session)
    results = os.path.join(out, "results")
    if os.path.isdir(results):
        for name in sorted(os.listdir(results)):
            if not name.endswith(".json"):
                continue
            try:
                with open(os.path.join(results, name), encoding="utf-8") as f:
                    other = (json.load(f).get("config") or {}).get("session") or name[:-5]
            except (OSError, ValueError):
                continue
            raise errors.InvalidArgumentError(
                f"{out} already holds the results of an earlier run ({other}): its report would "
                "be overwritten and its results mixed with these; give another --out, or none "
                "(each compare then writes to a directory of its own under ckptio-report/)"
            )
    return out


def _precision(
    results_dir: str, run_ids: list[str], name: str, scenario: Any
) -> tuple[float, int, bool]:
    """How well a measured target's rounds so far project: (the relative half-width of its
    projected write time, inf when it has no interval yet; the rounds its spread says would
    give :data:`AUTO_TARGET`; whether more rounds could help: not when the rounds are too
    small or not steady, which only a larger run mends)."""
    import math

    from ckptio.calibration import MIN_ROUNDS, fit_target, project_rounds
    from ckptio.intervals import rounds_needed, t_quantile
    from ckptio.results import read_results
    from ckptio.stallmodel import preset_workload

    res = read_results([os.path.join(results_dir, f"{rid}.run.parquet") for rid in run_ids])
    fit = fit_target(name, res.requests.to_pylist(), res.runs.to_pylist(), res.phases.to_pylist())
    n = len(fit.used)
    if fit.pooled is None or n < 2:
        return math.inf, MIN_ROUNDS + 1, fit.pooled is not None
    if fit.refusal and n >= MIN_ROUNDS:
        return math.inf, n, False
    preset, gpus = scenario.presets[0]
    w = preset_workload(preset, gpus=gpus)
    pooled = fit.pooled.as_profile()
    rounds = [(c.as_profile(), None) for c in fit.per_round]
    row = project_rounds(w, scenario.conditions(w), (pooled, None), rounds)
    if row.get("refusal") or row.get("write_seconds_high") is None:
        return math.inf, MIN_ROUNDS + 1, True
    rel = (row["write_seconds_high"] - row["write_seconds"]) / row["write_seconds"]
    need = rounds_needed(rel * math.sqrt(n) / t_quantile(n - 1), AUTO_TARGET)
    return (rel if n >= MIN_ROUNDS else math.inf), max(need, MIN_ROUNDS), True


def compare(
    *,
    targets: list[str] | None = None,
    profiles: list[str] | None = None,
    tiered: list[str] | None = None,
    workload: CompareWorkload | None = None,
    out: str | None = None,
    site: str | None = None,
    scenario: Any = None,
    say: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run ``workload`` against every target, write results and the report under ``out``
    (default ``ckptio-report/<session>/``: each compare its own directory, see
    :func:`_session_dir`).

    Returns :func:`ckptio.report.build_report`'s result plus ``skipped`` (targets that could
    not run, with the reason), ``session`` and ``results_dir``. Runs in this process (one rank
    writes every logical rank). ``say`` gets the progress: ``running TARGET (kind) ...``, a
    line per phase, ``TARGET done in N s``. ``tiered``: tiered targets (``DURABLE+LOCAL``,
    :func:`ckptio.tierbench.parse_tiered`; default :data:`DEFAULT_TIERED`). ``scenario``: what
    the report projects to (:class:`ckptio.report.Scenario`; default its defaults). Every run
    of one compare carries its ``session`` (the sidecar's configuration), so a report of
    several compares never takes two of them for rounds of one.
    """
    from ckptio.report import Scenario, build_report, plots_unavailable
    from ckptio.results import new_run_id
    from ckptio.tierbench import parse_tiered
    from ckptio.workload import make_plan

    wl = workload or CompareWorkload()
    if wl.iterations is not None and wl.iterations < 1:
        raise errors.InvalidArgumentError(f"iterations must be >= 1, got {wl.iterations}")
    scenario = scenario or Scenario()
    specs = [parse_tiered(t) for t in (DEFAULT_TIERED if tiered is None else tiered)]
    no_plots = plots_unavailable()  # said before the measurements, not after them
    if no_plots:
        say(f"warning: {no_plots}; the report will be written without plots")
    plan = make_plan(
        wl.preset,
        scale=wl.scale,
        total_size=None if wl.scale is not None else wl.total_size,
        object_size=wl.object_size,
    )
    session = new_run_id("compare")
    out = _session_dir(out, session)
    results_dir = os.path.join(out, "results")
    run = _Runner(plan, wl, results_dir, site, session, scenario, say)
    with tempfile.TemporaryDirectory(prefix="ckptio-compare-") as tmp:
        chosen = resolve_targets(
            list(targets if targets is not None else default_targets()),
            list(profiles if profiles is not None else DEFAULT_PROFILES),
            tmp=tmp,
        )
        for t in chosen:  # a wrong URL or store option fails here, before any target runs
            if t.url and not t.emulate:
                from ckptio.registry import open_store

                open_store(t.url).close()
        os.makedirs(results_dir, exist_ok=True)
        with ExitStack() as ceph_stack:  # the Ceph of rgw and cephfs, stopped once both ran
            run.ceph = _Ceph(
                ceph_stack,
                tmp,
                rgw=any(t.rgw for t in chosen),
                cephfs=any(t.cephfs for t in chosen),
            )
            for t in chosen:
                run.target(t)
        for spec in specs:
            run.tiered(spec, tmp)
    if not run.run_ids:
        raise errors.CkptioError("no target could run; see the lines above")
    files = [os.path.join(results_dir, f"{rid}.run.parquet") for rid in run.run_ids]
    report = build_report(
        files,
        out,
        scenario,
        title=f"ckptio compare: {wl.preset} scaled to {plan.total_bytes / 2**20:.0f} MiB",
    )
    report.update(skipped=run.skipped, results_dir=results_dir, session=session)
    return report


class _Runner:
    """Runs one compare's targets, each in as many rounds as it needs; collects run ids."""

    def __init__(
        self,
        plan: Any,
        wl: CompareWorkload,
        results_dir: str,
        site: str | None,
        session: str,
        scenario: Any,
        say: Callable[[str], None],
    ) -> None:
        self.plan, self.wl, self.results_dir, self.site = plan, wl, results_dir, site
        self.session, self.scenario, self.say = session, scenario, say
        self.run_ids: list[str] = []
        self.skipped: list[dict[str, str]] = []
        self.ceph: _Ceph | None = None  # set by compare() for its targets

    def _config(self, name: str) -> dict[str, Any]:
        return {"command": "compare", "target": name, "session": self.session}

    def target(self, t: Target) -> None:
        from ckptio.report import measured_note

        with ExitStack() as stack:
            url = t.url
            if t.mock or t.rgw or t.cephfs:
                try:
                    if t.mock:
                        url = stack.enter_context(mock_s3_server())
                    elif self.ceph is not None:
                        url = self.ceph.url(t)
                    else:
                        url = stack.enter_context(rgw_s3_server())
                except errors.BackendUnavailableError as err:
                    self.say(f"skipped {t.name}: {err}")
                    self.skipped.append({"target": t.name, "reason": str(err)})
                    return
            measured = not (t.mock or t.emulate)
            kind = (
                "mock — not a performance figure"
                if t.mock
                else f"emulated {t.emulate}: deterministic, one round"
                if t.emulate
                else measured_note(t.name)
            )
            self.say(f"running {t.name} ({kind}) ...")
            start = time.perf_counter()
            rounds = self.wl.iterations or (AUTO_ROUNDS if measured else 1)
            mine = [self._run(t, url, rounds)]
            if measured and self.wl.iterations is None:
                self._more(t, url, mine, start)
            self.run_ids += mine
            self.say(f"{t.name} done in {time.perf_counter() - start:.1f} s")

    def _more(self, t: Target, url: str, mine: list[str], start: float) -> None:
        """Rounds until the projection's interval is within :data:`AUTO_TARGET`, the budget
        is spent or :data:`AUTO_MOST` rounds ran."""
        done = AUTO_ROUNDS
        while True:
            rel, need, helps = _precision(self.results_dir, mine, t.name, self.scenario)
            spent = time.perf_counter() - start
            more = min(max(need - done + 1, 2), AUTO_MOST - done)  # +1: the batch's warm-up
            over = spent + more * spent / done > AUTO_BUDGET
            if rel <= AUTO_TARGET or not helps or more < 2 or over:
                verdict = f"±{rel:.0%}" if rel < float("inf") else "no interval"
                self.say(f"  {t.name}: {done} rounds, projection {verdict}")
                return
            self.say(f"  {t.name}: projection ±{rel:.0%} after {done} rounds; {more} more")
            mine.append(self._run(t, url, more))
            done += more

    def _run(self, t: Target, url: str, rounds: int) -> str:
        from ckptio.dist import SingleProcess
        from ckptio.runner import RunSettings, run_workload

        return run_workload(
            url,
            self.plan,
            RunSettings(
                iterations=rounds,
                out_dir=self.results_dir,
                label=t.name,
                site=self.site,
                emulate=t.emulate,
                mock=t.mock,
                config=self._config(t.name),
                say=lambda line: self.say(f"  {line}"),
            ),
            SingleProcess(),
        ).run_id

    def tiered(self, spec: Any, tmp: str) -> None:
        from ckptio.tierbench import run_tiered

        self.say(f"running {spec.name} (tiered: {spec.note}) ...")
        start = time.perf_counter()
        measured = spec.local_measured  # the durable tier is always emulated here
        self.run_ids.append(
            run_tiered(
                spec,
                self.plan,
                out_dir=self.results_dir,
                iterations=self.wl.iterations or (AUTO_ROUNDS if measured else 1),
                site=self.site,
                config={**self._config(spec.name), "peers": spec.peers},
                tmp=tmp,
                say=lambda line: self.say(f"  {line}"),
            )
        )
        self.say(f"{spec.name} done in {time.perf_counter() - start:.1f} s")
