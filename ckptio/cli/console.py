"""What ``ckptio`` prints, and how: tables, lines and progress (the CLI layer; nothing below it
imports this module or rich).

Commands describe their output as :class:`Sheet` tables of plain-text cells and lines of plain
text; :class:`Printer` renders them in the format asked for with ``--format``:

- ``table`` (the default): a rich table. On a terminal it fits the terminal; piped or redirected
  it is plain ASCII at its natural width, so no value is ever cut (``0.…``) or wrapped, and no
  colour codes reach a log.
- ``markdown``: the title as a heading, a Markdown table, lines as paragraphs.
- ``csv``: per table a ``# title`` line, a header row and the rows (RFC 4180 quoting), tables
  separated by an empty line; other lines become ``# `` comments (``pandas.read_csv(...,
  comment="#")`` reads a one-table output). Cells are as the table shows them, units included.
- ``json``: the command's structured result (``--json`` is the same), full precision.

Progress goes to stderr, never stdout: a rich bar when stderr is a terminal, else plain lines
(``running X ...``, a line per milestone and per 10% of the bytes, ``X done in N s``), so a
redirected run leaves a log a person can read.

Cell and line text is never read as rich markup (a value such as ``ckptio[s3]`` shows as is);
styles are given with :class:`Styled`.
"""

from __future__ import annotations

import csv
import io
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

__all__ = [
    "FORMATS",
    "Cell",
    "Printer",
    "Progress",
    "Sheet",
    "Styled",
    "comparison_sheet",
    "gpus_text",
    "idle_text",
    "note",
    "num",
    "plain",
    "print_model",
    "print_plan",
    "print_run",
    "profiles_sheet",
    "projection_sheet",
    "refusal_lines",
    "warn",
]

FORMATS = ("table", "markdown", "csv", "json")


@dataclass(frozen=True)
class Styled:
    """Text shown with a rich style on a terminal (``green``, ``bold``), plain elsewhere."""

    text: str
    style: str


Cell = str | Styled


def plain(cell: Cell) -> str:
    """The cell's text, credentials hidden (:func:`ckptio.redact.redact`): everything this
    module prints goes through here."""
    from ckptio.redact import redact

    return redact(cell.text if isinstance(cell, Styled) else str(cell))


def _parts(parts: Sequence[Cell]) -> list[Any]:
    """Parts of a line for ``rich.text.Text.assemble``: (text, style) or text, redacted."""
    return [(plain(p), p.style) if isinstance(p, Styled) else plain(p) for p in parts]


