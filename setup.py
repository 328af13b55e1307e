"""Build pgtarn: the hot-path modules compiled with mypyc when it can, else pure Python.

The modules of COMPILED (listed in src/pgtarn/native/compiled.py, which says why those) are
what a transaction runs through and what a login does. mypyc turns their type-annotated
Python into a C extension that runs the same code two to three times faster. Pure Python
stays the fallback with the same behaviour:

- PGTARN_PURE=1 in the environment, or mypyc missing: nothing is compiled;
- an editable install (pip install -e) is never compiled, since an extension module next to
  its source would shadow every later edit of that source;
- compiling fails (no C compiler, no Python headers): a warning, and the package installs as
  pure Python; none of the compiled modules is kept, since they only load together;
- only native/_scram.c fails (no OpenSSL headers): a warning, and the rest is kept compiled.

Compiling takes minutes: one line says so as it starts, and how to skip it, on the terminal
as well as in the build's output (which pip shows only with -v).
"""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path
from typing import Any

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

#: The modules mypyc compiles, listed once in the package, where the tree shows them.
COMPILED: list[str] = list(runpy.run_path("src/pgtarn/native/compiled.py")["COMPILED"])

#: The socket receive and sends of pgtarn's own transport (net/transport.py, net/sending.py):
#: plain C, chosen in native/__init__.py, built with the compiled modules and dropped with
#: them when compiling fails.
IO_HELPER = Extension("pgtarn.native._io", ["src/pgtarn/native/_io.c"])
#: A query's shape for the relay's first look at it (session/effects.py): plain C, likewise.
SHAPE_HELPER = Extension("pgtarn.native._shape", ["src/pgtarn/native/_shape.c"])
#: A StartupMessage's parameters (proto/messages.py): plain C, likewise.
STARTUP_HELPER = Extension("pgtarn.native._startup", ["src/pgtarn/native/_startup.c"])
#: The check of a SCRAM client-final-message (auth/scram.py): C on OpenSSL's SHA-256, likewise;
#: left out alone, with a word, where the OpenSSL headers (libssl-dev) are missing.
SCRAM_HELPER = Extension(
    "pgtarn.native._scram", ["src/pgtarn/native/_scram.c"], libraries=["crypto"]
)
#: Said when SCRAM_HELPER does not build: the rest of the compiled build is kept.
NO_SCRAM_HELPER = (
    "pgtarn: native/_scram.c did not build ({exc}); are the OpenSSL headers installed "
    "(libssl-dev)? SCRAM's messages are read and checked in Python: the same behaviour, "
    "more CPU per login"
)

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

    def build_extension(self, ext: Any) -> None:
        if ext.name != SCRAM_HELPER.name:
            super().build_extension(ext)
            return
        try:
            super().build_extension(ext)
        except Exception as exc:  # OpenSSL's headers or library missing: this one alone
            announce(NO_SCRAM_HELPER.format(exc=exc))

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
        return [*compiled, IO_HELPER, SHAPE_HELPER, STARTUP_HELPER, SCRAM_HELPER]
    except (Exception, SystemExit) as exc:  # mypyc refused the code (its type check exits)
        print(f"pgtarn: mypyc failed ({exc}); installing pure Python", file=sys.stderr)
        return []


setup(ext_modules=extensions(), cmdclass={"build_ext": OptionalBuildExt})
