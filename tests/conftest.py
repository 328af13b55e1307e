"""Shared pytest configuration: marks everything under tests/integration as `integration`."""

from __future__ import annotations

from pathlib import Path

import pytest

_INTEGRATION_DIR = Path(__file__).resolve().parent / "integration"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "integration: needs PostgreSQL server binaries; starts a throwaway cluster "
        "(deselect with -m 'not integration')",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if Path(item.path).resolve().is_relative_to(_INTEGRATION_DIR):
            item.add_marker(pytest.mark.integration)