@dataclass
class Sheet:
    """A table for people: a title, column names, rows of text cells, a caption."""

    title: str
    columns: list[str]
    rows: list[list[Cell]] = field(default_factory=list)
    right: set[str] = field(default_factory=set)
    """Columns aligned to the right (numbers)."""
    caption: str = ""

    def add(self, *cells: Cell) -> None:
        if len(cells) != len(self.columns):
            raise ValueError(f"{len(cells)} cells for {len(self.columns)} columns")
        self.rows.append(list(cells))

    def drop_empty_columns(self, empty: str = "-") -> Sheet:
        """The sheet without columns whose every cell is ``empty`` (none are dropped from a
        sheet without rows)."""
        keep = [
            i
            for i, _ in enumerate(self.columns)
            if not self.rows or any(plain(r[i]) != empty for r in self.rows)
        ]
        return Sheet(
            self.title,
            [self.columns[i] for i in keep],
            [[r[i] for i in keep] for r in self.rows],
            self.right,
            self.caption,
        )


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class Printer:
    """Renders sheets and lines on stdout in one of :data:`FORMATS`; notes and warnings go to
    stderr. ``tty`` (default: whether stdout is a terminal) picks the rich or the plain table."""

    def __init__(self, fmt: str = "table", *, tty: bool | None = None) -> None:
        if fmt not in FORMATS:
            raise ValueError(f"format {fmt!r} not one of {', '.join(FORMATS)}")
        self.fmt = fmt
        self.tty = _isatty(sys.stdout) if tty is None else tty
        self._sheets = 0

    # -- stdout -------------------------------------------------------------------------------

    def _console(self, width: int | None = None) -> Any:
        from rich.console import Console

        if self.tty:
            return Console(highlight=False)
        # plain: no colour, no terminal width (a log keeps every character of a line)
        return Console(
            file=sys.stdout,
            highlight=False,
            color_system=None,
            force_terminal=False,
            soft_wrap=width is None,
            width=width or 80,
            emoji=False,
        )

    def sheet(self, s: Sheet) -> None:
        """One table in the chosen format (nothing for ``json``: the command prints its
        structured result instead)."""
        if self.fmt == "json":
            return
        out = sys.stdout
        if self.fmt == "markdown":
            from ckptio.report.tables import md_table

            out.write(
                ("\n" if self._sheets else "")
                + f"### {plain(s.title)}\n\n"
                + md_table(s.columns, [[plain(c) for c in r] for r in s.rows])
                + "\n"
            )
            if s.caption:
                out.write(f"\n_{plain(s.caption)}_\n")
        elif self.fmt == "csv":
            buf = io.StringIO()
            writer = csv.writer(buf, lineterminator="\n")
            writer.writerow([plain(c) for c in s.columns])
            writer.writerows([[plain(c) for c in r] for r in s.rows])
            out.write(("\n" if self._sheets else "") + f"# {plain(s.title)}\n" + buf.getvalue())
        else:
            self._rich_table(s)
        self._sheets += 1

    def _rich_table(self, s: Sheet) -> None:
        from rich import box
        from rich.measure import Measurement
        from rich.table import Table
        from rich.text import Text

        def cell(c: Cell) -> Text:
            return Text(plain(c), style=c.style if isinstance(c, Styled) else "")

        if self.tty:
            t = Table(
                title=Text(plain(s.title)), caption=Text(plain(s.caption)) if s.caption else None
            )
        else:  # the title and caption as lines of their own: never wrapped to the table's width
            t = Table(box=box.ASCII, safe_box=True)
        for col in s.columns:
            t.add_column(
                col,
                justify="right" if col in s.right else "left",
                no_wrap=not self.tty,
                overflow="fold",
            )
        for r in s.rows:
            t.add_row(*[cell(c) for c in r])
        if self.tty:
            self._console().print(t)
            return
        probe = self._console()
        width = Measurement.get(probe, probe.options.update_width(1 << 20), t).maximum
        self.line(s.title)
        self._console(width=max(width, 1)).print(t)
        if s.caption:
            self.line(s.caption)

    def line(self, *parts: Cell) -> None:
        """A line of text on stdout (a comment in csv, nothing in json); never wrapped when not
        on a terminal."""
        text = "".join(plain(p) for p in parts)
        if self.fmt == "json":
            return
        if self.fmt == "csv":
            sys.stdout.write("".join(f"# {ln}\n" for ln in text.splitlines() or [""]))
        elif self.fmt == "markdown":
            sys.stdout.write(f"\n{text}\n")
        else:
            from rich.text import Text

            self._console().print(Text.assemble(*_parts(parts)))

    def json(self, obj: Any) -> None:
        """``obj`` as JSON on stdout, credentials hidden (:func:`ckptio.redact.redact_obj`)."""
        from ckptio.redact import redact_obj

        sys.stdout.write(json.dumps(redact_obj(obj), indent=2, default=str) + "\n")


# -- stderr: notes, warnings, progress --------------------------------------------------------


def note(*parts: Cell) -> None:
    """A line on stderr (a warning, an error), styled on a terminal, never wrapped."""
    from rich.console import Console
    from rich.text import Text

    tty = _isatty(sys.stderr)
    console = (
        Console(stderr=True, highlight=False, soft_wrap=True)
        if tty
        else Console(
            stderr=True, highlight=False, soft_wrap=True, color_system=None, force_terminal=False
        )
    )
    console.print(Text.assemble(*_parts(parts)))


def warn(text: str) -> None:
    note(Styled("warning:", "yellow"), " ", text)


