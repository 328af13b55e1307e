"""Small Markdown helpers shared by the reference pages."""

from __future__ import annotations

#: The line every generated page carries under its title.
GENERATED = (
    "*Generated from pgtarn's code by `python -m pgtarn.reference`: edit the code or "
    "`src/pgtarn/descriptions/`, not this page.*"
)


def code(text: str) -> str:
    """`text` as inline code, with a longer fence when it holds a backtick."""
    fence = "``" if "`" in text else "`"
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def cell(text: str) -> str:
    """`text` made safe inside a table cell."""
    return text.replace("|", "\\|").replace("\n", " ")
