"""`python -m pgtarn.reference [--check] [DIR]`: write the reference pages (or check them)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .pages import PAGES, stale, write


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pgtarn.reference",
                                     description="Generate docs/reference/ from the code.")
    parser.add_argument("directory", nargs="?", default="docs/reference", type=Path,
                        help="where the pages go (default: docs/reference)")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 if a page is not up to date")
    args = parser.parse_args(argv)
    if args.check:
        old = stale(args.directory)
        for name in old:
            print(f"{args.directory / name}: out of date; run python -m pgtarn.reference")
        return 1 if old else 0
    for name in write(args.directory):
        print(f"wrote {args.directory / name}")
    print(f"{len(PAGES)} pages up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
