"""Storage profiles: what a class of storage can do, each figure with its source.

A profile is a TOML file in this package (``cloud-s3.toml``, ``abci-lustre.toml``, ...) or any
path a user gives. It serves twice: :mod:`ckptio.model` projects a workload to full scale with
it, and the ``emulate`` backend emulates it on any store.

Figures (canonical units; ``inf`` where there is no limit):

============================  ==========  ====================================================
``request_latency``           seconds     added to every data request (PUT part, ranged GET,
                                          POSIX write call)
``stream_bandwidth``          bytes/s     one stream (connection, writer thread)
``node_bandwidth``            bytes/s     one node's link to the storage, shared by its streams
``aggregate_bandwidth``       bytes/s     the whole storage as one job sees it
``write_request_rate``        requests/s  per ``rate_scope`` (prefix or bucket); past it the
                                          service answers as ``throttle`` says
``read_request_rate``         requests/s  as above, for reads
``metadata_latency``          seconds     create / commit (complete upload, fsync + rename)
============================  ==========  ====================================================

Each figure is a TOML table ``{value = ..., source = "..."}``; a source that starts with
``assumption`` marks an estimate, and reports show it as such.

The read side may have figures of its own (:data:`READ_FIGURES`: ``read_request_latency``,
``read_stream_bandwidth``, ``read_node_bandwidth``), optional: where a profile does not give
one, reads use the shared figure (``stream_bandwidth`` for ``read_stream_bandwidth``, ...).
Profiles fitted from measured runs (``ckptio model --from``) have them.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any

from ckptio import errors

__all__ = [
    "FIGURES",
    "KINDS",
    "RATE_SCOPES",
    "SETTINGS",
    "Figure",
    "Profile",
    "available",
    "load_all",
    "load_profile",
    "parse_overrides",
    "parse_profile",
    "read_override",
]

#: Figure name -> unit, in the order reports show them.
FIGURES: dict[str, str] = {
    "request_latency": "s",
    "stream_bandwidth": "B/s",
    "node_bandwidth": "B/s",
    "aggregate_bandwidth": "B/s",
    "write_request_rate": "req/s",
    "read_request_rate": "req/s",
    "metadata_latency": "s",
}

#: Optional figures of the read side; absent, reads use the shared figure of the same name
#: without ``read_`` (:meth:`Profile.value` falls back to it).
READ_FIGURES: dict[str, str] = {
    "read_request_latency": "s",
    "read_stream_bandwidth": "B/s",
    "read_node_bandwidth": "B/s",
}
#: Every figure a profile may have, with its unit.
ALL_FIGURES: dict[str, str] = {**FIGURES, **READ_FIGURES}

#: Scalar settings of a profile besides the figures.
SETTINGS = ("streams", "part_size", "rate_scope", "throttle", "kind", "title")

RATE_SCOPES = ("prefix", "bucket", "none")
KINDS = ("object", "posix")


@dataclass(frozen=True, slots=True)
class Figure:
    """One figure of a profile and where it comes from."""

    value: float
    """In the unit :data:`FIGURES` gives for its name; ``math.inf`` means no limit."""
    source: str
    """Where the figure was read, or ``assumption: ...``."""

    @property
    def assumption(self) -> bool:
        return self.source.strip().lower().startswith("assumption") or "(assumption" in self.source


@dataclass(frozen=True, slots=True)
class Profile:
    """A storage class: its figures, the client concurrency it assumes, how it throttles."""

    name: str
    title: str
    kind: str
    """``object`` (requests, no rename) or ``posix`` (file system)."""
    figures: dict[str, Figure]
    streams: int
    """Concurrent streams (connections / writer threads) per node the profile assumes."""
    part_size: int
    """Bytes per data request (PUT part, ranged GET, write call)."""
    rate_scope: str
    """What one request-rate limit covers: ``prefix``, ``bucket`` or ``none``."""
    throttle: str
    """What happens past the request-rate limit, in words."""
    sources: dict[str, str] = field(default_factory=dict)
    """Sources of the scalar settings (``streams``, ``part_size``)."""
    path: str = ""
    """File the profile was read from."""
    overridden: tuple[str, ...] = ()
    """Figures replaced by the user (``--set``); reports mark them."""

    def __getattr__(self, name: str) -> float:
        # profile.stream_bandwidth -> figures["stream_bandwidth"].value
        figures = object.__getattribute__(self, "figures")
        if name in figures:
            return figures[name].value
        raise AttributeError(name)

    def value(self, name: str) -> float:
        """The value of figure ``name`` (a read-side figure the profile does not give: the
        shared one); an error listing the valid names if unknown."""
        if name in self.figures:
            return self.figures[name].value
        if name in READ_FIGURES:
            return self.value(name.removeprefix("read_"))
        raise errors.InvalidArgumentError(
            f"unknown profile field {name!r}; valid: {', '.join(ALL_FIGURES)}"
        )

    def side(self, name: str, *, read: bool) -> float:
        """Figure ``name`` for writes, or for reads (its ``read_`` figure where there is one)."""
        return self.value(f"read_{name}" if read and f"read_{name}" in READ_FIGURES else name)

    def with_overrides(self, overrides: dict[str, Any]) -> Profile:
        """A copy with figures or settings replaced (values in canonical units, or strings such
        as ``100MB/s``, ``20ms``, ``8MiB``). Unknown names raise an error listing valid ones."""
        if not overrides:
            return self
        figures = dict(self.figures)
        settings: dict[str, Any] = {}
        for name, raw in overrides.items():
            value = read_override(name, raw)
            if name in ALL_FIGURES:
                figures[name] = Figure(value, "set by the user (--set)")
            else:
                settings[name] = value
        return replace(
            self,
            figures=figures,
            overridden=tuple(sorted({*self.overridden, *overrides})),
            **settings,
        )

    def as_dict(self) -> dict[str, Any]:
        """JSON-able: figures as ``{value, unit, source, assumption}``; ``inf`` as ``null``."""
        return {
            "name": self.name,
            "title": self.title,
            "kind": self.kind,
            "streams": self.streams,
            "part_size": self.part_size,
            "rate_scope": self.rate_scope,
            "throttle": self.throttle,
            "sources": dict(self.sources),
            "overridden": list(self.overridden),
            "figures": {
                k: {
                    "value": None if math.isinf(f.value) else f.value,
                    "unit": ALL_FIGURES[k],
                    "source": f.source,
                    "assumption": f.assumption,
                }
                for k, f in self.figures.items()
            },
        }


def _choice(value: str, valid: tuple[str, ...], field_name: str) -> str:
    if value not in valid:
        raise errors.InvalidArgumentError(
            f"{field_name}: {value!r} is not valid; valid: {', '.join(valid)}"
        )
    return value


def _builtin_dir() -> Path:
    return Path(str(resources.files(__name__)))


def available() -> list[str]:
    """Names of the profiles shipped with ckptio, sorted."""
    return sorted(p.stem for p in _builtin_dir().glob("*.toml"))


def parse_profile(data: dict[str, Any], *, path: str = "") -> Profile:
    """A :class:`Profile` from parsed TOML; errors name the file and the field."""
    where = path or "profile"
    for required in ("name", *FIGURES):
        if required not in data:
            raise errors.InvalidArgumentError(f"{where}: missing field {required!r}")
    unknown = sorted(
        k
        for k in data
        if k not in (*ALL_FIGURES, *SETTINGS, "name", "streams_source", "part_size_source")
    )
    if unknown:
        raise errors.InvalidArgumentError(
            f"{where}: unknown field(s) {', '.join(unknown)}; valid: name, "
            f"{', '.join(SETTINGS)}, {', '.join(ALL_FIGURES)}"
        )
    figures: dict[str, Figure] = {}
    for name in (*FIGURES, *(n for n in READ_FIGURES if n in data)):
        entry = data[name]
        if not isinstance(entry, dict) or "value" not in entry or "source" not in entry:
            raise errors.InvalidArgumentError(
                f"{where}: {name} must be a table with 'value' and 'source'"
            )
        value = float(entry["value"])
        if not value > 0:
            raise errors.InvalidArgumentError(f"{where}: {name} must be > 0, got {value}")
        if not str(entry["source"]).strip():
            raise errors.InvalidArgumentError(f"{where}: {name} needs a source (or 'assumption')")
        figures[name] = Figure(value, str(entry["source"]))
    return Profile(
        name=str(data["name"]),
        title=str(data.get("title", data["name"])),
        kind=_choice(str(data.get("kind", "object")), KINDS, f"{where}: kind"),
        figures=figures,
        streams=int(data.get("streams", 16)),
        part_size=int(data.get("part_size", 8 * 2**20)),
        rate_scope=_choice(
            str(data.get("rate_scope", "prefix")), RATE_SCOPES, f"{where}: rate_scope"
        ),
        throttle=str(data.get("throttle", "")),
        sources={
            "streams": str(data.get("streams_source", "assumption")),
            "part_size": str(data.get("part_size_source", "assumption")),
        },
        path=path,
    )


def load_profile(name: str | Profile, overrides: dict[str, Any] | None = None) -> Profile:
    """A shipped profile by name (``cloud-s3``) or a TOML file by path, with ``overrides``
    applied. An unknown name raises an error that lists the shipped ones."""
    if isinstance(name, Profile):
        return name.with_overrides(overrides or {})
    candidate = Path(name)
    if name.endswith(".toml") and candidate.is_file():
        path = candidate
    else:
        path = _builtin_dir() / f"{name}.toml"
        if not path.is_file():
            raise errors.InvalidArgumentError(
                f"unknown profile {name!r}; valid: {', '.join(available())} "
                "(or a path to a .toml file)"
            )
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except tomllib.TOMLDecodeError as err:
        raise errors.InvalidArgumentError(f"{path}: not valid TOML: {err}") from err
    return parse_profile(data, path=str(path)).with_overrides(overrides or {})


def load_all() -> list[Profile]:
    """Every shipped profile."""
    return [load_profile(n) for n in available()]


def read_override(name: str, raw: Any) -> Any:
    """The value of figure or setting ``name`` from ``raw`` (canonical units, or a string such
    as ``100MB/s``, ``20ms``, ``8MiB``), read by :mod:`ckptio.units`; an error naming the field
    and its accepted range, or listing the valid names if ``name`` is unknown."""
    from ckptio.units import (
        MAX_LOCAL_PROCESSES,
        parse_bandwidth,
        parse_count,
        parse_duration,
        parse_rate,
        parse_size,
    )

    unit = ALL_FIGURES.get(name)
    if unit == "s":
        return parse_duration(raw, field=name)
    if unit == "B/s":
        return parse_bandwidth(raw, field=name)
    if unit is not None:
        return parse_rate(raw, field=name)
    if name == "streams":
        return parse_count(raw, field=name, minimum=1, maximum=MAX_LOCAL_PROCESSES)
    if name == "part_size":
        return parse_size(raw, field=name, minimum=1)
    if name == "rate_scope":
        return _choice(str(raw), RATE_SCOPES, name)
    raise errors.InvalidArgumentError(
        f"unknown profile field {name!r}; valid: "
        f"{', '.join([*ALL_FIGURES, 'streams', 'part_size', 'rate_scope'])}"
    )


def parse_overrides(items: list[str] | None) -> dict[str, str]:
    """``["stream_bandwidth=100MB/s", ...]`` (from ``--set``) -> dict; malformed items and
    values out of range (:func:`read_override`) raise, naming ``--set`` and the field."""
    out: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise errors.InvalidArgumentError(
                f"--set expects FIELD=VALUE, got {item!r}; fields: "
                f"{', '.join([*FIGURES, 'streams', 'part_size', 'rate_scope'])}"
            )
        try:
            read_override(key.strip(), value.strip())
        except errors.InvalidArgumentError as err:
            raise errors.InvalidArgumentError(f"--set {err}") from None
        out[key.strip()] = value.strip()
    return out
