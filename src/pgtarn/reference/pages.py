"""The generated pages, by file name under docs/reference/, and writing or checking them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from . import console, metrics, settings

PAGES: dict[str, Callable[[], str]] = {
    "settings.md": settings.render,
    "admin-console.md": console.render,
    "metrics.md": metrics.render,
}


def stale(directory: Path) -> list[str]:
    """The pages whose file in `directory` differs from what the code makes now."""
    out = []
    for name, render in PAGES.items():
        path = directory / name
        if not path.exists() or path.read_text(encoding="utf-8") != render():
            out.append(name)
    return out


def write(directory: Path) -> list[str]:
    """Write every page that changed; returns their names."""
    changed = stale(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for name in changed:
        (directory / name).write_text(PAGES[name](), encoding="utf-8")
    return changed