class Progress:
    """Progress of one piece of work on stderr: a rich bar (bytes, rate, time left) when stderr
    is a terminal, else plain lines. ``advance(n)`` counts bytes; ``say(text)`` reports a
    milestone. ``enabled=False`` prints nothing. ``short``: the bar's label, when the
    description is too long to share a terminal line with it."""

    EVERY = 10.0
    """Plain lines: a line at each 10% of the bytes, at most one per this many seconds."""

    def __init__(
        self, description: str, total: int = 0, *, enabled: bool = True, short: str | None = None
    ) -> None:
        self.description = description
        self.short = short or description
        """What the bar shows beside it (the lines say ``description``)."""
        self.total = total
        self.enabled = enabled
        self.tty = _isatty(sys.stderr)
        self.done = 0
        self._next_tenth = 1
        self._bar: Any = None
        self._last = time.perf_counter()

    def __enter__(self) -> Progress:
        self.start = time.perf_counter()
        if not self.enabled:
            return self
        if self.tty:
            from rich import progress as rp
            from rich.console import Console

            self._bar = rp.Progress(
                rp.TextColumn("{task.description}", markup=False),
                rp.BarColumn(),
                rp.DownloadColumn(),
                rp.TransferSpeedColumn(),
                rp.TimeRemainingColumn(),
                console=Console(stderr=True),
                transient=True,
            )
            self._bar.start()
            self._task = self._bar.add_task(plain(self.short), total=self.total or None)
        else:
            self._write(f"running {self.description} ...")
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.stop()
        secs = time.perf_counter() - self.start
        if exc_type is None:
            self._write(f"{self.description} done in {secs:.1f} s")
        elif not self.tty:
            self._write(f"{self.description} failed after {secs:.1f} s")

    def _write(self, text: str) -> None:
        text = plain(text)
        if self._bar is not None:
            self._bar.console.print(text, highlight=False, markup=False)
        else:
            sys.stderr.write(text + "\n")
            sys.stderr.flush()

    def advance(self, n: int) -> None:
        if not self.enabled:
            return
        self.done += n
        if self._bar is not None:
            self._bar.advance(self._task, n)
            return
        if self.total <= 0:
            return
        tenth = self.done * 10 // self.total
        now = time.perf_counter()
        if self._next_tenth <= tenth < 10 and now - self._last >= self.EVERY:
            self._next_tenth = tenth + 1
            self._last = now
            from ckptio.units import human_bytes

            self._write(
                f"  {tenth * 10}% ({human_bytes(self.done)} of {human_bytes(self.total)}) "
                f"after {time.perf_counter() - self.start:.1f} s"
            )

    def say(self, text: str) -> None:
        if self.enabled:
            self._write(f"  {text}")


# -- what each command shows -------------------------------------------------------------------


def profiles_sheet(profiles: list[Any]) -> Sheet:
    """One row per figure, one column per profile; ``*`` marks an assumption."""
    from ckptio.profiles import FIGURES
    from ckptio.report.tables import fig_text
    from ckptio.units import human_size

    names = [p.name for p in profiles]
    s = Sheet(
        "storage profiles (* = assumption, no published figure)",
        ["figure", *names],
        right=set(names),
    )
    for name, unit in FIGURES.items():
        s.add(
            name.replace("_", " "),
            *[
                fig_text(p.figures[name].value, unit) + ("*" if p.figures[name].assumption else "")
                for p in profiles
            ],
        )
    s.add("streams per node", *[str(p.streams) for p in profiles])
    s.add("part size", *[human_size(p.part_size) for p in profiles])
    s.add("rate limit per", *[p.rate_scope for p in profiles])
    s.add(
        "past the rate limit", *[(p.throttle.split(";")[0].split(":")[0] or "-") for p in profiles]
    )
    return s


def idle_text(fraction: float) -> str:
    """``0.40%``; below 0.1%, two significant digits (``0.0011%``), never ``0.00%``."""
    if fraction == 0 or fraction >= 1e-3:
        return f"{fraction:.2%}"
    return f"{fraction * 100:.2g}%"


def num(x: float) -> str:
    """Three decimals, or three significant digits below 1: ``2.687``, ``0.046``,
    ``0.00046`` (never ``0.000`` for a small non-zero value)."""
    return f"{x:.3f}" if abs(x) >= 1 or x == 0 else f"{x:.3g}"


def gpus_text(result: dict[str, Any]) -> str:
    """Which GPU count the model used, and where it came from."""
    n, src = result.get("gpus", 1), result.get("gpus_from", "given")
    how = {
        "given": "--gpus",
        "workload": "the workload",
        "assumed": "assumed: no --gpus given; lost GPU-hours and the async snapshot scale with it",
    }.get(src, f"the layout of {src}" if src.startswith("preset ") else src)
    return f"GPUs: {n:,} ({how})"


