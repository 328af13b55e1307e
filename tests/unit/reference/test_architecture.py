"""ARCHITECTURE.md's file list is what the module docstrings say now, in the layers' order."""

from __future__ import annotations

from pathlib import Path

import pytest

from pgtarn.native.compiled import COMPILED
from pgtarn.reference import layout
from pgtarn.reference.__main__ import main

ROOT = Path(__file__).resolve().parents[3]

PYPROJECT = """
[[tool.importlinter.contracts]]
type = "layers"
layers = ["pgtarn.top", "pgtarn.low | pgtarn.pkg"]

[[tool.importlinter.contracts]]
type = "layers"
containers = ["pgtarn.pkg"]
layers = ["upper", "lower"]
"""


def make_repository(root: Path) -> Path:
    """A small repository: pyproject.toml's contracts, src/pgtarn, and ARCHITECTURE.md."""
    package = root / "src" / "pgtarn"
    (package / "pkg").mkdir(parents=True)
    (root / "pyproject.toml").write_text(PYPROJECT, encoding="utf-8")
    files = {
        "__init__.py": '"""The package."""\n',
        "low.py": '"""The bottom layer."""\n',
        "top.py": '"""The top layer: it wraps\nonto a second line.\n\nDetails."""\n',
        "pkg/__init__.py": '"""A package."""\n',
        "pkg/lower.py": '"""Below upper."""\n',
        "pkg/upper.py": '"""Above lower."""\n',
    }
    for name, text in files.items():
        (package / name).write_text(text, encoding="utf-8")
    architecture = root / "ARCHITECTURE.md"
    architecture.write_text(f"# Prose\n{layout.BEGIN}\nold list\n{layout.END}\nMore prose.\n")
    return architecture


def test_the_committed_list_is_up_to_date() -> None:
    architecture = ROOT / "ARCHITECTURE.md"
    assert not layout.stale(architecture), (
        "ARCHITECTURE.md's file list is out of date: run python -m pgtarn.reference"
    )


def test_the_list_follows_the_layers_and_each_summary(tmp_path: Path) -> None:
    architecture = make_repository(tmp_path)
    text = layout.render(architecture)
    assert text.startswith(f"# Prose\n{layout.BEGIN}\n```\nsrc/pgtarn/\n")
    assert text.endswith(f"```\n{layout.END}\nMore prose.\n")
    names = [line.split()[0] for line in text.splitlines() if line.startswith("  ")]
    assert names == ["top.py", "low.py", "pkg/", "upper.py", "lower.py"]
    assert "  top.py                    The top layer: it wraps onto a second line.\n" in text
    assert "Details" not in text


def test_a_changed_docstring_makes_the_list_stale_and_writing_fixes_it(tmp_path: Path) -> None:
    architecture = make_repository(tmp_path)
    assert layout.write(architecture)
    assert not layout.stale(architecture)
    (tmp_path / "src" / "pgtarn" / "low.py").write_text('"""Its job, said anew."""\n')
    assert layout.stale(architecture)
    assert layout.write(architecture)
    assert "Its job, said anew." in architecture.read_text()


def test_check_names_a_stale_list(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    architecture = make_repository(tmp_path)
    args = [str(tmp_path / "ref"), "--man", str(tmp_path / "pgtarn.1")]
    args += ["--architecture", str(architecture)]
    assert main(args) == 0
    assert main(["--check", *args]) == 0
    (tmp_path / "src" / "pgtarn" / "new.py").write_text('"""A module added."""\n')
    assert main(["--check", *args]) == 1
    assert "ARCHITECTURE.md: out of date" in capsys.readouterr().out


def test_every_compiled_module_and_no_other_is_marked() -> None:
    """The list shows the compiled boundary: one mark per module of native/compiled.py."""
    text = layout.tree(ROOT)
    assert text.count(layout.MARK) == len(COMPILED)
    package = text[text.index("\n  pool/ ") :]
    pool = package[package.index("\n    pool.py ") : package.index("\n    split.py ")]
    assert pool.rstrip().endswith(layout.MARK)  # compiled
    state = package[package.index("\n    state.py ") : package.index("\n    channels.py ")]
    assert state.strip() and layout.MARK not in state  # not compiled
