"""pgtarn.cli.container: the ini and userlist from the environment, the mounted ini, health."""

from __future__ import annotations

import os
import socket
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from pgtarn.auth.md5 import md5_secret
from pgtarn.auth.scram import make_verifier, parse_verifier
from pgtarn.auth.userlist import parse_userlist
from pgtarn.cli.container import (
    MOUNTED_INI,
    EnvConfigError,
    chosen_ini,
    generate,
    health_check,
    main,
)
from pgtarn.config.inifile import parse_config
from pgtarn.config.settings import Config

RUN = "/run/pgtarn"


def _parsed(env: dict[str, str]) -> tuple[Config, dict[str, str]]:
    generated = generate(env, RUN)
    config = parse_config(generated.ini, f"{RUN}/pgbouncer.ini")
    entries, warnings = parse_userlist(generated.userlist)
    assert warnings == []
    return config, entries


def test_database_url_with_percent_encoding() -> None:
    env = {"DATABASE_URL": "postgres://app%40corp:p%40ss%3Aw%2Fd@db.example:6543/my%20db"}
    generated = generate(env, RUN)
    config = parse_config(generated.ini)
    db = config.databases["my db"]
    assert (db.host, db.port, db.dbname) == ("db.example", 6543, "my db")
    entries, _ = parse_userlist(generated.userlist)
    assert entries == {"app@corp": "p@ss:w/d"}


def test_database_url_without_port_uses_5432() -> None:
    config, entries = _parsed({"DATABASE_URL": "postgresql://app:secret@db/app"})
    db = config.databases["app"]
    assert (db.host, db.port) == ("db", 5432)
    assert entries == {"app": "secret"}


def test_database_url_ipv6_host_and_sslmode() -> None:
    config, _ = _parsed({"DATABASE_URL": "postgres://u:p@[::1]:5433/d?sslmode=require"})
    db = config.databases["d"]
    assert (db.host, db.port) == ("::1", 5433)
    assert config.server_tls_sslmode == "require"


def test_database_url_other_scheme_refused_without_echoing_it() -> None:
    with pytest.raises(EnvConfigError) as caught:
        generate({"DATABASE_URL": "mysql://u:hunter2@h/d"}, RUN)
    assert "hunter2" not in str(caught.value)


def test_db_variables_override_the_url() -> None:
    env = {
        "DATABASE_URL": "postgres://u:p@h:1111/d",
        "DB_HOST": "other",
        "DB_PORT": "2222",
        "DB_USER": "v",
        "DB_PASSWORD": "q",
        "DB_NAME": "e",
    }
    config, entries = _parsed(env)
    db = config.databases["e"]
    assert (db.host, db.port, db.dbname) == ("other", 2222, "e")
    assert entries == {"v": "q"}


def test_db_variables_without_a_name_give_the_wildcard_database() -> None:
    config, _ = _parsed({"DB_HOST": "db", "DB_USER": "app", "DB_PASSWORD": "pw"})
    assert set(config.databases) == {"*"}
    assert config.databases["*"].host == "db"


def test_defaults() -> None:
    config, _ = _parsed({"DB_HOST": "db", "DB_USER": "app", "DB_PASSWORD": "pw"})
    assert config.listen_addr == ("*",)
    assert config.listen_port == 6432
    assert config.auth_type == "scram-sha-256"
    assert config.auth_file == f"{RUN}/userlist.txt"
    assert config.unix_socket_dir == RUN
    assert config.admin_users == ("app",)
    assert config.pool_mode == "session"


def test_common_settings_and_prefixed_ones() -> None:
    env = {
        "DB_HOST": "db",
        "DB_USER": "app",
        "DB_PASSWORD": "pw",
        "POOL_MODE": "transaction",
        "DEFAULT_POOL_SIZE": "7",
        "MAX_CLIENT_CONN": "900",
        "LISTEN_PORT": "7000",
        "ADMIN_USERS": "ops,app",
        "PGBOUNCER_MAX_PREPARED_STATEMENTS": "50",
        "PGBOUNCER_WORKERS": "2",
        "METRICS_PORT": "9127",
    }
    config, _ = _parsed(env)
    assert config.pool_mode == "transaction"
    assert config.default_pool_size == 7
    assert config.max_client_conn == 900
    assert config.listen_port == 7000
    assert config.admin_users == ("ops", "app")
    assert config.max_prepared_statements == 50
    assert config.workers == 2
    assert config.metrics_port == 9127


def test_unrelated_environment_is_ignored() -> None:
    env = {
        "DB_HOST": "db",
        "DB_USER": "app",
        "DB_PASSWORD": "pw",
        "PATH": "/bin",
        "USER": "root",
        "HOME": "/root",
        "PGBOUNCER_PATH": "/x",
        "PGBOUNCER_NOPE": "1",
    }
    text = generate(env, RUN).ini
    assert "/bin" not in text and "root" not in text and "/x" not in text
    assert "nope" not in text


def test_a_newline_in_a_value_is_refused() -> None:
    env = {
        "DB_HOST": "db",
        "DB_USER": "app",
        "DB_PASSWORD": "pw",
        "POOL_MODE": "session\nauth_type = trust",
    }
    with pytest.raises(EnvConfigError, match="POOL_MODE"):
        generate(env, RUN)


