"""The test harness (tests/support) for the bench scripts, which run without an install.

`python3 bench/run.py` puts bench/ on sys.path, not the repository root, so `tests.support`
would not import; this module adds the root (after bench/ itself) and names what the bench
scripts use. pgtarn itself must be importable as usual (`pip install -e .`).
"""

import sys
from pathlib import Path

REPO_ROOT = str(Path(__file__).resolve().parent.parent)
if REPO_ROOT not in sys.path:
    sys.path.insert(1, REPO_ROOT)

from tests.support import (  # noqa: E402  (needs REPO_ROOT on sys.path first)
    PostgresNotFound,
    TempCluster,
    find_bindir,
    free_port,
    userlist_line,
)

__all__ = ["PostgresNotFound", "TempCluster", "find_bindir", "free_port", "userlist_line"]
