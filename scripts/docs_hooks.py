"""MkDocs hook (mkdocs.yml `hooks:`): pages built from the code at build time, not by hand.

`<!-- generated: profiles -->` in a page becomes the table of every storage profile shipped in
ckptio/profiles/*.toml, each figure with its unit and source (`profiles_markdown`, also used by
tests/test_docs.py).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # build the docs of this checkout, installed or not
    sys.path.insert(0, str(ROOT))

MARK = "<!-- generated: profiles -->"


def _figure(value: float, unit: str) -> str:
    from ckptio.units import human_rate, human_seconds

    if math.isinf(value):
        return "unlimited"
    if unit == "B/s":
        return human_rate(value)
    if unit == "s":
        return human_seconds(value)
    return f"{value:,.0f} req/s"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def profiles_markdown() -> str:
    """One section per profile: its settings, then figure | value | source."""
    from ckptio.profiles import FIGURES, load_all
    from ckptio.units import human_size

    out: list[str] = []
    for p in load_all():
        out += [
            f"### `{p.name}`",
            "",
            f"{p.title}. Kind: {p.kind}; {p.streams} streams per node; "
            f"{human_size(p.part_size)} per request; "
            + (
                "no request-rate limit"
                if p.rate_scope == "none"
                else f"request-rate limits per {p.rate_scope}; throttling: {_cell(p.throttle)}"
            )
            + ".",
            "",
            "| figure | value | source |",
            "|---|---|---|",
        ]
        for name, unit in FIGURES.items():
            fig = p.figures[name]
            source = _cell(fig.source)
            if fig.assumption:
                source = f"*{source}*"
            out.append(f"| `{name}` | {_figure(fig.value, unit)} | {source} |")
        out.append("")
    return "\n".join(out)


def on_page_markdown(markdown: str, **_: object) -> str:
    if MARK in markdown:
        markdown = markdown.replace(MARK, profiles_markdown())
    return markdown