@pytest.mark.parametrize("auth_type", ["scram-sha-256", "plain"])
def test_scram_and_plain_store_the_password_itself(auth_type: str) -> None:
    env = {"DB_HOST": "db", "DB_USER": "app", "DB_PASSWORD": "pw", "AUTH_TYPE": auth_type}
    config, entries = _parsed(env)
    assert config.auth_type == auth_type
    assert entries == {"app": "pw"}


def test_md5_stores_the_md5_hash() -> None:
    env = {"DB_HOST": "db", "DB_USER": "app", "DB_PASSWORD": "pw", "AUTH_TYPE": "md5"}
    _, entries = _parsed(env)
    assert entries == {"app": md5_secret("pw", "app")}


def test_userlist_secret_scram_stores_a_verifier() -> None:
    env = {
        "DB_HOST": "db",
        "DB_USER": "app",
        "DB_PASSWORD": "plain-secret",
        "USERLIST_SECRET": "scram",
    }
    _, entries = _parsed(env)
    assert "plain-secret" not in entries["app"]
    assert parse_verifier(entries["app"]) is not None


def test_a_stored_secret_is_kept_as_given() -> None:
    verifier = make_verifier("pw").to_string()  # as copied from pg_authid
    env = {"DB_HOST": "db", "DB_USER": "app", "DB_PASSWORD": verifier, "AUTH_TYPE": "md5"}
    _, entries = _parsed(env)
    assert entries == {"app": verifier}


def test_missing_password_is_an_error_naming_the_variable() -> None:
    with pytest.raises(EnvConfigError, match="DB_PASSWORD"):
        generate({"DB_HOST": "db", "DB_USER": "app"}, RUN)


def test_missing_password_is_fine_with_trust() -> None:
    _, entries = _parsed({"DB_HOST": "db", "DB_USER": "app", "AUTH_TYPE": "trust"})
    assert entries == {"app": ""}


def test_no_database_is_an_error() -> None:
    with pytest.raises(EnvConfigError, match="DATABASE_URL or DB_HOST"):
        generate({"POOL_MODE": "transaction"}, RUN)


def test_the_ini_holds_no_password() -> None:
    text = generate({"DATABASE_URL": "postgres://app:s3cr3t@db/app"}, RUN).ini
    assert "s3cr3t" not in text


def test_pgtarn_config_wins_over_everything(tmp_path: Path) -> None:
    env = {"PGTARN_CONFIG": "/somewhere/my.ini", "DATABASE_URL": "postgres://u:p@h/d"}
    assert chosen_ini(env, exists=lambda path: True) == "/somewhere/my.ini"


def test_a_mounted_ini_takes_precedence_over_variables() -> None:
    env = {"DATABASE_URL": "postgres://u:p@h/d"}
    assert chosen_ini(env, exists=lambda path: path == MOUNTED_INI) == MOUNTED_INI
    assert chosen_ini(env, exists=lambda path: False) is None


def _run_main(env: dict[str, str], argv: list[str]) -> tuple[int, list[list[str]]]:
    calls: list[list[str]] = []

    def fake_exec(path: str, args: list[str]) -> None:
        calls.append(args)

    code = main(argv, env=env, execv=fake_exec)
    return code, calls


def test_main_writes_the_files_and_runs_pgtarn(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    env = {"DATABASE_URL": "postgres://app:s3cr3t@db/app", "PGTARN_RUN_DIR": str(run_dir)}
    code, calls = _run_main(env, ["-v"])
    assert code == 0
    ini = str(run_dir / "pgbouncer.ini")
    assert calls and calls[0][-3:] == ["pgtarn", "-v", ini][-3:]
    assert calls[0][-1] == ini and "-v" in calls[0]
    userlist = run_dir / "userlist.txt"
    assert stat.S_IMODE(os.stat(userlist).st_mode) == 0o600
    out = capsys.readouterr()
    assert "s3cr3t" not in out.out + out.err
    assert "db" in out.err  # says what it wrote


def test_main_uses_the_mounted_ini_as_is(tmp_path: Path) -> None:
    ini = tmp_path / "mine.ini"
    ini.write_text("[databases]\n")
    code, calls = _run_main({"PGTARN_CONFIG": str(ini), "PGTARN_RUN_DIR": str(tmp_path / "r")}, [])
    assert code == 0
    assert calls[0][-1] == str(ini)
    assert not (tmp_path / "r").exists()


def test_main_reports_a_bad_environment(capsys: pytest.CaptureFixture[str]) -> None:
    code, calls = _run_main({"DB_HOST": "db", "DB_USER": "app"}, [])
    assert code == 2 and calls == []
    assert "DB_PASSWORD" in capsys.readouterr().err


def test_main_passes_version_on_without_any_configuration() -> None:
    code, calls = _run_main({}, ["--version"])
    assert code == 0
    assert calls[0][1:] == ["-m", "pgtarn", "--version"]


@pytest.fixture
def answering_port() -> Iterator[int]:
    """A listener that answers an SSLRequest with N, as pgtarn without client TLS does."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            assert len(conn.recv(8)) == 8
            conn.sendall(b"N")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield port
    thread.join(timeout=5)
    listener.close()


def test_health_check_passes_when_the_pooler_answers(answering_port: int) -> None:
    assert health_check("127.0.0.1", answering_port, timeout=2.0)


def test_health_check_fails_when_nothing_listens() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    assert not health_check("127.0.0.1", port, timeout=2.0)


def test_health_check_fails_when_the_pooler_does_not_answer() -> None:
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts (backlog), never answers
        assert not health_check("127.0.0.1", silent.getsockname()[1], timeout=0.3)
