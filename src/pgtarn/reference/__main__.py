"""`python -m pgtarn.reference [--check] [DIR] [--man PATH] [--architecture PATH]`: write the
reference pages, the man page and ARCHITECTURE.md's file list (or check they are up to date)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import layout, man
from .pages import PAGES, stale, write


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pgtarn.reference", description="Generate docs/reference/ from the code."
    )
    parser.add_argument(
        "directory",
        nargs="?",
        default="docs/reference",
        type=Path,
        help="where the pages go (default: docs/reference)",
    )
    parser.add_argument(
        "--man",
        default="contrib/pgtarn.1",
        type=Path,
        metavar="PATH",
        help="where the man page pgtarn(1) goes (default: contrib/pgtarn.1)",
    )
    parser.add_argument(
        "--architecture",
        default="ARCHITECTURE.md",
        type=Path,
        metavar="PATH",
        help="the file whose list of modules is made from their docstrings, with the source "
        "tree beside it (default: ARCHITECTURE.md)",
    )
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if a page is not up to date"
    )
    args = parser.parse_args(argv)
    man_page = man.render()
    man_stale = not args.man.exists() or args.man.read_text(encoding="utf-8") != man_page
    if args.check:
        old = [args.directory / name for name in stale(args.directory)]
        old += [args.man] if man_stale else []
        old += [args.architecture] if layout.stale(args.architecture) else []
        for path in old:
            print(f"{path}: out of date; run python -m pgtarn.reference")
        return 1 if old else 0
    for name in write(args.directory):
        print(f"wrote {args.directory / name}")
    if man_stale:
        args.man.parent.mkdir(parents=True, exist_ok=True)
        args.man.write_text(man_page, encoding="utf-8")
        print(f"wrote {args.man}")
    if layout.write(args.architecture):
        print(f"wrote {args.architecture}")
    print(f"{len(PAGES)} pages, the man page and {args.architecture}'s file list up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
