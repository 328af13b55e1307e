"""setup.py as someone installing sees it: one line says the compiling starts, on the terminal
even when pip keeps the build's output to itself."""

from __future__ import annotations

import fcntl
import importlib.util
import os
import subprocess
import sys
import termios
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _take_terminal() -> None:
    """In the child: make the pty on stdin its controlling terminal (as a shell's is)."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def _read_all(fd: int) -> str:
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # EIO: every holder of the pty's other end has closed it
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace")


@pytest.mark.skipif(importlib.util.find_spec("mypyc") is None, reason="mypyc not installed")
def test_the_build_says_it_compiles_and_how_to_skip_it_on_the_terminal(tmp_path: Path) -> None:
    """The build's stderr goes to a file, as under pip; the line reaches the terminal too.
    CC=false makes the compiler fail at once, so the test need not wait for it."""
    primary, secondary = os.openpty()
    log = tmp_path / "stderr.log"
    env = {**os.environ, "CC": "false", "PGTARN_PURE": ""}
    with log.open("w") as stderr:
        proc = subprocess.Popen(
            [
                sys.executable,
                "setup.py",
                "build_ext",
                "--build-lib",
                str(tmp_path / "lib"),
                "--build-temp",
                str(tmp_path / "temp"),
            ],
            cwd=ROOT,
            env=env,
            stdin=secondary,
            stdout=secondary,
            stderr=stderr,
            start_new_session=True,
            preexec_fn=_take_terminal,
        )
    os.close(secondary)
    try:
        terminal = _read_all(primary)
        assert proc.wait(timeout=300) == 0
    finally:
        os.close(primary)
        if proc.poll() is None:
            proc.kill()
    said = [line.strip() for line in terminal.splitlines() if "compiling the hot path" in line]
    assert len(said) == 1, terminal
    assert "PGTARN_PURE=1" in said[0] and "few minutes" in said[0]
    assert "installing pure Python" in terminal  # the compiler failed: what happens instead
    assert said[0] in log.read_text()  # and the build's own output keeps it too
    assert not list((tmp_path / "lib").rglob("*.so"))  # nothing half-compiled is left
