"""Which build of pgtarn runs: the hot-path modules compiled with mypyc, or pure Python."""

from __future__ import annotations

from importlib.machinery import EXTENSION_SUFFIXES
from importlib.util import find_spec

from .. import COMPATIBLE_VERSION, __version__

#: A module setup.py compiles: an extension module when the build is compiled. Looked up by
#: name (not imported), so that this lowest layer depends on nothing of the package.
_PROBE = "pgtarn.proto.framing"


def build_kind() -> str:
    """ "compiled" when the hot-path modules are mypyc extensions, else "pure Python"."""
    spec = find_spec(_PROBE)
    origin = spec.origin if spec is not None else None
    compiled = origin is not None and origin.endswith(tuple(EXTENSION_SUFFIXES))
    return "compiled" if compiled else "pure Python"


BUILD = build_kind()
#: SHOW VERSION's row, and --version's first line when piped (scripts compare the two).
VERSION_LINE = f"PgBouncer {COMPATIBLE_VERSION} (pgtarn {__version__}, {BUILD})"
#: --version's first line on a terminal, for a person.
HUMAN_VERSION = f"pgtarn {__version__} ({BUILD}), compatible with PgBouncer {COMPATIBLE_VERSION}"


def version_lines(terminal: bool) -> list[str]:
    """What --version prints: a person at a terminal reads pgtarn's line first, while a
    script (stdout piped) finds PgBouncer's line first, the one SHOW VERSION answers."""
    return [HUMAN_VERSION, VERSION_LINE] if terminal else [VERSION_LINE, HUMAN_VERSION]
