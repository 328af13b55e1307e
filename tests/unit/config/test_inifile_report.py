"""Tests for configfile's collecting mode: every error of a pgbouncer.ini, each with file:line."""

from __future__ import annotations

from pathlib import Path

import pytest

from pgtarn.config.inifile import load_config, parse_config, parse_config_report, read_config_report
from pgtarn.errors import ConfigError, Problems

SEVERAL_ERRORS = """\
[databases]
good = host=db1 dbname=app
bad = host=db2 pool_size=lots
also_bad = hots=db3

[users]
alice = pool_mode=sometimes

[nonsense]
ignored_because_the_section_is_bad = 1

[pgbouncer]
listen_port = 99999
pool_mode = transaction
default_pool_size = many
this line has no equals sign
auth_type = md5
no_such_setting = 1
"""


def test_every_error_is_collected_with_its_line() -> None:
    report = parse_config_report(SEVERAL_ERRORS, "/etc/pgtarn/p.ini")
    located = [error.split(": ", 1)[0] for error in report.errors]
    assert located == [f"/etc/pgtarn/p.ini:{n}" for n in (3, 4, 7, 9, 13, 15, 16)]
    assert "lots" in report.errors[0] and "hots" in report.errors[1]
    assert "pool_mode" in report.errors[2] and "nonsense" in report.errors[3]
    assert "listen_port" in report.errors[4] and "default_pool_size" in report.errors[5]


def test_what_could_be_read_is_kept() -> None:
    report = parse_config_report(SEVERAL_ERRORS, "p.ini")
    assert list(report.config.databases) == ["good"]
    assert report.config.pool_mode == "transaction" and report.config.auth_type == "md5"
    assert report.origins["auth_type"] == "p.ini:17"
    assert any("no_such_setting" in w and "p.ini:18" in w for w in report.config.warnings)


def test_raising_mode_still_stops_at_the_first_error() -> None:
    with pytest.raises(ConfigError, match=r"^p\.ini:3: bad: invalid integer .lots."):
        parse_config(SEVERAL_ERRORS, "p.ini")


def test_a_good_file_has_no_errors() -> None:
    report = parse_config_report("[pgbouncer]\nlisten_port = 7000\n", "ok.ini")
    assert report.errors == () and report.config.listen_port == 7000
    assert report.origins == {"listen_port": "ok.ini:2"}


def test_an_included_file_reports_its_own_lines(tmp_path: Path) -> None:
    (tmp_path / "dbs.ini").write_text("[databases]\nok = host=a\nbroken = port=x\n")
    (tmp_path / "main.ini").write_text(
        "[pgbouncer]\n%include dbs.ini\n%include missing.ini\n[pgbouncer]\nlisten_port = 0\n"
    )
    report = read_config_report(str(tmp_path / "main.ini"))
    assert report.errors[0].startswith(f"{tmp_path / 'dbs.ini'}:3: broken: port")
    assert report.errors[1].startswith(f"{tmp_path / 'main.ini'}:3: %include: cannot read")
    assert report.errors[2].startswith(f"{tmp_path / 'main.ini'}:5: listen_port")
    assert len(report.errors) == 3 and list(report.config.databases) == ["ok"]
    with pytest.raises(ConfigError, match=r"dbs\.ini:3: broken"):
        load_config(str(tmp_path / "main.ini"))


def test_an_unreadable_file_is_one_error(tmp_path: Path) -> None:
    report = read_config_report(str(tmp_path / "absent.ini"))
    assert len(report.errors) == 1 and "cannot read" in report.errors[0]


def test_problems_raise_or_collect() -> None:
    with pytest.raises(ConfigError, match="first"):
        Problems().add(ConfigError("first"))
    kept = Problems(collect=True)
    kept.add(ConfigError("first"))
    kept.add(ConfigError("second"))
    assert kept.errors == ["first", "second"]