def print_model(result: dict[str, Any], out: Printer) -> None:
    """The model's answer: per target, time, binding limit, stall, idle cost, intervals."""
    from ckptio.report.tables import figure_text
    from ckptio.stallmodel import LIMITS
    from ckptio.units import human_rate, human_seconds, human_size

    targets = result["targets"]
    if "workload" in result:
        w = result["workload"]
        out.line(
            f"workload {w['name'] or ''}: {human_size(w['total_bytes'])} per checkpoint, "
            f"{w['writing_ranks']} writing ranks of {max(w['ranks'], w['writing_ranks'])} "
            f"GPUs, {human_size(w['bytes_per_rank'])} per rank ({w['ranks_per_node']} per "
            "node)"
        )
    out.line(gpus_text(result))
    given = all(t.get("kind") == "given" for t in targets)
    title = (
        "checkpoint stall and cost (from the figures given)"
        if given
        else "checkpoint stall and cost (projected by the model)"
    )
    s = Sheet(
        title,
        [
            "target",
            "size",
            "write",
            "read",
            "binding limit",
            "GPU stall",
            "stall share",
            "stall GPU-h/day",
            "rework GPU-h/day",
            "restart GPU-h/day",
            "lost GPU-h/day",
            "lost cost/day",
        ],
        right={
            "size",
            "write",
            "read",
            "GPU stall",
            "stall share",
            "stall GPU-h/day",
            "rework GPU-h/day",
            "restart GPU-h/day",
            "lost GPU-h/day",
            "lost cost/day",
        },
        caption="stall share: of wall time, the GPUs waiting for saves; lost = stall + rework "
        "(work redone after a failure) + restart; rework and restart need --mtbf; ±: 95% "
        "interval over a measured target's rounds",
    )
    for t in targets:
        if t.get("refusal"):
            continue

        def f(key: str, unit: str, t: dict[str, Any] = t) -> str:
            return figure_text(t, key, unit, short=True)

        s.add(
            t["target"],
            human_rate(t["checkpoint_bytes"]).removesuffix("/s")
            if t.get("checkpoint_bytes")
            else "-",
            f("write_seconds", "s"),
            f("read_seconds", "s") if "read_seconds" in t else "-",
            t.get("binding_detail", "-"),
            f("stall_seconds", "s") + (" (async)" if t.get("async_save") else ""),
            f("stall_share", "%"),
            *(
                f(f"{part}_gpu_hours_per_day", "GPU-h")
                if part == "stall" or t.get("mtbf_seconds")
                else "-"
                for part in ("stall", "rework", "restart", "lost")
            ),
            f("lost_cost_per_day", "money") if t["price_per_gpu_hour"] else "-",
        )
    out.sheet(s.drop_empty_columns())
    for t in targets:
        if t.get("refusal"):
            out.line(f"{t['target']}: not projected — {t['refusal']}")
    projected = [t for t in targets if "write" in t]
    if projected:
        att = Sheet(
            "write time by limit: alone / on the critical path (*: binding)",
            ["limit", *[t["target"] for t in projected]],
            right={t["target"] for t in projected},
        )
        for name in LIMITS:
            cells: list[Cell] = [name]
            for t in projected:
                lim = next(x for x in t["write"]["limits"] if x["limit"] == name)
                cell = (
                    f"{human_seconds(lim['seconds'])} / "
                    f"{human_seconds(lim['contribution_seconds'])}"
                )
                cells.append(Styled(cell + " *", "bold") if lim["binding"] else cell)
            att.add(*cells)
        out.sheet(att)
    for line in _model_lines(targets):
        out.line(line)


