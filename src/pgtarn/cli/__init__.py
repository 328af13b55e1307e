"""The command line: `pgtarn CONFIG` with PgBouncer's flags, and its subcommands.

`main` is the `pgtarn` command's entry point (pyproject.toml's [project.scripts]).
"""

from .command import main

__all__ = ["main"]
