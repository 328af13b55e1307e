"""Build pgtarn: the hot-path modules compiled with mypyc when it can, else pure Python.

The modules of COMPILED are what a transaction runs through (framing, relay, link, pool,
statement tracking) and what a login does (SCRAM, the access decision, the runtime's keys).
mypyc turns their type-annotated Python into a C extension that runs the same code two to
three times faster. Pure Python stays the fallback with the same behaviour:

- PGTARN_PURE=1 in the environment, or mypyc missing: nothing is compiled;
- an editable install (pip install -e) is never compiled, since an extension module next to
  its source would shadow every later edit of that source;
- compiling fails (no C compiler, no Python headers): a warning, and the package installs as
  pure Python; none of the compiled modules is kept, since they only load together.

Compiling takes minutes: one line says so as it starts, and how to skip it, on the terminal
as well as in the build's output (which pip shows only with -v).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

COMPILED = [
    "pgtarn/views/states.py",
    "pgtarn/proto/msgtypes.py",
    "pgtarn/proto/framing.py",
    "pgtarn/proto/messages.py",
    "pgtarn/proto/build.py",
    "pgtarn/proto/client_login.py",
    "pgtarn/proto/client_side.py",
    "pgtarn/proto/cancelkey.py",
    "pgtarn/proto/parameters.py",
    "pgtarn/auth/scram.py",
    "pgtarn/pool/idle.py",
    "pgtarn/pool/pool.py",
    "pgtarn/pool/stats.py",
    "pgtarn/pool/waiting.py",
    "pgtarn/session/effects.py",
    "pgtarn/session/fifo.py",
    "pgtarn/session/framer.py",
    "pgtarn/session/prepared.py",
    "pgtarn/session/rewrite.py",
    "pgtarn/session/rows.py",
    "pgtarn/session/statements.py",
    "pgtarn/session/sqlnames.py",
    "pgtarn/session/stale.py",
    "pgtarn/session/tracking.py",
    "pgtarn/net/transport.py",
    "pgtarn/net/sending.py",
    "pgtarn/server/linked.py",
    "pgtarn/server/transport.py",
    "pgtarn/client/extras.py",
    "pgtarn/client/parsers.py",
    "pgtarn/client/access.py",
    "pgtarn/runtime.py",
    "pgtarn/server/relay.py",
    "pgtarn/server/connection.py",
    "pgtarn/server/replication.py",  # subclasses ServerConnection: compiled with it
    "pgtarn/client/transport.py",
    "pgtarn/client/tracking.py",
    "pgtarn/client/listening.py",
    "pgtarn/client/link.py",
    "pgtarn/client/relay.py",
    "pgtarn/client/login.py",
    "pgtarn/client/connection.py",
]

#: The socket receive and sends of pgtarn's own transport (net/transport.py, net/sending.py):
#: plain C, chosen in native/__init__.py, built with the compiled modules and dropped with
#: them when compiling fails.
IO_HELPER = Extension("pgtarn.native._io", ["src/pgtarn/native/_io.c"])
#: A query's shape for the relay's first look at it (session/effects.py): plain C, likewise.
SHAPE_HELPER = Extension("pgtarn.native._shape", ["src/pgtarn/native/_shape.c"])

EDITABLE_COMMANDS = {"editable_wheel", "develop"}

#: Said once as the C compiler starts, which takes minutes with no other sign of life.
COMPILING = (
    "pgtarn: compiling the hot path with mypyc, which takes a few minutes "
    "(PGTARN_PURE=1 skips it: pure Python, same behaviour)"
)


def wanted() -> bool:
    if os.environ.get("PGTARN_PURE", "") not in ("", "0"):
        return False
    return not EDITABLE_COMMANDS & set(sys.argv[1:])


class OptionalBuildExt(build_ext):
    """build_ext that leaves a pure-Python package behind when compiling fails."""

    def run(self) -> None:
        if self.extensions:
            announce(COMPILING)
        try:
            super().run()
        except Exception as exc:  # compiler or headers missing: the pure build is complete
            self._fall_back(exc)

    def _fall_back(self, exc: Exception) -> None:
        announce(f"pgtarn: compiling with mypyc failed ({exc}); installing pure Python")
        for ext in self.extensions:
            Path(self.get_ext_fullpath(ext.name)).unlink(missing_ok=True)
        self.extensions = []


def announce(line: str) -> None:
    """Print `line` where the person installing sees it: pip keeps a build's output to itself
    (shown with -v or on failure), so it also goes to the controlling terminal, if any."""
    print(line, file=sys.stderr, flush=True)
    if sys.stderr.isatty():
        return
    try:
        with open("/dev/tty", "w", encoding="utf-8") as tty:
            tty.write(f"\n{line}\n")
    except OSError:  # no controlling terminal (CI, a container build): stderr is enough
        pass


def extensions() -> list[Any]:
    if not wanted():
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        print("pgtarn: mypyc is not installed; installing pure Python", file=sys.stderr)
        return []
    try:
        compiled = mypycify([f"src/{path}" for path in COMPILED], opt_level="3")
        return [*compiled, IO_HELPER, SHAPE_HELPER]
    except (Exception, SystemExit) as exc:  # mypyc refused the code (its type check exits)
        print(f"pgtarn: mypyc failed ({exc}); installing pure Python", file=sys.stderr)
        return []


setup(ext_modules=extensions(), cmdclass={"build_ext": OptionalBuildExt})