def peer_line(t: dict[str, Any]) -> str:
    """A target with peer copies: the replication after each save (and whether it blocks)
    and the restore from a peer, with how each is made (projected by the model)."""
    from ckptio.report.tables import figure_text
    from ckptio.units import human_seconds

    shares = {w: t[f"restore_{w}_probability"] for w in ("fast", "peer", "durable")}
    peer = f"{human_seconds(t['restore_peer_seconds'])} (bound by the {t['restore_peer_binding']})"
    if t.get("peer_slower_than_durable"):  # the model's expected restore reads durable
        restore = (
            f"a restore from a peer would take {peer}, slower than the durable tier, which a "
            "replacement node reads instead"
        )
        paths = (
            f"{shares['fast']:.0%} from the node's own fast tier, "
            f"{shares['peer'] + shares['durable']:.1%} from the durable tier"
        )
    else:
        restore = f"a replacement node restores from a peer in {peer}"
        paths = (
            f"{shares['fast']:.0%} from the node's own fast tier, {shares['peer']:.0%} from a "
            f"peer, {shares['durable']:.1%} from the durable tier"
        )
    blocks = (
        "finishes within the interval"
        if t["replication_fits_interval"]
        else f"outlasts the interval: the next save waits {human_seconds(t['replication_wait_seconds'])}"
    )
    return (
        f"{t.get('name') or t['target']}: {t['peers']} peer cop{'y' if t['peers'] == 1 else 'ies'} "
        f"(projected): replication {human_seconds(t['replication_seconds'])} in the background "
        f"after each save (bound by the {t['replication_binding']}), {blocks}; {restore}; "
        f"restores expected {paths} (every copy lost: p = {t['p_lose_node']:.2f} \u00d7 "
        f"{t['p_lose_another']:g}^{t['peers']}, {t['p_lose_another_source']}); node link "
        f"{figure_text(t, 'peer_bandwidth', 'B/s')}: {t['peer_bandwidth_source']}; fan-in "
        f"{t['peer_fan_in']}: {t['peer_fan_in_source']}"
    )


def _model_lines(targets: list[dict[str, Any]]) -> list[str]:
    """The lines under ``ckptio model``'s tables: what would fix each target, its async save,
    tiers, restart and optimal interval."""
    from ckptio.units import human_seconds

    lines: list[str] = []
    for t in targets:
        if t.get("write", {}).get("remedy"):
            lines.append(f"{t['target']}: what would fix it: {t['write']['remedy']}")
    for t in targets:
        if t.get("async_save"):
            lines.append(
                f"{t['target']}: async save stalls {human_seconds(t['snapshot_seconds'])} "
                f"(snapshot at {t['snapshot_bandwidth'] / 1e9:g} GB/s per GPU) instead of "
                f"{human_seconds(t['blocking_stall_seconds'])}"
                + (
                    ""
                    if t["async_fits_interval"]
                    else " — but the background write is longer than the interval"
                )
            )
    for t in targets:
        if t.get("drain_seconds") is None:
            continue
        tiers = t["tiers"]
        fits = "fits" if t["drain_fits_interval"] else "does NOT fit"
        lines.append(
            f"{t['target']}: stall {human_seconds(t['write_seconds'])} on {tiers['local']}; drain "
            f"{human_seconds(t['drain_seconds'])} to {tiers['durable']} (bound by {t['drain_binding']}), "
            f"{fits} in {t['persist_every']} \u00d7 {human_seconds(t['interval_seconds'])}; newest "
            f"checkpoint on {tiers['local']} only for up to {human_seconds(t['fast_only_window_seconds'])}; "
            f"restore {human_seconds(t['restore_fast_seconds'])} from {tiers['local']}, "
            f"{human_seconds(t['restore_durable_seconds'])} from {tiers['durable']}, expected "
            f"{human_seconds(t['restore_seconds'])} (a failure loses a node's fast tier with p = "
            f"{t['p_lose_node']:.2f}, {t['p_lose_node_source']})"
        )
        if t.get("peers"):
            lines.append(peer_line(t))
    for t in targets:
        if "restart_seconds" not in t:
            continue
        if t.get("restart_overhead_seconds") is None:
            line = f"restart {human_seconds(t['restart_seconds'])} ({t['restart_basis']})"
        elif t.get("restore_seconds") is None:
            line = f"restart {human_seconds(t['restart_seconds'])}: {t['restart_basis']}"
        else:
            line = (
                f"restart {human_seconds(t['restart_seconds'])} = "
                f"{human_seconds(t['restart_overhead_seconds'])} fixed (assumption) + restore "
                f"{human_seconds(t['restore_seconds'])}"
            )
        if t.get("restore_binding_detail"):
            line += f"; the restore is bound by {t['restore_binding_detail']}"
        elif t.get("restore_binding"):
            line += f"; the restore is bound by the {t['restore_binding']}"
        lines.append(f"{t['target']}: {line}")
    for t in targets:
        if t.get("young_interval_seconds") is not None:
            lines.append(
                f"{t['target']}: optimal interval Young "
                f"{human_seconds(t['young_interval_seconds'])}, Daly "
                f"{human_seconds(t['daly_interval_seconds'])} of compute; total overhead "
                f"{t['overhead_at_interval']:.2%} at {human_seconds(t['interval_seconds'])}, "
                f"{t['overhead_at_optimum']:.2%} at the optimum (restarts of "
                f"{human_seconds(t['restart_seconds'])} included)"
            )
    return lines


