"""Without its `top` extra (rich, psycopg), `pgtarn top` says how to install it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[3] / "src"


@pytest.mark.parametrize("package", ["rich", "psycopg"])
def test_top_without_its_extra_names_the_pip_install(package: str) -> None:
    code = (
        f"import sys; sys.modules[{package!r}] = None; "  # makes `import` fail
        "from pgtarn.cli import main; sys.exit(main(['top', '--once']))"
    )
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 1
    assert package in result.stderr and "pip install 'pgtarn[top]'" in result.stderr
    assert "Traceback" not in result.stderr
