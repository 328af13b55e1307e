"""The committed reference pages are what the code makes now, and say what they must."""

from __future__ import annotations

from pathlib import Path

import pytest

from pgtarn.config import inifile as configfile
from pgtarn.config.settings import SETTINGS
from pgtarn.reference import metrics, settings
from pgtarn.reference.__main__ import main
from pgtarn.reference.pages import PAGES

from .test_architecture import make_repository

DOCS = Path(__file__).resolve().parents[3] / "docs" / "reference"


@pytest.mark.parametrize("name", sorted(PAGES))
def test_committed_page_is_up_to_date(name: str) -> None:
    path = DOCS / name
    assert path.exists(), f"{path} missing: run python -m pgtarn.reference"
    assert path.read_text(encoding="utf-8") == PAGES[name](), (
        f"{path} is out of date: run python -m pgtarn.reference and commit the result"
    )


def test_every_setting_has_its_heading_type_default_and_origin() -> None:
    page = settings.render()
    for name, setting in SETTINGS.items():
        block = page.split(f"\n### {name}\n", 1)[1].split("\n### ", 1)[0]
        assert f"- **Default**: {settings.default_of(setting)}\n" in block
        assert ("pgtarn's own" in block) == setting.pgtarn_only, name
        assert ("Read, not applied by pgtarn" in block) == (name in configfile.NOT_APPLIED), name


def test_a_changeable_setting_says_reload_and_another_restart() -> None:
    page = settings.render()
    reload_block = page.split("\n### pool_mode\n", 1)[1].split("\n### ", 1)[0]
    restart_block = page.split("\n### listen_port\n", 1)[1].split("\n### ", 1)[0]
    assert "**Changes**: RELOAD" in reload_block
    assert "**Changes**: restart only" in restart_block


def test_metrics_page_lists_each_family_with_its_exposed_name_and_labels() -> None:
    page = metrics.render()
    families = metrics.families()
    assert len(families) > 40
    for family in families:
        row = next(
            line for line in page.splitlines() if line.startswith(f"| {metrics.exposed(family)} |")
        )
        for label in family.labels:
            assert f"`{label}`" in row, (family.name, label)
    pins = next(f for f in families if f.name == "pgtarn_client_pins")
    assert (pins.type, pins.labels) == ("counter", ("database", "user", "reason"))
    assert "| `pgtarn_client_pins_total` |" in page


def test_check_flags_a_stale_page_and_writing_fixes_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [str(tmp_path), "--man", str(tmp_path / "man" / "pgtarn.1")]
    args += ["--architecture", str(make_repository(tmp_path / "repo"))]
    assert main(["--check", *args]) == 1
    assert "out of date" in capsys.readouterr().out
    assert main(args) == 0
    assert main(["--check", *args]) == 0
    (tmp_path / "metrics.md").write_text("edited by hand\n", encoding="utf-8")
    assert main(["--check", *args]) == 1
    assert main(args) == 0
    (tmp_path / "man" / "pgtarn.1").write_text("edited by hand\n", encoding="utf-8")
    assert main(["--check", *args]) == 1
    assert "pgtarn.1: out of date" in capsys.readouterr().out
