"""ARCHITECTURE.md's file list, made from the summary line of each module's docstring.

The list sits between two markers in ARCHITECTURE.md; the prose around it is written by hand.
Modules are read as text (ast), never imported, from the source tree beside ARCHITECTURE.md.
Packages come in the order of the layers contract in pyproject.toml, top layer first, and
their modules in the order of the package's own contract when it has one, so the list reads
as the dependency rule does. A module that mypyc compiles (native/compiled.py) is marked.
"""

from __future__ import annotations

import ast
import re
import textwrap
import tomllib
from pathlib import Path

from ..native.compiled import COMPILED

BEGIN = "<!-- layout: python -m pgtarn.reference writes this list from the module docstrings -->"
END = "<!-- end of the generated layout -->"
#: Where the text starts on a line of the list, and where it wraps.
TEXT_COLUMN = 28
WIDTH = 96
MARK = " [compiled]"


def summary(path: Path) -> str:
    """The summary of a module's docstring (its first line, or the lines up to the first
    blank one when the summary wraps), or of a C file's opening comment."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".c":
        found = re.match(r"\s*/\*+(.*?)(?:\n\s*\*?\s*\n|\*/)", text, re.S)
        doc = re.sub(r"\n\s*\*", "\n", found.group(1)) if found else ""
    else:
        doc = ast.get_docstring(ast.parse(text, str(path))) or ""
    return " ".join(doc.strip().split("\n\n")[0].split())


def _layer_order(project: dict[str, object], container: str) -> list[str]:
    """The names of a layers contract's modules, top first: the global contract's
    ("pgtarn.app" -> "app"), or a container's ("pgtarn.pool" -> its "registry", ...)."""
    tool = project.get("tool")
    linter = tool.get("importlinter", {}) if isinstance(tool, dict) else {}
    for contract in linter.get("contracts", []):
        if contract.get("type") != "layers":
            continue
        containers = contract.get("containers", [])
        if (container == "pgtarn" and not containers) or containers == [container]:
            names = []
            for layer in contract["layers"]:
                for name in layer.split("|"):
                    names.append(name.strip().removeprefix("pgtarn."))
            return names
    return []


def _ordered(names: list[str], order: list[str]) -> list[str]:
    """names in the contract's order; the others first (what the contract leaves out sits
    at the edges: entry points), then alphabetical."""
    rank = {name: i for i, name in enumerate(order)}
    return sorted(names, key=lambda n: (n in rank, rank.get(n, 0), n))


def _entry(depth: int, name: str, text: str) -> list[str]:
    head = "  " * depth + name
    indent = " " * TEXT_COLUMN
    if len(head) + 2 > TEXT_COLUMN:  # a long name: its text starts on the next line
        return [head, *textwrap.wrap(text, WIDTH, initial_indent=indent, subsequent_indent=indent)]
    lines = textwrap.wrap(
        text, WIDTH, initial_indent=head.ljust(TEXT_COLUMN), subsequent_indent=indent
    )
    return lines or [head]


def _package(directory: Path, depth: int, project: dict[str, object], root: Path) -> list[str]:
    dotted = ".".join(directory.relative_to(root.parent).parts)
    stems = {p.stem: p for p in directory.iterdir() if p.suffix in (".py", ".c")}
    stems.pop("__init__", None)
    packages = {p.name: p for p in directory.iterdir() if (p / "__init__.py").is_file()}
    order = _layer_order(project, dotted)
    lines: list[str] = []
    for name in _ordered([*stems, *packages], order):
        if name in packages:
            sub = packages[name]
            lines += _entry(depth, f"{name}/", summary(sub / "__init__.py"))
            lines += _package(sub, depth + 1, project, root)
            continue
        path = stems[name]
        module = path.relative_to(root.parent).as_posix()
        mark = MARK if module in COMPILED else ""
        lines += _entry(depth, path.name, summary(path) + mark)
    return lines


def tree(repository: Path) -> str:
    """The file list of src/pgtarn/ as ARCHITECTURE.md shows it (a code block)."""
    root = repository / "src" / "pgtarn"
    project = tomllib.loads((repository / "pyproject.toml").read_text(encoding="utf-8"))
    lines = ["src/pgtarn/", *_package(root, 1, project, root)]
    return "```\n" + "\n".join(lines) + "\n```\n"


def render(architecture: Path) -> str:
    """ARCHITECTURE.md with its list made anew from the source beside it."""
    text = architecture.read_text(encoding="utf-8")
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"{architecture}: no {BEGIN!r} ... {END!r} markers")
    made = tree(architecture.parent)
    return f"{text[: start + len(BEGIN)]}\n{made}{text[end:]}"


def stale(architecture: Path) -> bool:
    """Whether ARCHITECTURE.md's list differs from what the modules say now."""
    return render(architecture) != architecture.read_text(encoding="utf-8")


def write(architecture: Path) -> bool:
    """Write the list when it changed; whether it did."""
    if not stale(architecture):
        return False
    architecture.write_text(render(architecture), encoding="utf-8")
    return True
