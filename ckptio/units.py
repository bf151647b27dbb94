"""Quantities a person types — sizes, bandwidths, request rates, durations, counts and plain
numbers — read in one place, for the library and the command line alike.

Every parser takes the value (a string such as ``"8MiB"``, ``"10min"``, ``"70GB/s"``, or a
number) and ``field``, the name to blame, and returns the value in canonical units (bytes,
seconds, bytes/s, requests/s). Anything outside the accepted range — NaN, an infinity where
none is meaningful, a number that overflows (``1e999``), a negative, zero where zero is not a
value, an integer beyond the maximum (``10**30``), an unknown unit (``5XB``), an empty string —
raises :class:`~ckptio.errors.InvalidArgumentError` with one line: the field, the accepted range
with examples, and what was given (``block_size: expected a size from 0 B to 1 EiB (examples: 4096,
8MiB, 2TB, 1.5e9), got '1e999'``).

Only the words ``inf``, ``unlimited`` and ``none`` mean an infinite bandwidth or rate, and
``inf`` an infinite duration where a parser is told ``allow_inf`` (an MTBF): a number that
overflows is refused, never taken as infinite.

The command line turns these parsers into argparse ``type=`` functions
(:mod:`ckptio.cli.common`), so ``ckptio`` refuses a bad value with the same line while parsing,
before any work starts.

The maxima bound what a value can make ckptio allocate or loop over; each is far beyond any
real use.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

from ckptio import errors

__all__ = [
    "BANDWIDTH_EXAMPLES",
    "DURATION_EXAMPLES",
    "MAX_BYTES",
    "MAX_COUNT",
    "MAX_GPUS",
    "MAX_ITERATIONS",
    "MAX_LOCAL_PROCESSES",
    "MAX_MODEL_DIMENSION",
    "MAX_PEERS",
    "MAX_PRICE",
    "MAX_SCALE",
    "MAX_SECONDS",
    "MAX_STEP",
    "RATE_EXAMPLES",
    "SIZE_EXAMPLES",
    "human_bytes",
    "human_rate",
    "human_seconds",
    "human_size",
    "parse_bandwidth",
    "parse_count",
    "parse_duration",
    "parse_list",
    "parse_number",
    "parse_rate",
    "parse_size",
]

MAX_BYTES = 2**60
"""1 EiB: the largest size (checkpoint, object, part, block) accepted; it leaves the int64 byte
counts of plans and manifests an 8x margin for sums."""

MAX_SECONDS = 1e9
"""About 31.7 years: the longest duration accepted (interval, MTBF, restart, pause, age)."""

MAX_GPUS = 2**20
"""1,048,576: the most GPUs (ranks) of a planned or modelled job, five times the largest
built; a plan holds a few int64 arrays of this length."""

MAX_LOCAL_PROCESSES = 1024
"""The most processes, streams (threads) or objects in flight ckptio starts on one node."""

MAX_ITERATIONS = 10**6
"""The most checkpoints one ``ckptio run`` writes."""

MAX_MODEL_DIMENSION = 2**24
"""The largest dimension (hidden, FFN, vocabulary, layers, heads) of a custom model."""

MAX_SCALE = 1e6
"""The largest ``--scale`` factor; the scaled checkpoint must also stay within
:data:`MAX_BYTES`."""

MAX_PRICE = 1e6
"""The highest price per GPU-hour accepted."""

MAX_COUNT = 2**31 - 1
"""The largest integer option (a store's ``streams``, ``keep_last``) when no tighter bound
applies."""

MAX_PEERS = 16
"""The most peer copies of a node's fast tier a projection or a compare target may name."""

MAX_STEP = 2**63 - 1
"""The largest checkpoint step (int64)."""

SIZE_EXAMPLES = "4096, 8MiB, 2TB, 1.5e9"
DURATION_EXAMPLES = "300, 20ms, 10min, 2h, 1d"
BANDWIDTH_EXAMPLES = "70GB/s, 50MB/s, 100Gb/s, 2e9"
RATE_EXAMPLES = "3500, 3500/s"

_NUMBER = r"[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?"
_SIZE = re.compile(rf"\s*({_NUMBER})\s*([KMGTP]i?)?B?\s*")
_SIZE_POWERS = {"": 0, "K": 1, "M": 2, "G": 3, "T": 4, "P": 5}
_DURATION = re.compile(rf"\s*({_NUMBER}|inf)\s*([a-z]*)\s*")
_DURATION_UNITS = {
    "": 1.0,
    "s": 1.0,
    "sec": 1.0,
    "ms": 1e-3,
    "us": 1e-6,
    "min": 60.0,
    "m": 60.0,
    "h": 3600.0,
    "d": 86400.0,
}
_UNLIMITED = ("inf", "unlimited", "none")


def human_bytes(n: float) -> str:
    """Binary units for sizes a person reads (``1.5 GiB``)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"):
        if abs(n) < 1024 or unit == "EiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} EiB"  # pragma: no cover - the loop returns


def human_size(n: float) -> str:
    """:func:`human_bytes` without a ``.0`` (``8 MiB``, ``1.5 GiB``): part and block sizes."""
    return human_bytes(n).replace(".0 ", " ")


def human_rate(bps: float) -> str:
    """``50 MB/s``, ``70 GB/s`` (decimal units, as storage vendors quote them)."""
    if math.isinf(bps):
        return "unlimited"
    for unit, scale in (("TB/s", 1e12), ("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if bps >= scale:
            v = bps / scale
            return f"{v:.3g} {unit}" if v < 100 else f"{v:.0f} {unit}"
    return f"{bps:.0f} B/s"


def human_seconds(s: float) -> str:
    """``850 ms``, ``28.6 s``, ``4.8 min``, ``2.0 h``."""
    if math.isinf(s):
        return "inf"
    if s < 1:
        return f"{s * 1e3:.3g} ms"
    if s < 120:
        return f"{s:.3g} s"
    if s < 7200:
        return f"{s / 60:.3g} min"
    return f"{s / 3600:.3g} h"


def _refuse(field: str, expected: str, value: Any) -> errors.InvalidArgumentError:
    shown = value if isinstance(value, str) else repr(value)
    if isinstance(shown, str) and len(shown) > 60:
        shown = shown[:57] + "..."
    text = f"expected {expected}, got {shown!r}"
    return errors.InvalidArgumentError(f"{field}: {text}" if field else text)


def _g(x: float) -> str:
    """``1e9`` rather than ``1e+09``."""
    return f"{x:g}".replace("e+0", "e").replace("e+", "e")


def parse_size(
    value: str | int | float, *, field: str = "size", minimum: int = 0, maximum: int = MAX_BYTES
) -> int:
    """Bytes from ``4GiB``, ``8MiB``, ``2TB``, ``1.5e9``, ``4096``. Decimal units are powers
    of 1000 (GB = 1e9 bytes), binary ones powers of 1024. Accepted: ``minimum`` .. ``maximum``
    bytes (default 0 .. 1 EiB)."""
    expected = (
        f"a size from {human_bytes(minimum)} to {human_bytes(maximum)} (examples: {SIZE_EXAMPLES})"
    )
    if isinstance(value, bool):
        raise _refuse(field, expected, value)
    if isinstance(value, int):
        number = value
    elif isinstance(value, float):
        if not (math.isfinite(value) and minimum <= value <= maximum):
            raise _refuse(field, expected, value)
        number = int(value)
    else:
        m = _SIZE.fullmatch(str(value))
        if not m:
            raise _refuse(field, expected, value)
        unit = m.group(2) or ""
        base = 1024 if unit.endswith("i") else 1000
        product = float(m.group(1)) * base ** _SIZE_POWERS[unit.rstrip("i")]
        if not math.isfinite(product) or product > maximum:
            raise _refuse(field, expected, value)
        number = int(product)
    if not minimum <= number <= maximum:
        raise _refuse(field, expected, value)
    return number


def parse_duration(
    value: str | float | int,
    *,
    field: str = "duration",
    positive: bool = False,
    allow_inf: bool = False,
    maximum: float = MAX_SECONDS,
) -> float:
    """Seconds from ``300``, ``20ms``, ``10min``, ``2h``, ``1.5d``. Accepted: 0 (above 0 with
    ``positive``) .. ``maximum`` seconds, and ``inf`` with ``allow_inf``."""
    span = f"> 0 s, at most {_g(maximum)} s" if positive else f"from 0 s to {_g(maximum)} s"
    expected = f"a duration {span}{', or inf' if allow_inf else ''} (examples: {DURATION_EXAMPLES})"
    if isinstance(value, bool):
        raise _refuse(field, expected, value)
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        m = _DURATION.fullmatch(str(value))
        if not m or m.group(2) not in _DURATION_UNITS:
            raise _refuse(field, expected, value)
        if m.group(1) == "inf":
            seconds = math.inf
        else:
            seconds = float(m.group(1)) * _DURATION_UNITS[m.group(2)]
            if math.isinf(seconds):  # 1e999: an overflow, not "forever"
                raise _refuse(field, expected, value)
    if math.isinf(seconds) and seconds > 0 and allow_inf:
        return seconds
    if not (seconds > 0 if positive else seconds >= 0) or not seconds <= maximum:
        raise _refuse(field, expected, value)
    return seconds


def parse_bandwidth(value: str | float | int, *, field: str = "bandwidth") -> float:
    """Bytes/s from ``70GB/s``, ``50MB/s``, ``100Gb/s`` (bits), ``2e9``; ``inf`` (or
    ``unlimited``) for no limit. Accepted: above 0 .. 1 EiB/s, or inf."""
    expected = f"a bandwidth > 0 B/s, at most 1 EiB/s, or inf (examples: {BANDWIDTH_EXAMPLES})"
    if isinstance(value, bool):
        raise _refuse(field, expected, value)
    if isinstance(value, int | float):
        if math.isinf(value) and value > 0:
            return math.inf
        if not 0 < value <= MAX_BYTES:
            raise _refuse(field, expected, value)
        return float(value)
    text = str(value).strip()
    if text.lower() in _UNLIMITED:
        return math.inf
    try:
        bits = re.fullmatch(r"(.*[0-9.])\s*([KMGT])b(?:ps|/s)", text)
        if bits:
            rate = parse_size(bits.group(1) + bits.group(2) + "B", field=field) / 8
        else:
            rate = parse_size(re.sub(r"(?:/s|ps)$", "", text), field=field)
    except errors.InvalidArgumentError:
        raise _refuse(field, expected, value) from None
    if rate <= 0:
        raise _refuse(field, expected, value)
    return float(rate)


def parse_rate(value: str | float | int, *, field: str = "rate") -> float:
    """Requests/s from ``3500``, ``3500/s``; ``inf`` (or ``unlimited``) for no limit."""
    expected = f"a request rate > 0/s, or inf (examples: {RATE_EXAMPLES})"
    if isinstance(value, bool):
        raise _refuse(field, expected, value)
    text = str(value).strip().removesuffix("/s")
    if text.lower() in _UNLIMITED:
        return math.inf
    if not re.fullmatch(_NUMBER, text):
        raise _refuse(field, expected, value)
    rate = float(text)
    if not 0 < rate < math.inf:
        raise _refuse(field, expected, value)
    return rate


def parse_count(value: str | int, *, field: str, minimum: int = 0, maximum: int = MAX_COUNT) -> int:
    """An integer in ``minimum`` .. ``maximum`` from an int or its decimal digits (a URL query
    string, a command line). ``1.5``, ``1e3`` and ``nan`` are not counts."""
    expected = f"an integer from {minimum} to {maximum}"
    if isinstance(value, bool):
        raise _refuse(field, expected, value)
    if isinstance(value, int):
        n = value
    elif (isinstance(value, float) and value.is_integer()) or (
        isinstance(value, str) and re.fullmatch(r"\s*[+-]?[0-9]{1,30}\s*", value)
    ):
        n = int(value)
    else:
        raise _refuse(field, expected, value)
    if not minimum <= n <= maximum:
        raise _refuse(field, expected, value)
    return n


def parse_number(
    value: str | float | int,
    *,
    field: str,
    minimum: float = 0.0,
    maximum: float,
    positive: bool = False,
) -> float:
    """A finite number in ``minimum`` .. ``maximum`` (above ``minimum`` with ``positive``)."""
    span = (
        f"> {_g(minimum)}, at most {_g(maximum)}"
        if positive
        else f"from {_g(minimum)} to {_g(maximum)}"
    )
    expected = f"a number {span}"
    if isinstance(value, bool):
        raise _refuse(field, expected, value)
    if isinstance(value, str):
        if not re.fullmatch(rf"\s*[+-]?{_NUMBER}\s*", value):
            raise _refuse(field, expected, value)
        number = float(value)
    elif isinstance(value, int | float):
        number = float(value)
    else:
        raise _refuse(field, expected, value)
    if not (minimum < number if positive else minimum <= number) or not number <= maximum:
        raise _refuse(field, expected, value)
    return number


def parse_list(text: str, parse: Callable[..., Any], *, field: str, **kwargs: Any) -> list[Any]:
    """``"1,4,16"`` -> each part through ``parse`` (with ``field`` and ``kwargs``); empty parts
    are skipped (``1,4,``), at least one must be left."""
    parts = [p for p in (p.strip() for p in str(text).split(",")) if p]
    if not parts:
        raise errors.InvalidArgumentError(
            f"{field}: expected a comma-separated list, e.g. 1,4,16 or 8MiB,64MiB, got {text!r}"
        )
    return [parse(p, field=field, **kwargs) for p in parts]
