"""The report as a document — sections of paragraphs, lists, tables and images — written
once and rendered twice: ``report.md`` (Markdown) and ``index.html`` (self-contained apart
from the PNGs beside it). Both show the same sections in the same order; nothing is written
for a plot or a table that has nothing to show.

Paragraph text may mark a figure ``**bold**``; everything else is text (escaped in HTML).
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass, field
from typing import Any

from ckptio.report.tables import md_table

__all__ = ["Image", "Paragraphs", "Section", "Table", "render_html", "render_markdown"]


@dataclass
class Paragraphs:
    texts: list[str]
    bullets: bool = False
    """A list instead of paragraphs."""


@dataclass
class Table:
    header: list[str]
    rows: list[list[str]]
    kinds: list[str] = field(default_factory=list)
    """Per row, its kind (measured, emulated, mock, projected): the HTML row's class."""


@dataclass
class Image:
    file: str
    """File name beside the page."""
    caption: str
    alt: str


@dataclass
class Section:
    id: str
    title: str
    blocks: list[Paragraphs | Table | Image] = field(default_factory=list)
    level: int = 2


_CSS = (
    "body{font-family:sans-serif;max-width:1200px;margin:2em auto;line-height:1.4}"
    "table{border-collapse:collapse;margin:1em 0}"
    "td,th{border:1px solid #ccc;padding:4px 8px;font-size:13px;vertical-align:top}"
    "tr.emulated td{background:#fff3e0}tr.mock td{background:#eeeeee;color:#555}"
    "tr.projected td{background:#e8f5e9}img{max-width:100%;border:1px solid #ddd}"
    "section#conclusion{border:2px solid #2e7d32;padding:0.5em 1.5em;background:#f1f8e9}"
    "figure{margin:1em 0}figcaption{font-style:italic}"
)


def _bold_html(text: str) -> str:
    return re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", html.escape(text))


def render_markdown(title: str, intro: list[str], sections: list[Section]) -> str:
    """``report.md``."""
    out = [f"# {title}", ""]
    out += [line for p in intro for line in (p, "")]
    for s in sections:
        out += [f"{'#' * s.level} {s.title}", ""]
        for b in s.blocks:
            if isinstance(b, Paragraphs):
                if b.bullets:
                    out += [f"- {t}" for t in b.texts] + [""]
                else:
                    out += [line for t in b.texts for line in (t, "")]
            elif isinstance(b, Table):
                out += [md_table(b.header, b.rows), ""]
            else:
                out += [f"![{b.alt}]({b.file})", "", f"_{b.caption}_", ""]
    return "\n".join(out).rstrip() + "\n"


def _table_html(t: Table) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in t.header)
    kinds = t.kinds or [""] * len(t.rows)
    body = "".join(
        f'<tr class="{html.escape(k)}">'
        + "".join(f"<td>{html.escape(str(c))}</td>" for c in r)
        + "</tr>"
        for r, k in zip(t.rows, kinds, strict=True)
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def render_html(title: str, intro: list[str], sections: list[Section]) -> str:
    """``index.html``: each section a ``<section id=...>``, in the order given."""
    parts: list[Any] = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
    ]
    parts += [f"<p>{_bold_html(p)}</p>" for p in intro]
    for s in sections:
        parts.append(
            f"<section id='{html.escape(s.id)}'><h{s.level}>{html.escape(s.title)}</h{s.level}>"
        )
        for b in s.blocks:
            if isinstance(b, Paragraphs):
                if b.bullets:
                    parts.append(
                        "<ul>" + "".join(f"<li>{_bold_html(t)}</li>" for t in b.texts) + "</ul>"
                    )
                else:
                    parts += [f"<p>{_bold_html(t)}</p>" for t in b.texts]
            elif isinstance(b, Table):
                parts.append(_table_html(b))
            else:
                parts.append(
                    f"<figure><img src='{html.escape(b.file)}' alt='{html.escape(b.alt)}'>"
                    f"<figcaption>{html.escape(b.caption)}</figcaption></figure>"
                )
        parts.append("</section>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"
