"""The build pgtarn reports (--version, SHOW VERSION, the metrics) is the one running."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import runpy
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

import pgtarn
from pgtarn.native import buildinfo
from pgtarn.native.compiled import COMPILED
from pgtarn.proto import framing

ROOT = Path(__file__).resolve().parents[3]


def test_build_kind_is_what_was_imported() -> None:
    compiled = framing.__file__ is not None and framing.__file__.endswith(tuple(EXTENSION_SUFFIXES))
    assert buildinfo.build_kind() == ("compiled" if compiled else "pure Python")
    assert buildinfo.BUILD in buildinfo.VERSION_LINE


def test_every_compiled_module_is_all_or_none() -> None:
    """Compiled modules load only together (one shared library): a mixed install is a bug."""
    package = Path(pgtarn.__file__).parent
    modules = _compiled_list()
    assert "pgtarn/proto/framing.py" in modules  # buildinfo's probe
    kinds = set()
    for module in modules:
        stem = package.parent / module[: -len(".py")]
        kinds.add(any(Path(str(stem) + suffix).exists() for suffix in EXTENSION_SUFFIXES))
    assert kinds == {buildinfo.BUILD == "compiled"}


def _compiled_list() -> list[str]:
    """native/compiled.py's COMPILED, each a module of the package."""
    for path in COMPILED:
        assert (ROOT / "src" / path).is_file(), path
    return list(COMPILED)


def test_the_compiled_modules_are_listed_once_where_setup_reads_them() -> None:
    """setup.py names no module to compile itself: it reads native/compiled.py (run alone, as
    setup.py runs it, it gives the same list as imported)."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    named = [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and "pgtarn/" in node.value
        and node.value.endswith(".py")
    ]
    assert named == ["src/pgtarn/native/compiled.py"]
    assert runpy.run_path(str(ROOT / named[0]))["COMPILED"] == COMPILED


def test_no_interpreted_class_inherits_from_a_compiled_one() -> None:
    """mypyc's classes cannot be subclassed by interpreted ones: a subclass of a compiled
    class must be compiled too (else the compiled build fails where the pure one works)."""
    compiled = {path[: -len(".py")].replace("/", ".") for path in _compiled_list()}
    offenders = []
    for info in pkgutil.walk_packages(pgtarn.__path__, "pgtarn."):
        if info.name in compiled or info.name.endswith("__main__"):  # (that one runs pgtarn)
            continue
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if not inspect.isclass(value) or value.__module__ != info.name:
                continue
            offenders += [
                f"{info.name}.{name}({base.__module__}.{base.__name__})"
                for base in value.__mro__[1:]
                # (a typing.Protocol stays a Python class: it may be extended)
                if base.__module__ in compiled and not getattr(base, "_is_protocol", 0)
            ]
    assert offenders == []