def comparison_sheet(summary: list[dict[str, Any]], title: str = "comparison") -> Sheet:
    """The comparison (what ``ckptio compare`` and ``ckptio report`` print): one row per target
    and point (a target's sweep points are rows of their own, never averaged together), each
    figure the mean over its steady rounds with its 95% interval (``±``)."""
    from ckptio.report.tables import figure_text
    from ckptio.units import human_size

    sizes = {s["checkpoint_bytes"] for s in summary}
    if len(sizes) == 1:
        title = f"{title}: {human_size(sizes.pop() or 0)} checkpoint"
    cols = ["target", "kind", "rounds", "write", "write GB/s", "read GB/s", "reqs", "throttled"]
    if any(s.get("tiered") for s in summary):
        cols[cols.index("write") + 1 : cols.index("write") + 1] = ["drain", "restore"]
    if any(s.get("point") for s in summary):
        cols.insert(1, "point")
    if len(sizes) > 1:
        cols.insert(cols.index("write"), "size")
    sheet = Sheet(
        title,
        cols,
        right=set(cols) - {"target", "point", "kind"},
        caption="mean over the steady rounds, ±: its 95% interval (none with one round; a "
        "first round that is a warm-up is left out); mock: moto, not a performance figure; "
        "emulated: a profile imposed by sleeping (plus this machine's real CPU work)"
        + (
            "; tiered (A+B): write = the stall (the fast tier's save), drain to the durable "
            "tier, restore from the fast tier"
            if "drain" in cols
            else ""
        ),
    )
    for s in summary:
        pk = s.get("phase_kinds") or {}

        def secs(key: str, phase: str, s: dict[str, Any] = s, pk: dict[str, str] = pk) -> str:
            text = figure_text(s, key, "s", short=True)
            return text + (f" ({pk[phase]})" if pk and text != "-" else "")

        warm = s.get("warmup_rounds") or 0
        cells = {
            "target": s["target"],
            "point": s.get("point", ""),
            "kind": f"tiered: {s['tiers_note']}" if s.get("tiered") else s["kind"],
            "rounds": f"{s.get('rounds', s.get('iterations', ''))}"
            + (f" +{warm} warm-up" if warm else ""),
            "drain": secs("drain_seconds", "drain"),
            "restore": secs("read_seconds", "restore"),
            "size": human_size(s["checkpoint_bytes"] or 0),
            "write": secs("write_seconds", "save"),
            "write GB/s": figure_text(s, "write_GBps", "GB/s", short=True),
            "read GB/s": figure_text(s, "read_GBps", "GB/s", short=True),
            "reqs": str(s["requests"]),
            "throttled": str(s["throttled"]),
        }
        sheet.add(*[cells[c] for c in cols])
    return sheet


