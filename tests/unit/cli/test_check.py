"""Tests for pgtarn.cli.check: a configuration checked as startup reads it, every problem listed."""

from __future__ import annotations

from pathlib import Path

import pytest

from pgtarn.cli.check import check_config, run_check


def write_ini(directory: Path, body: str) -> str:
    path = directory / "pgbouncer.ini"
    path.write_text(body)
    return str(path)


def test_a_good_configuration_passes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "userlist.txt").write_text('"app" "secret"\n')
    ini = write_ini(
        tmp_path,
        "[databases]\napp = host=127.0.0.1\n[pgbouncer]\n"
        f"listen_port = 7432\nauth_file = {tmp_path / 'userlist.txt'}\n",
    )
    assert check_config(ini).errors == []
    assert run_check([ini]) == 0
    out = capsys.readouterr().out
    assert out.strip().splitlines()[-1] == f"pgtarn check: {ini}: ok"


def test_files_that_startup_reads_are_checked(tmp_path: Path) -> None:
    (tmp_path / "hba.conf").write_text("host all all 10.0.0.0/8 md5\nhost all all x md5\n")
    (tmp_path / "ident.conf").write_text("map alice\n")
    ini = write_ini(
        tmp_path,
        "[pgbouncer]\n"
        f"auth_file = {tmp_path / 'nobody.txt'}\n"
        "auth_type = hba\n"
        f"auth_hba_file = {tmp_path / 'hba.conf'}\n"
        f"auth_ident_file = {tmp_path / 'ident.conf'}\n"
        "client_tls_sslmode = require\n"
        f"client_tls_key_file = {tmp_path / 'absent.key'}\n"
        f"client_tls_cert_file = {tmp_path / 'ident.conf'}\n",
    )
    errors = check_config(ini).errors
    assert errors[0].startswith(f"{ini}:2: auth_file:") and "nobody.txt" in errors[0]
    assert errors[1].startswith(f"{tmp_path / 'hba.conf'}:2: ")
    assert errors[2].startswith(f"{tmp_path / 'ident.conf'}:1: ")
    assert errors[3].startswith(f"{ini}:7: client_tls_key_file:") and "absent.key" in errors[3]
    assert len(errors) == 4


def test_userlist_warnings_name_their_line(tmp_path: Path) -> None:
    (tmp_path / "userlist.txt").write_text('"app" "secret"\nnot a line\n')
    ini = write_ini(tmp_path, f"[pgbouncer]\nauth_file = {tmp_path / 'userlist.txt'}\n")
    result = check_config(ini)
    assert result.errors == []
    assert any(w.startswith(f"{tmp_path / 'userlist.txt'}:2: ") for w in result.warnings)


def test_a_bad_file_fails_and_lists_everything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ini = write_ini(tmp_path, "[pgbouncer]\nlisten_port = 0\npool_mode = x\nnope = 1\n")
    assert run_check([ini]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"{ini}:2: listen_port")
    assert out[1].startswith(f"{ini}:3: pool_mode")
    assert out[2].startswith(f"{ini}:4: nope: unknown setting")  # startup ignores it
    assert "3 errors" in out[-1]


def test_a_misspelt_setting_is_an_error_with_a_suggestion(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ini = write_ini(
        tmp_path,
        "[databases]\napp = host=127.0.0.1\n[pgbouncer]\n"
        "pool_mod = transaction\nno_such_thing_at_all = 1\n",
    )
    result = check_config(ini)
    assert result.errors == [
        f"{ini}:4: pool_mod: unknown setting, ignored (did you mean pool_mode?)",
        f"{ini}:5: no_such_thing_at_all: unknown setting, ignored",
    ]
    assert not any("unknown setting" in w for w in result.warnings)
    assert run_check([ini]) == 1
    assert "did you mean pool_mode?" in capsys.readouterr().out


def test_pam_needs_a_service_file(tmp_path: Path) -> None:
    ini = write_ini(
        tmp_path, "[pgbouncer]\nauth_type = pam\nauth_pam_service = pgtarn-no-such-service\n"
    )
    result = check_config(ini)
    assert [w for w in result.warnings if "auth_pam_service" in w] == [
        f'{ini}:3: auth_pam_service: no PAM service file "pgtarn-no-such-service" in '
        '/etc/pam.d or /usr/lib/pam.d: PAM uses its "other" service'
    ]
    (tmp_path / "hba.conf").write_text("host all all 127.0.0.1/32 md5\n")
    ini = write_ini(
        tmp_path,
        "[pgbouncer]\nauth_type = hba\n"
        f"auth_hba_file = {tmp_path / 'hba.conf'}\n"
        "auth_pam_service = pgtarn-no-such-service\n",
    )
    assert not [w for w in check_config(ini).warnings if "auth_pam_service" in w]  # no pam rule
    (tmp_path / "hba.conf").write_text("host all all 127.0.0.1/32 pam\n")
    assert [w for w in check_config(ini).warnings if "auth_pam_service" in w]


def test_auth_ldap_options_are_checked_at_their_line(tmp_path: Path) -> None:
    ini = write_ini(
        tmp_path,
        "[pgbouncer]\nauth_type = ldap\n"
        "auth_ldap_options = ldapserver=h ldapprefix=x ldapbasedn=y\n",
    )
    assert check_config(ini).errors == [
        f"{ini}:3: auth_ldap_options: cannot mix options for simple bind and search+bind modes"
    ]
