"""The storage side of a simulation: request latency as a distribution, bandwidths, request
rates, and a storage description fitted from measured runs."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from statistics import NormalDist
from typing import Any

import numpy as np

from ckptio import errors
from ckptio.profiles import Figure, Profile, load_profile
from ckptio.store import DEFAULT_RETRY_POLICY, RetryPolicy
from ckptio.units import human_seconds

__all__ = [
    "DEFAULT_BURST",
    "DEFAULT_LATENCY",
    "DEFAULT_TAIL",
    "LATENCY_KINDS",
    "PHASES",
    "PLACEMENTS",
    "READERS",
    "ROOT_PREFIX",
    "Latency",
    "Storage",
    "fit_storage",
    "parse_latency",
]

LATENCY_KINDS = ("fixed", "lognormal", "empirical")
PHASES = ("save", "restore")
READERS = ("writers", "all")
PLACEMENTS = ("round-robin", "random")

#: The p99/p50 ratio of the default lognormal latency. Assumption: object-store latency is
#: roughly lognormal with a long tail (spiraldb.com, "So you want to use Object Storage",
#: 2025), and a p99 about 4x the median is what S3 users report (~100 ms warm, p99 above
#: 400 ms: llms3.com, "Tail latency on object storage").
DEFAULT_TAIL = 4.0
DEFAULT_LATENCY = f"lognormal:{DEFAULT_TAIL:g}"

#: Seconds of request rate a prefix absorbs at once (the token bucket's depth). Assumption:
#: S3 documents sustained rates per prefix, not a burst.
DEFAULT_BURST = 1.0

_Z99 = NormalDist().inv_cdf(0.99)
#: The prefix of the step itself: its listing and its manifest (data objects are under
#: ``data/``, or ``data/<2 hex>/`` in the ``hashed`` layout).
ROOT_PREFIX = "step root (listing, manifest)"


# -- the storage side --------------------------------------------------------------------------


@dataclass(frozen=True)
class Latency:
    """A per-request latency distribution, in seconds."""

    kind: str
    """One of :data:`LATENCY_KINDS`."""
    median: float
    p99: float
    """For ``lognormal``: the 99th percentile (sets the tail); ``fixed``: the median."""
    samples: tuple[float, ...] = ()
    """``empirical``: the measured values it resamples (sorted)."""
    source: str = ""

    def __post_init__(self) -> None:
        if self.kind not in LATENCY_KINDS:
            raise errors.InvalidArgumentError(
                f"latency kind {self.kind!r}; valid: {', '.join(LATENCY_KINDS)}"
            )
        if not (math.isfinite(self.median) and self.median >= 0):
            raise errors.InvalidArgumentError(f"latency median must be >= 0, got {self.median}")
        if self.kind == "lognormal" and not self.p99 >= self.median > 0:
            raise errors.InvalidArgumentError(
                f"lognormal latency needs p99 >= median > 0, got {self.p99} and {self.median}"
            )
        if self.kind == "empirical" and not self.samples:
            raise errors.InvalidArgumentError("empirical latency needs samples")

    @property
    def random(self) -> bool:
        return self.kind != "fixed" and self.p99 > self.median

    @property
    def minimum(self) -> float:
        """The least value a draw can take."""
        if self.kind == "fixed":
            return self.median
        if self.kind == "empirical":
            return self.samples[0]
        return 0.0

    def scaled(self, median: float) -> Latency:
        """The same shape with median ``median`` (metadata requests take the data requests'
        shape at the profile's metadata latency)."""
        k = median / self.median if self.median > 0 else 0.0
        return replace(
            self,
            median=median,
            p99=self.p99 * k if self.median > 0 else median,
            samples=tuple(s * k for s in self.samples),
        )

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if self.kind == "fixed" or not self.random:
            return np.full(n, self.median)
        if self.kind == "lognormal":
            sigma = math.log(self.p99 / self.median) / _Z99
            return self.median * np.exp(sigma * rng.standard_normal(n))
        return rng.choice(np.asarray(self.samples), n)

    def describe(self) -> str:
        if self.kind == "fixed" or not self.random:
            return f"fixed {human_seconds(self.median)}"
        if self.kind == "lognormal":
            return (
                f"lognormal, p99 {self.p99 / self.median:.3g}x the median "
                f"({human_seconds(self.median)}, p99 {human_seconds(self.p99)})"
            )
        return (
            f"resampled from {len(self.samples)} measured "
            f"(median {human_seconds(self.median)}, p99 {human_seconds(self.p99)})"
        )


def parse_latency(text: str, median: float, *, source: str = "") -> Latency:
    """``fixed``, ``lognormal`` (p99 = :data:`DEFAULT_TAIL` x median) or ``lognormal:R`` (p99 =
    R x median, R >= 1) around ``median`` seconds."""
    kind, _, arg = str(text).strip().partition(":")
    if kind == "fixed" and not arg:
        return Latency("fixed", median, median, source=source)
    if kind == "lognormal":
        try:
            ratio = float(arg) if arg else DEFAULT_TAIL
        except ValueError:
            ratio = math.nan
        if not (math.isfinite(ratio) and 1 <= ratio <= 1e6):
            raise errors.InvalidArgumentError(
                f"latency {text!r}: the p99/p50 ratio must be a number from 1 to 1e6"
            )
        tail = "assumption: lognormal" + (
            f" with p99 = {ratio:g} x median" if arg else f" with p99 = {DEFAULT_TAIL:g} x median"
        )
        return Latency(
            "lognormal", median, median * ratio, source=f"{source}; {tail}" if source else tail
        )
    raise errors.InvalidArgumentError(
        f"latency {text!r}: expected fixed, lognormal or lognormal:RATIO (p99/p50, e.g. "
        f"lognormal:4), or fit one from measured requests (--from RESULTS)"
    )


@dataclass(frozen=True)
class Storage:
    """A storage description for the simulation: a profile's figures (bandwidths, request
    rates, its rate scope) and what the closed form has no room for.

    Build one with :meth:`from_profile` (a shipped or user profile) or :func:`fit_storage`
    (fitted from measured result files: latency distributions from the recorded requests)."""

    profile: Profile
    latency: Latency
    """Data requests that write (PUT part, write call)."""
    read_latency: Latency
    """Data requests that read (ranged GET, read call)."""
    metadata: Latency
    """Create, complete, size checks, listing, the manifest."""
    object_metadata: Latency | None = None
    """A written object's own metadata, before its data (create) and after (complete; a
    file's fsync, close, rename), where measured (:func:`fit_storage`); None: :attr:`metadata`."""
    targets: int = 0
    """Storage targets (Lustre OSTs) the aggregate bandwidth is split over, each a FIFO pipe
    of ``aggregate / targets``; 0: not modelled (one aggregate pipe)."""
    stripe_count: int = 1
    stripe_size: int = 2**20
    placement: str = "round-robin"
    """How a file's first target is chosen: ``round-robin`` (Lustre's allocator while the
    targets are balanced) or ``random``."""
    burst: float = DEFAULT_BURST
    """Seconds of request rate a prefix absorbs at once."""
    retry: RetryPolicy = DEFAULT_RETRY_POLICY
    """The client's retry policy (ckptio's own by default)."""
    fitted_from: str = ""

    def __post_init__(self) -> None:
        if self.targets < 0 or self.stripe_count < 1 or self.stripe_size < 1:
            raise errors.InvalidArgumentError(
                "storage targets must be >= 0, stripe count and size >= 1"
            )
        if self.targets and math.isinf(self.profile.aggregate_bandwidth):
            raise errors.InvalidArgumentError(
                f"{self.profile.name}: storage targets split the aggregate bandwidth, which "
                "this profile leaves unbounded; give one (--set aggregate_bandwidth=...)"
            )
        if self.placement not in PLACEMENTS:
            raise errors.InvalidArgumentError(
                f"placement {self.placement!r}; valid: {', '.join(PLACEMENTS)}"
            )
        if not self.burst > 0:
            raise errors.InvalidArgumentError(f"burst must be > 0 seconds, got {self.burst}")

    @classmethod
    def from_profile(
        cls,
        profile: Profile | str,
        *,
        latency: str = DEFAULT_LATENCY,
        overrides: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> Storage:
        """The description of a profile (a name, a path, or a :class:`Profile`), its latencies
        drawn as ``latency`` says (:func:`parse_latency`) around the profile's figures."""
        p = load_profile(profile, dict(overrides or {}))
        src = f"{p.name} profile"
        return cls(
            profile=p,
            latency=parse_latency(latency, p.side("request_latency", read=False), source=src),
            read_latency=parse_latency(latency, p.side("request_latency", read=True), source=src),
            metadata=parse_latency(latency, p.value("metadata_latency"), source=src),
            **kwargs,
        )

    @property
    def name(self) -> str:
        return self.profile.name

    @property
    def random(self) -> bool:
        """Whether anything but throttling's jitter is drawn at random."""
        return (
            self.latency.random
            or self.read_latency.random
            or self.metadata.random
            or (self.object_metadata is not None and self.object_metadata.random)
            or (self.targets > 0 and self.placement == "random")
        )

    def describe(self) -> dict[str, Any]:
        return {
            "profile": self.profile.name,
            "latency": self.latency.describe(),
            "read_latency": self.read_latency.describe(),
            "metadata_latency": self.metadata.describe(),
            "object_metadata": self.object_metadata.describe() if self.object_metadata else "",
            "latency_source": self.latency.source,
            "targets": self.targets,
            "stripe_count": self.stripe_count,
            "stripe_size": self.stripe_size,
            "placement": self.placement,
            "burst_seconds": self.burst,
            "retry": {
                "max_attempts": self.retry.max_attempts,
                "base_delay": self.retry.base_delay,
                "max_delay": self.retry.max_delay,
            },
            "fitted_from": self.fitted_from,
        }


def _residuals(rows: list[dict[str, Any]], bandwidth: float) -> tuple[float, ...]:
    """What each measured request took beyond its transfer at ``bandwidth``: its latency."""
    return _bounded(max(0.0, r["seconds"] - r["nbytes"] / bandwidth) for r in rows)


def _bounded(values: Any) -> tuple[float, ...]:
    """``values`` sorted, as a bounded sample of their distribution (tails kept)."""
    out = sorted(values)
    if len(out) > 20000:
        out = [out[i] for i in np.linspace(0, len(out) - 1, 20000).round().astype(int)]
    return tuple(out)


DATA_OPS = ("write", "put", "get", "upload_part")
"""Request ops that move an object's bytes; the others of the object (create, fsync, close,
rename; a multipart upload's create and complete) are its metadata."""


def _metadata(rows: list[dict[str, Any]]) -> tuple[float, ...]:
    """The measured metadata of each written object, as the simulation sends it: one request
    before its data (what the client did before the first data request: a PFS create; a
    multipart upload's create) and one after (fsync, close and rename; a multipart's complete),
    each the sum of those requests' times: 0 for an object sent as one PUT, which has none."""
    objects: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in rows:
        if "data/" in (r["key"] or ""):  # the shards (a step's manifest is published apart)
            objects.setdefault((r["run_id"], r["iteration"], r["rank"], r["key"]), []).append(r)
    out: list[float] = []
    for reqs in objects.values():
        data = [r["start"] for r in reqs if r["op"] in DATA_OPS and r["nbytes"] > 0]
        meta = [r for r in reqs if r["op"] not in DATA_OPS]
        if not data:
            continue
        first = min(data)
        out.append(sum(r["seconds"] for r in meta if r["start"] < first))
        out.append(sum(r["seconds"] for r in meta if r["start"] >= first))
    return _bounded(out)


def _empirical(samples: tuple[float, ...], source: str) -> Latency:
    arr = np.asarray(samples)
    return Latency(
        "empirical",
        float(np.median(arr)),
        float(np.quantile(arr, 0.99)),
        samples=samples,
        source=source,
    )


ProbeReplay = Callable[[Storage, Any, Sequence[Mapping[str, Any]], int], Storage]
"""Fits a storage's aggregate to the replay of the probe it came from: ``(storage, the
probe's TargetFit, its result sidecars, processes per client) -> storage``."""


def fit_storage(
    paths: Sequence[str],
    *,
    target: str | None = None,
    aggregate: Sequence[str] = (),
    replay: ProbeReplay | None = None,
) -> list[Storage]:
    """Storage descriptions fitted from measured result files (or directories): the figures
    of :func:`ckptio.calibration.calibrate` (per-stream bandwidth, the node's link from the
    steady throughput; one node cannot see an aggregate or a request-rate limit, so those stay
    unbounded), and latencies resampled from the recorded requests of the same steady rounds
    (warm-ups left out, as the fit leaves them out): each data request's time beyond its
    transfer at the fitted bandwidth, tails included, and each written object's own metadata
    requests as measured (:func:`_metadata`: a file's create, fsync, close and rename; nothing
    for an object sent as one PUT). Other metadata (listing, size checks, the manifest) is
    resampled from the requests of the runs' commits (the manifest's publish, the step's
    listing, the lease's release), or where none were recorded takes the data requests' shape
    at the fitted figure. The model's figures stay those of
    ``ckptio model --from`` (its ``metadata_latency`` the fitted request latency). ``target``
    keeps one measured target.

    ``aggregate``: result files of a probe of the storage, run from one node with the
    processes, and so the streams, of the job to simulate, and as many storage clients as
    the job has nodes, each shared by one node's processes (a file system mounted that many
    times on the node; on S3 each process is its own client already), as a site measures a
    storage before it buys a second node. Its steady data throughput becomes the aggregate
    bandwidth every node shares, and the write side's requests are fitted from its requests
    instead of ``paths``' (per-stream bandwidth, data latencies, each object's metadata, the
    commit's): what the storage answers to the job's concurrency, which one node's own
    processes do not reach (a GlusterFS create took 5 ms with 2 writers and 33 ms with 6 on
    the namespace cluster, ``docs/simulate.md``). ``paths``, run through one client, give the
    per-client limit, the node's link of the simulation (each node of the job has a client
    of its own), distinct from that aggregate, and the read side. A probe through ONE
    client measures that client's limit instead of the storage's, and the simulation of n
    nodes is as pessimistic as that limit is below the storage's (``docs/simulate.md``).
    A probe from one node still sees at
    most that node's path: where the storage's aggregate is larger than it, the simulation
    of many nodes is pessimistic. ``replay``: how the aggregate is then fitted to the
    simulation of the probe (:func:`ckptio.simulate.fit_storage` passes its own: this module
    sits below the simulation); None: the probe's steady throughput."""
    from ckptio.calibration import fit_targets
    from ckptio.results import read_results

    res = read_results(list(paths))
    fits = [f for f in fit_targets(res.requests, res.runs, res.phases) if f.pooled is not None]
    if target is not None:
        fits = [f for f in fits if f.target == target]
    if not fits:
        raise errors.InvalidArgumentError(
            f"no measured write requests{f' of {target!r}' if target else ''} in "
            f"{', '.join(map(str, paths))} to fit a storage description from"
        )
    probes: dict[str, Any] = {}
    probe_requests: list[dict[str, Any]] = []
    if aggregate:
        pres = read_results(list(aggregate))
        probes = {
            f.target: f
            for f in fit_targets(pres.requests, pres.runs, pres.phases)
            if f.pooled is not None
        }
        probe_requests = pres.requests.to_pylist()
    requests = res.requests.to_pylist()
    out = []
    for fit in fits:
        assert fit.pooled is not None
        cal = fit.pooled
        profile = cal.as_profile()
        writes_from, write_requests = fit, requests
        if aggregate:
            if cal.target not in probes:
                raise errors.InvalidArgumentError(
                    f"no measured write requests of {cal.target!r} in "
                    f"{', '.join(map(str, aggregate))} to fit its aggregate bandwidth from"
                )
            writes_from, write_requests = probes[cal.target], probe_requests
            profile = _with_probe(profile, cal, writes_from.pooled, aggregate)
        write_side = _steady_requests(writes_from, write_requests)
        read_side = _steady_requests(fit, requests)
        rounds = f"{len(writes_from.used)} steady round(s)"
        writes = [
            r
            for r in write_side
            if r["phase"] == "write" and r["op"] in ("write", "put") and r["nbytes"] > 0
        ]
        reads = [
            r for r in read_side if r["phase"] == "read" and r["op"] == "get" and r["nbytes"] > 0
        ]
        src = f"resampled from {len(writes)} measured requests of {cal.target}, {rounds}"
        lat = _empirical(_residuals(writes, profile.stream_bandwidth), src)
        read_lat = (
            _empirical(
                _residuals(reads, profile.side("stream_bandwidth", read=True)),
                f"resampled from {len(reads)} measured reads of {cal.target}, "
                f"{len(fit.used)} steady round(s)",
            )
            if reads
            else lat
        )
        step_meta = _bounded(
            r["seconds"]
            for r in write_side
            if r["phase"] == "write"
            and "data/" not in (r["key"] or "")
            and r["op"] not in DATA_OPS[2:]
        )
        measured_meta = _metadata([r for r in write_side if r["phase"] == "write"])
        object_metadata = (
            _empirical(
                measured_meta,
                f"resampled from the metadata requests of {len(measured_meta) // 2} measured "
                f"objects of {cal.target}, {rounds} (before and after each object's data)",
            )
            if measured_meta
            else None
        )
        storage = Storage(
            profile=profile,
            latency=lat,
            read_latency=read_lat,
            metadata=_empirical(
                step_meta,
                f"resampled from {len(step_meta)} measured requests of {cal.target}'s "
                f"commits, {rounds} (the manifest's publish, the step's listing, the lease)",
            )
            if step_meta
            else lat.scaled(profile.value("metadata_latency")),
            object_metadata=object_metadata,
            fitted_from=", ".join(map(str, [*paths, *aggregate])),
        )
        if aggregate and replay is not None:  # a probe's client has the 1-node run's processes
            per_client = max(int(rd.run.get("ranks") or 1) for rd in fit.used)
            storage = replay(storage, writes_from, pres.sidecars, per_client)
        out.append(storage)
    return out


def _with_probe(profile: Profile, node: Any, probe: Any, paths: Sequence[str]) -> Profile:
    """``profile``, fitted from one node's run (``node``, a :class:`Calibration`), with the
    write side and the aggregate of ``probe``'s (its result files ``paths``), and the node's
    steady throughput as its link: the limit of its one client, each node's own."""
    where = (
        f"a probe run from one node with the job's streams and clients ({probe.requests} "
        f"requests, {probe.rounds} round(s); {', '.join(map(str, paths))})"
    )
    fitted = probe.as_profile().figures
    link = profile.figures["node_bandwidth"].source
    return replace(
        profile,
        figures={
            **profile.figures,
            **{k: fitted[k] for k in ("request_latency", "stream_bandwidth", "metadata_latency")},
            "node_bandwidth": Figure(
                node.aggregate_bandwidth, f"{link}: the limit of one client, each node's own"
            ),
            "aggregate_bandwidth": Figure(
                probe.aggregate_bandwidth, f"the steady data throughput of {where}"
            ),
        },
    )


def _steady_requests(fit: Any, requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The successful requests of ``fit``'s target in its steady rounds (warm-ups left out)."""
    steady = {(rd.run_id, rd.iteration) for rd in fit.used}
    return [
        r
        for r in requests
        if r["target"] == fit.target
        and r["outcome"] == "ok"
        and (r["run_id"], r["iteration"]) in steady
    ]
