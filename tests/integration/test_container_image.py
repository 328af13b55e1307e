"""The Dockerfile: build the image, run it against the suite's PostgreSQL, stop it (docker)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgtarn.cli.container import health_check
from tests.support import TempCluster, free_port

from .conftest import ITEMS

ROOT = Path(__file__).resolve().parents[2]
TAG = f"pgtarn-test:{os.getpid()}"


def _runtime() -> str | None:
    """docker (or podman) when its daemon answers; None skips these tests."""
    for tool in ("docker", "podman"):
        if shutil.which(tool) is None:
            continue
        try:
            info = subprocess.run([tool, "info"], capture_output=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if info.returncode == 0:
            return tool
    return None


def _run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def image() -> Iterator[tuple[str, str]]:
    """(runtime, tag) of the image built from the repository's Dockerfile."""
    tool = _runtime()
    if tool is None:
        pytest.skip("no working container runtime (docker info / podman info failed)")
    built = _run(tool, "build", "-t", TAG, str(ROOT), timeout=1200)
    assert built.returncode == 0, built.stdout[-4000:] + built.stderr[-4000:]
    yield tool, TAG
    _run(tool, "rmi", "-f", TAG)


def test_image_is_compiled_and_runs_as_a_user_of_its_own(image: tuple[str, str]) -> None:
    tool, tag = image
    version = _run(tool, "run", "--rm", tag, "--version")
    assert version.returncode == 0, version.stderr
    assert "compiled" in version.stdout
    uid = _run(tool, "run", "--rm", "--entrypoint", "id", tag, "-u")
    assert uid.stdout.strip() not in ("", "0")


def test_image_serves_clients_is_healthy_and_stops_on_sigterm(
    image: tuple[str, str], pg_cluster: TempCluster
) -> None:
    tool, tag = image
    port = free_port()
    name = f"pgtarn-test-{os.getpid()}"
    url = f"postgres://app:app_pass@{pg_cluster.host}:{pg_cluster.port}/app"
    started = _run(
        tool,
        "run",
        "-d",
        "--name",
        name,
        "--network",
        "host",
        "--read-only",
        "--tmpfs",
        "/run/pgtarn:uid=10001,gid=10001,mode=0700",
        "--health-interval",
        "1s",
        "--health-start-period",
        "1s",
        "-e",
        f"DATABASE_URL={url}",
        "-e",
        f"LISTEN_PORT={port}",
        "-e",
        "POOL_MODE=transaction",
        tag,
    )
    assert started.returncode == 0, started.stderr
    try:
        deadline = time.monotonic() + 30
        while not health_check("127.0.0.1", port, timeout=0.5):
            assert time.monotonic() < deadline, _run(tool, "logs", name).stderr
            time.sleep(0.2)
        dsn = f"host=127.0.0.1 port={port} dbname=app user=app password=app_pass"
        with psycopg.connect(dsn, autocommit=True) as conn:
            rows = conn.execute("SELECT id, name FROM items ORDER BY id").fetchall()
        assert rows == ITEMS
        while _state(tool, name).get("Health", {}).get("Status") != "healthy":
            assert time.monotonic() < deadline + 30, _state(tool, name)
            time.sleep(0.5)
        stopped = _run(tool, "stop", "--time", "20", name, timeout=60)  # SIGTERM, no client
        assert stopped.returncode == 0, stopped.stderr
        state = _state(tool, name)
        assert state["ExitCode"] == 0, _run(tool, "logs", name).stderr
        logs = _run(tool, "logs", name)
        assert "app_pass" not in logs.stdout + logs.stderr
    finally:
        _run(tool, "rm", "-f", name)


def _state(tool: str, name: str) -> dict[str, Any]:
    inspected = _run(tool, "inspect", "--format", "{{json .State}}", name)
    state: dict[str, Any] = json.loads(inspected.stdout)
    return state
