"""`pgtarn check CONFIG` run as a CI pipeline or an init container would: a subprocess."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from .certs import make_pki


def check(ini: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pgtarn", "check", str(ini)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_good_configuration_exits_0(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki", ())
    (tmp_path / "userlist.txt").write_text('"app" "secret"\n')
    (tmp_path / "hba.conf").write_text("hostssl all all 127.0.0.1/32 scram-sha-256\n")
    ini = tmp_path / "pgbouncer.ini"
    ini.write_text(f"""\
[databases]
app = host=127.0.0.1 port=5432 dbname=app pool_size=5
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = 6432
auth_type = hba
auth_file = {tmp_path / "userlist.txt"}
auth_hba_file = {tmp_path / "hba.conf"}
client_tls_sslmode = require
client_tls_cert_file = {pki.server.cert}
client_tls_key_file = {pki.server.key}
client_tls_ca_file = {pki.ca}
server_tls_sslmode = verify-full
server_tls_ca_file = {pki.ca}
""")
    result = check(ini)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{ini}: ok" in result.stdout.strip().splitlines()[-1]
    assert not (tmp_path / "pgbouncer.pid").exists()


def test_several_bad_settings_and_a_bad_database_are_all_reported(tmp_path: Path) -> None:
    ini = tmp_path / "bad.ini"
    ini.write_text(
        "[databases]\napp = host=db port=none\n[pgbouncer]\nlisten_port = 70000\n"
        "pool_mode = sometimes\nmax_client_conn = -\n"
    )
    result = check(ini)
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    for lineno, word in ((2, "port"), (4, "listen_port"), (5, "pool_mode"), (6, "max_client_conn")):
        assert any(line.startswith(f"{ini}:{lineno}: ") and word in line for line in lines), (
            result.stdout
        )


def test_a_missing_auth_file_and_a_bad_hba_line(tmp_path: Path) -> None:
    hba = tmp_path / "hba.conf"
    hba.write_text("local all all trust\nhost all all 10.0.0.0/8 whatever\n")
    ini = tmp_path / "p.ini"
    ini.write_text(
        f"[pgbouncer]\nauth_type = hba\nauth_file = {tmp_path / 'gone.txt'}\n"
        f"auth_hba_file = {hba}\n"
    )
    result = check(ini)
    assert result.returncode == 1
    assert f"{ini}:3: auth_file:" in result.stdout and "gone.txt" in result.stdout
    assert f"{hba}:2: " in result.stdout


def test_tls_key_files_missing_or_not_keys(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki", ())
    ini = tmp_path / "tls.ini"
    base = f"[pgbouncer]\nclient_tls_sslmode = require\nclient_tls_cert_file = {pki.server.cert}\n"
    ini.write_text(base + f"client_tls_key_file = {tmp_path / 'absent.key'}\n")
    result = check(ini)
    assert result.returncode == 1
    assert f"{ini}:4: client_tls_key_file:" in result.stdout and "absent.key" in result.stdout
    ini.write_text(base + f"client_tls_key_file = {pki.ca}\n")  # a certificate, not a key
    result = check(ini)
    assert result.returncode == 1 and pki.ca in result.stdout, result.stdout
    assert result.stdout.startswith(f"{ini}:")
    ini.write_text(
        f"[pgbouncer]\nserver_tls_sslmode = require\nserver_tls_cert_file = "
        f"{pki.server.cert}\nserver_tls_key_file = {pki.ca}\n"
    )
    result = check(ini)
    assert result.returncode == 1 and pki.ca in result.stdout, result.stdout


def test_an_included_file_error_names_its_own_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "databases.ini").write_text("[databases]\nok = host=a\nbad = pool_mode=x\n")
    ini = tmp_path / "main.ini"
    ini.write_text("[pgbouncer]\nlisten_port = 6432\n%include databases.ini\n")
    result = check(ini)
    assert result.returncode == 1
    assert result.stdout.startswith(f"{tmp_path / 'databases.ini'}:3: bad: pool_mode")
