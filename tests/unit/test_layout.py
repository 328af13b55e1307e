"""The package's shape rules: module and class sizes, module docstrings, no hidden imports.

Sizes are a signal, not a wall: a module past MAX_MODULE_LINES or a class past
MAX_CLASS_LINES is reported as a LayoutWarning unless its docstring has a paragraph
starting with "Long:" that says why its seams are where they are.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "pgtarn"
MODULES = sorted(SRC.rglob("*.py"))
MAX_MODULE_LINES = 600
MAX_CLASS_LINES = 400


class LayoutWarning(UserWarning):
    """A module or class past its size signal with no "Long:" reason in its docstring."""


def _says_why_long(doc: str | None) -> bool:
    return any(line.strip().startswith("Long:") for line in (doc or "").splitlines())


def _report(message: str) -> None:
    # The suite turns warnings into errors; this one is meant to be seen, not to fail.
    with warnings.catch_warnings():
        warnings.simplefilter("default", LayoutWarning)
        warnings.warn(message, LayoutWarning, stacklevel=2)


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), str(path))


def _name(path: Path) -> str:
    return str(path.relative_to(SRC.parent))


def test_the_package_is_found() -> None:
    assert len(MODULES) > 40


@pytest.mark.parametrize("path", MODULES, ids=_name)
def test_module_size(path: Path) -> None:
    lines = len(path.read_text(encoding="utf-8").splitlines())
    if lines > MAX_MODULE_LINES and not _says_why_long(ast.get_docstring(_tree(path))):
        _report(f"{_name(path)}: {lines} lines and no 'Long:' reason in its docstring")


@pytest.mark.parametrize("path", MODULES, ids=_name)
def test_class_size(path: Path) -> None:
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.ClassDef):
            assert node.end_lineno is not None
            size = node.end_lineno - node.lineno + 1
            if size > MAX_CLASS_LINES and not _says_why_long(ast.get_docstring(node)):
                _report(f"{_name(path)}: class {node.name}: {size} lines and no 'Long:' reason")


@pytest.mark.parametrize("path", MODULES, ids=_name)
def test_module_opens_with_a_docstring_saying_its_job(path: Path) -> None:
    doc = ast.get_docstring(_tree(path))
    assert doc, f"{_name(path)}: no module docstring"
    first = doc.splitlines()[0]
    assert first.strip() and len(first) <= 100, f"{_name(path)}: {first!r}"


@pytest.mark.parametrize("path", MODULES, ids=_name)
def test_no_function_level_import_of_the_package(path: Path) -> None:
    for func in ast.walk(_tree(path)):
        if not isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        if func.name.startswith("load_") and "memory" in (ast.get_docstring(func) or ""):
            continue  # the one lazy import of a dependency, for the memory its docstring says
        for node in ast.walk(func):
            if isinstance(node, ast.ImportFrom):
                inner = node.level > 0 or (node.module or "").startswith("pgtarn")
            elif isinstance(node, ast.Import):
                inner = any(a.name.startswith("pgtarn") for a in node.names)
            else:
                continue
            assert not inner, f"{_name(path)}:{node.lineno}: import inside {func.name}()"


def test_start_imports_no_dependency_that_only_some_configurations_use() -> None:
    """pglast (a text to parse), prometheus_client (metrics_port), ldap3 (an LDAP check),
    ctypes (a PAM check), urllib.parse (an LDAP URL), difflib (a misspelt setting), argparse
    (a command line that is not plain), the demo and top are loaded on first use (the load_*
    functions): a pooler that needs none of them does not hold them. Only what importing
    pgtarn brings counts: the interpreter's start (site and its .pth files) may have imported
    some of them already."""
    code = (
        "import sys; before = set(sys.modules); import pgtarn.cli; "
        "print(' '.join(m for m in ('pglast', 'prometheus_client', 'pgtarn.demo', "
        "'pgtarn.session.parsing', 'pgtarn.admin.metrics', 'pgtarn.process.supervisor', "
        "'pgtarn.workers.link', 'json', 'pgtarn.top', 'rich', 'psycopg', 'ldap3', "
        "'ctypes', 'urllib.parse', 'difflib', 'argparse') "
        "if m in sys.modules and m not in before))"
    )
    env = {**os.environ, "PYTHONPATH": str(SRC.parent)}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == ""


def test_a_long_module_without_a_reason_is_reported_and_one_with_a_reason_is_not() -> None:
    assert _says_why_long("One job.\n\nLong: the scanner's states are one table.")
    assert not _says_why_long("One job.\n\nIt is long.")
    with pytest.warns(LayoutWarning, match="no 'Long:' reason"):
        _report("x.py: 700 lines and no 'Long:' reason in its docstring")
