"""Markdown text that renders as exactly the text given: every string of a result, an env, a baseline or a
mutation report reaches summary.md through :func:`md`, so a case id, verdict, note or path makes no Markdown
(or HTML) markup, whatever it holds.
"""

from __future__ import annotations

import re

__all__ = ["md"]

_MD_SPECIAL = re.compile(r"([\\`*_\[\]<>#|~])")
_MD_NOT_IN_CODE = re.compile(r"[`|\\\r\n]")


def md(value, *, code: bool = False) -> str:
    """``value`` (any object; ``str(value)``) as Markdown that renders as exactly that text and makes no markup:
    CR and LF become spaces (a table row stays one row) and each of ``\\ ` * _ [ ] < > # | ~`` is
    backslash-escaped. ``code=True``: the text as a code span (`` `text` ``), where nothing is markup, when it
    holds no backtick, ``|``, backslash or line break (those need the escapes, which a code span would show),
    else as with ``code=False``."""
    text = str(value)
    if code and text and not _MD_NOT_IN_CODE.search(text):
        return f"`{text}`"
    return _MD_SPECIAL.sub(r"\\\1", text.replace("\r\n", " ").replace("\r", " ").replace("\n", " "))
