"""Griffe extension (mkdocs.yml): reStructuredText in ckptio's docstrings, shown as Markdown.

ckptio's docstrings are read by people in an editor and by `help()` first, so they keep the
Sphinx roles (:class:`~ckptio.store.Store`) and literal blocks (``text::``) Python's tooling
knows. mkdocstrings renders Markdown; this turns a role into inline code of its target's last
name (its full name without ``~``) and a trailing ``::`` into ``:``, leaving the indented
block below it as a Markdown code block. Nothing else is changed.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|data|attr|exc|obj|const):`(~?)([^`]+)`")
_LITERAL = re.compile(r"(\S)::$|^::$", re.MULTILINE)


def _role(m: re.Match[str]) -> str:
    target = m.group(2)
    if m.group(1):
        target = target.rsplit(".", 1)[-1]
    return f"`{target}`"


def rst_to_markdown(text: str) -> str:
    text = _ROLE.sub(_role, text)
    return _LITERAL.sub(lambda m: (m.group(1) or "") + ":" if m.group(1) else "", text)


class RstRoles(griffe.Extension):
    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = rst_to_markdown(obj.docstring.value)