def projection_sheet(proj: list[dict[str, Any]]) -> Sheet:
    """Full-scale projections: the stall and its binding limit, the restore and restart, and
    what the lost GPU time costs (stall + rework + restart), each with its 95% interval
    (``±``) where the target was measured; ``basis`` says how each row was made."""
    from ckptio.report.tables import cost_key, figure_text

    workloads = list(dict.fromkeys(f"{p['preset']} on {p['gpus']:,} GPUs" for p in proj))
    one = len(workloads) == 1
    price = proj[0]["price_per_gpu_hour"] if proj else 0.0
    unit = "cost/day" if price else "GPU-h/day"
    title = "full-scale projection (model): why it stalls and what it costs"
    parts = [f"{part} {unit}" for part in ("stall", "rework", "restart", "lost")]
    cols = ([] if one else ["workload"]) + [
        "target",
        "basis",
        "stall",
        "binding limit",
        "drain",
        "restore",
        "restart",
        *parts,
    ]
    sheet = Sheet(
        f"{title} — {workloads[0]}" if one else title,
        cols,
        right={"stall", "drain", "restore", "restart", *parts},
        caption="stall: what the GPUs wait per checkpoint; lost = stall + rework (work redone "
        "after a failure) + restart (overhead + restore); ±: 95% interval over the measured "
        "rounds; exact: an emulated target, projected from its profile (deterministic); peers "
        "projected: peer copies of the fast tier, the model's (not run)",
    )
    for p in proj:
        done = bool(p.get("write_seconds")) and not p.get("refusal")
        basis = (
            f"measured, {p['rounds']} rounds"
            if done and p.get("rounds")
            else "exact (emulated)"
            if done
            else "not projected"
        ) + (", peers projected" if done and p.get("peers") else "")
        cells = {
            "workload": f"{p['preset']} / {p['gpus']:,} GPUs",
            "target": f"{p['name']} ({p['kind']})" if p.get("name") else p["target"],
            "basis": basis,
            "stall": figure_text(p, "stall_seconds", "s", short=True) if done else "-",
            "binding limit": p["binding_detail"].split(": ", 1)[-1]
            if done
            else "see below"
            if p.get("refusal") and p.get("kind") != "mock"
            else p["binding_detail"],
            "drain": figure_text(p, "drain_seconds", "s", short=True) if done else "-",
            "restore": figure_text(p, "restore_seconds", "s", short=True) if done else "-",
            "restart": figure_text(p, "restart_seconds", "s", short=True) if done else "-",
        }
        for part, col in zip(("stall", "rework", "restart", "lost"), parts, strict=True):
            key, u = cost_key(part, price)
            cells[col] = figure_text(p, key, u, short=True) if done else "-"
        sheet.add(*[cells[c] for c in cols])
    return sheet


def peer_lines(proj: list[dict[str, Any]]) -> list[str]:
    """One line per projected target with peer copies (:func:`peer_line`)."""
    return [
        f"{p['preset']} on {p['gpus']:,} GPUs, {peer_line(p)}"
        for p in proj
        if p.get("peers") and p.get("write_seconds") and not p.get("refusal")
    ]


def refusal_lines(proj: list[dict[str, Any]]) -> list[str]:
    """One line per target not projected, with why (and what would do)."""
    return [
        f"{p.get('name') or p['target']}: not projected — {p['refusal']}"
        for p in proj
        if p.get("refusal") and p.get("kind") != "mock"
    ]


Column = tuple[str, Callable[[dict[str, Any]], str]]
"""A column of a sheet: its name and how a row's cell is shown."""


def print_run(summary: Any, out: Printer) -> None:
    """``ckptio run`` / ``sweep``: one row per iteration (and sweep point); a tiered run
    (``--local``) shows the stall, the drain and both restores instead."""
    from ckptio.units import human_bytes

    first = summary.runs[0] if summary.runs else {}
    tag = f" (emulated: {first.get('profile', '')})" if first.get("emulated") else ""
    tag += " (mock)" if first.get("mock") else ""
    tiered = getattr(summary, "tiered", None)
    title = f"{summary.run_id}: {first.get('preset', '')} on {first.get('url', '')}"
    requests: list[Column] = [
        ("requests", lambda r: f"{r['requests']:,}"),
        ("retries", lambda r: str(r["retries"] + r["throttled"])),
    ]
    rss = ", ".join(human_bytes(b) for b in summary.peak_rss_bytes)
    if tiered:
        # a tiered row is the iteration's tiered figures with its requests
        rows = [{**r, **t} for t, r in zip(tiered, summary.runs, strict=True)]
        peers = "restore_peer_seconds" in rows[0]
        peer_figures = (
            ("copies s", "replicate_seconds"),
            ("from peers s", "restore_peer_seconds"),
            ("from peers GB/s", "restore_peer_GBps"),
        )
        columns = [
            ("it", lambda r: str(r["iteration"])),
            ("size", lambda r: human_bytes(r["checkpoint_bytes"])),
            *_figures(
                ("stall s", "stall_seconds"),
                ("drain s", "drain_seconds"),
                ("drain GB/s", "drain_GBps"),
                ("restore s", "restore_seconds"),
                ("restore GB/s", "restore_GBps"),
                *(peer_figures if peers else ()),
                ("from durable s", "restore_durable_seconds"),
                ("from durable GB/s", "restore_durable_GBps"),
            ),
            *requests,
        ]
        title += ", tiered"
        peer_text = (
            " Copies: the step copied to the partner nodes' fast tiers, in the background. "
            "From peers: the same load after one node's loss, emulated (its ranks' fast "
            "roots emptied, the node not killed): its ranks restore from the copies."
            if peers
            else ""
        )
        footer = (
            "Stall: what save blocked training for (the fast tier's commit). Drain: the copy "
            "to the target in the background, to its commit there. Restore: a fresh load of "
            "the newest step from the fast tier; from durable: the same with an empty fast "
            f"tier (a replaced node).{peer_text} Each the slowest rank's; GB/s = 1e9 "
            f"bytes/s. Restore cache bypass: {summary.cache or 'n/a'}. Peak RSS per rank: {rss}."
        )
    else:
        rows = summary.runs
        is_sweep = any(r["kind"] == "sweep" for r in rows)
        sweep_point: list[Column] = [
            ("streams", lambda r: str(r["sweep_streams"])),
            ("part", lambda r: human_bytes(r["sweep_part_size"])),
        ]
        columns = [
            ("it", lambda r: str(r["iteration"])),
            *(sweep_point if is_sweep else []),
            ("size", lambda r: human_bytes(r["checkpoint_bytes"])),
            *_figures(
                ("write s", "write_seconds"),
                ("write GB/s", "write_GBps"),
                ("slowest rank write GB/s", "min_rank_write_GBps"),
                ("read s", "read_seconds"),
                ("read GB/s", "read_GBps"),
                ("slowest rank read GB/s", "min_rank_read_GBps"),
            ),
            *requests,
        ]
        gen = ", ".join(num(r["generate_GBps"]) for r in rows)
        footer = (
            f"Layout: {first.get('layout', 'file-per-shard')}. GB/s = 1e9 bytes/s; slowest "
            f"rank: its own bytes over its own time. Read cache bypass: "
            f"{summary.cache or 'n/a'}. Data: {summary.generator}, generated at {gen} GB/s "
            f"per core. Peak RSS per rank: {rss}."
        )
    names = [name for name, _ in columns]
    sheet = Sheet(title + tag, names, right=set(names))
    for r in rows:
        sheet.add(*(cell(r) for _, cell in columns))
    out.sheet(sheet)
    out.line(footer)
    for p in summary.paths:
        out.line(Styled(str(p), "dim"))


def _figures(*pairs: tuple[str, str]) -> list[Column]:
    """Columns showing numbers: ``(name, key of the row)`` each."""

    def column(name: str, key: str) -> Column:
        return name, lambda r: num(r[key])

    return [column(n, k) for n, k in pairs]


def print_plan(s: dict[str, Any], out: Printer) -> None:
    """A plan summary (``ckptio plan``)."""
    from ckptio.units import human_bytes

    sheet = Sheet(
        f"checkpoint plan: {s['preset']} ({s['layout_text']}"
        + (f", scale {s['scale']:g}" if s["scale"] != 1 else "")
        + ")",
        ["", "value"],
        right={"value"},
    )
    bpp = s["bytes_per_parameter"]
    rows = [
        ("parameters", f"{s['parameters']:,}"),
        (
            "bytes / parameter",
            f"{bpp['total']} = {bpp['weights']} weights + {bpp['fp32_master']} "
            f"fp32 master + {bpp['adam_exp_avg']} + {bpp['adam_exp_avg_sq']} Adam moments",
        ),
        ("checkpoint size", f"{human_bytes(s['total_bytes'])} ({s['total_bytes'] / 1e12:.3f} TB)"),
        ("  weights", human_bytes(s["weights_bytes"])),
        ("  optimizer state", human_bytes(s["optimizer_bytes"])),
        ("ranks", f"{s['ranks']:,}"),
        ("writing ranks", f"{s['writing_ranks']:,}"),
        (
            "bytes per writing rank min / median / max",
            f"{human_bytes(s['bytes_per_rank_min'])} / {human_bytes(s['bytes_per_rank_median'])} / "
            f"{human_bytes(s['bytes_per_rank_max'])}",
        ),
        (f"objects (≤ {human_bytes(s['object_size'])})", f"{s['objects']:,}"),
        (f"requests of {human_bytes(s['part_size'])}", f"{s['requests']:,}"),
    ]
    if s.get("published_bytes"):
        rows.append(("published size", s["published_text"]))
    for row in rows:
        sheet.add(*row)
    out.sheet(sheet)
    out.line(Styled(f"source: {s['source']}", "dim"))
    if s.get("note"):
        out.line(Styled(f"note: {s['note']}", "dim"))
