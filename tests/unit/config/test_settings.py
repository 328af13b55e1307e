"""Tests for pgtarn.config.settings: reading pgbouncer.ini as PgBouncer does."""

from __future__ import annotations

import dataclasses
import os
import string
from pathlib import Path
from typing import Any, cast

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pgtarn.config.inifile import load_config, parse_config, parse_connstr, quote_connstr_value
from pgtarn.config.settings import SETTINGS, Config, DatabaseEntry
from pgtarn.errors import ConfigError

REALISTIC = """\
;; a realistic pgbouncer.ini
[databases]
; TCP database with everything set
main = host=db.local port=5433 dbname=maindb user=app password=s3cret pool_size=40 pool_mode=session
reports = host = 10.0.0.5  dbname = rep  min_pool_size=2 reserve_pool=3 max_db_connections=50
# unix socket directory
local = host=/run/pg dbname=localdb connect_query='SELECT 1' client_encoding=UTF8 timezone=UTC
ha = host=pg1,pg2,pg3 application_name=billing datestyle=ISO
"quoted db" = host=q
* = host=fallback.example.com port=6000

[users]
alice = pool_mode=statement pool_size=7 max_user_connections=10
bob = reserve_pool_size=2 query_timeout=1.5 client_idle_timeout=30

[pgbouncer]
logfile = /var/log/pgbouncer/pgbouncer.log
pidfile = /var/run/pgbouncer/pgbouncer.pid
listen_addr = *, 127.0.0.1,::1
listen_port = 6543
unix_socket_dir = /var/run/postgresql
unix_socket_mode = 0700
auth_type = scram-sha-256
auth_file = /etc/pgbouncer/userlist.txt
admin_users = postgres, admin
stats_users = stats,postgres
pool_mode = session
server_reset_query = DISCARD ALL
ignore_startup_parameters = extra_float_digits, options
max_client_conn = 1000
default_pool_size = 25
log_connections = 0
server_round_robin = 1
server_idle_timeout = 60.5
query_wait_timeout = 0
client_tls_sslmode = require
client_tls_key_file = /etc/pgbouncer/key.pem
client_tls_cert_file = /etc/pgbouncer/cert.pem
"""


def write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


@pytest.fixture
def realistic(tmp_path: Path) -> Config:
    return load_config(write(tmp_path / "pgbouncer.ini", REALISTIC))


def error_of(text: str, path: str = "pgbouncer.ini") -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(text, path)
    return str(info.value)


# ---------------------------------------------------------------- defaults


def test_defaults_match_pgbouncer() -> None:
    c = Config.default()
    assert c.listen_addr == ()
    assert c.listen_port == 6432
    assert c.unix_socket_dir == "/tmp"
    assert c.unix_socket_mode == 0o777
    assert c.auth_type == "md5"
    assert c.pool_mode == "session"
    assert c.max_client_conn == 100
    assert c.default_pool_size == 20
    assert c.min_pool_size == 0
    assert c.reserve_pool_timeout == 5.0
    assert c.server_reset_query == "DISCARD ALL"
    assert c.server_reset_query_always is False
    assert c.server_check_delay == 30.0
    assert c.server_lifetime == 3600.0
    assert c.server_idle_timeout == 600.0
    assert c.server_connect_timeout == 15.0
    assert c.client_login_timeout == 60.0
    assert c.query_wait_timeout == 120.0
    assert c.cancel_wait_timeout == 10.0
    assert c.query_timeout == 0.0
    assert c.track_extra_parameters == ("IntervalStyle",)
    assert c.max_prepared_statements == 200
    assert c.scram_iterations == 4096
    assert c.log_connections and c.log_disconnections and c.log_pooler_errors and c.log_stats
    assert c.client_tls_sslmode == "disable"
    assert c.server_tls_sslmode == "prefer"
    assert c.pkt_buf == 4096
    assert c.max_packet_size == 2147483647
    assert c.listen_backlog == 128
    assert c.sbuf_loopcnt == 5
    assert c.tcp_keepalive is True
    assert c.peer_id == 0
    assert c.workers == 1 and c.log_format == "text"
    assert c.databases == {} and c.users == {} and c.warnings == ()


def test_settings_table_matches_config_fields() -> None:
    c = Config.default()
    for name, s in SETTINGS.items():
        assert getattr(c, name) == s.default
        assert s.parse(s.format(s.default)) == s.default, name
    assert SETTINGS["listen_port"].changeable is False
    assert SETTINGS["pool_mode"].changeable is True
    assert SETTINGS["workers"].pgtarn_only


def test_empty_config_only_warns_about_missing_section() -> None:
    c = parse_config("")
    assert len(c.warnings) >= 1
    assert any("[pgbouncer]" in w for w in c.warnings)


# ---------------------------------------------------------------- realistic file


def test_realistic_pgbouncer_section(realistic: Config) -> None:
    c = realistic
    assert c.listen_addr == ("*", "127.0.0.1", "::1")
    assert c.listen_port == 6543
    assert c.unix_socket_dir == "/var/run/postgresql"
    assert c.unix_socket_mode == 0o700
    assert c.auth_type == "scram-sha-256"
    assert c.admin_users == ("postgres", "admin")
    assert c.stats_users == ("stats", "postgres")
    assert c.ignore_startup_parameters == ("extra_float_digits", "options")
    assert c.max_client_conn == 1000
    assert c.default_pool_size == 25
    assert c.log_connections is False
    assert c.server_round_robin is True
    assert c.server_idle_timeout == 60.5
    assert c.query_wait_timeout == 0.0
    assert c.client_tls_sslmode == "require"
    assert c.logfile == "/var/log/pgbouncer/pgbouncer.log"
    # the one PgBouncer setting of it that pgtarn reads and does not act on says so
    assert [w.split(": ", 1)[1] for w in c.warnings] == [
        "server_round_robin: not applied: idle servers are reused most recently used first"
    ]


def test_realistic_databases(realistic: Config) -> None:
    dbs = realistic.databases
    assert list(dbs) == ["main", "reports", "local", "ha", "quoted db", "*"]
    main = dbs["main"]
    assert (main.host, main.port, main.dbname, main.user) == ("db.local", 5433, "maindb", "app")
    assert main.password == "s3cret"
    assert main.pool_size == 40 and main.pool_mode == "session"
    assert main.line.endswith("pgbouncer.ini:4")
    assert "password=s3cret" in main.connstr

    rep = dbs["reports"]
    assert (rep.host, rep.port, rep.dbname) == ("10.0.0.5", 5432, "rep")
    assert (rep.min_pool_size, rep.reserve_pool_size, rep.max_db_connections) == (2, 3, 50)
    assert rep.user is None and rep.password is None and rep.pool_size is None

    local = dbs["local"]
    assert local.host == "/run/pg" and local.is_unix_socket
    assert local.connect_query == "SELECT 1"
    assert dict(local.startup_params) == {"client_encoding": "UTF8", "TimeZone": "UTC"}

    ha = dbs["ha"]
    assert ha.hosts == ("pg1", "pg2", "pg3") and ha.host == "pg1"
    assert ha.dbname == "ha"  # defaults to the entry name
    assert dict(ha.startup_params) == {"application_name": "billing", "DateStyle": "ISO"}
    assert not ha.is_unix_socket

    assert dbs["quoted db"].host == "q"


def test_database_without_host_uses_unix_socket() -> None:
    c = parse_config("[databases]\nfoodb =\n[pgbouncer]\n")
    assert c.databases["foodb"].host is None
    assert c.databases["foodb"].hosts == ()
    assert c.databases["foodb"].is_unix_socket
    assert c.databases["foodb"].dbname == "foodb"


def test_realistic_users(realistic: Config) -> None:
    alice = realistic.users["alice"]
    assert (alice.pool_mode, alice.pool_size, alice.max_user_connections) == ("statement", 7, 10)
    bob = realistic.users["bob"]
    assert bob.reserve_pool_size == 2 and bob.query_timeout == 1.5
    assert bob.client_idle_timeout == 30.0 and bob.pool_mode is None


def test_pgtarn_section_alias_and_case_insensitive_keys() -> None:
    c = parse_config("[pgtarn]\nLISTEN_PORT = 7000\nPool_Mode = Transaction\nauth_type = any\n")
    assert c.listen_port == 7000
    assert c.pool_mode == "transaction"
    assert c.auth_type == "any"
    assert c.warnings == ()


def test_names_are_case_sensitive() -> None:
    c = parse_config("[databases]\nMyDB = host=a\nmydb = host=b\n[users]\nBob = pool_size=1\n")
    assert c.databases["MyDB"].host == "a" and c.databases["mydb"].host == "b"
    assert "Bob" in c.users and "bob" not in c.users


def test_users_take_query_wait_timeout_and_transaction_timeout() -> None:
    """PgBouncer 1.25's [users] keys: every one of them is read (an unknown one would fail
    the start or a RELOAD)."""
    c = parse_config(
        "[users]\nu = query_wait_timeout=1.5 transaction_timeout=0\n"
        "all = pool_mode=session pool_size=2 reserve_pool_size=1 "
        "max_user_connections=3 max_user_client_connections=4 query_timeout=5 "
        "query_wait_timeout=6 idle_transaction_timeout=7 transaction_timeout=8 "
        "client_idle_timeout=9\n"
    )
    u = c.users["u"]
    assert (u.query_wait_timeout, u.transaction_timeout) == (1.5, 0.0)
    assert u.query_timeout is None and u.pool_size is None
    every = c.users["all"]
    assert (
        every.pool_mode,
        every.pool_size,
        every.reserve_pool_size,
        every.max_user_connections,
        every.max_user_client_connections,
    ) == ("session", 2, 1, 3, 4)
    assert (
        every.query_timeout,
        every.query_wait_timeout,
        every.idle_transaction_timeout,
        every.transaction_timeout,
        every.client_idle_timeout,
    ) == (5, 6, 7, 8, 9)


def test_duplicate_key_later_wins() -> None:
    c = parse_config("[pgbouncer]\nlisten_port = 1111\nlisten_port = 2222\n")
    assert c.listen_port == 2222


def test_value_taken_literally_to_end_of_line() -> None:
    c = parse_config("[pgbouncer]\nserver_reset_query = DISCARD ALL; -- not a comment  \n")
    assert c.server_reset_query == "DISCARD ALL; -- not a comment"


def test_value_types() -> None:
    c = parse_config(
        "[pgbouncer]\nlog_stats = off\nsyslog = yes\nso_reuseport = true\n"
        "max_client_conn = 0x10\nserver_lifetime = 1e3\nlog_format = JSON\n"
    )
    assert (c.log_stats, c.syslog, c.so_reuseport) == (False, True, True)
    assert c.max_client_conn == 16
    assert c.server_lifetime == 1000.0
    assert c.log_format == "json"


def test_peers_section() -> None:
    c = parse_config(
        "[peers]\n1 = host=/tmp/p1\n2 = host=10.0.0.2 port=6433 pool_size=3\n"
        "[pgbouncer]\npeer_id = 1\n",
        "pgb.ini",
    )
    assert c.peer_id == 1
    assert sorted(c.peers) == [1, 2]
    one, two = c.peers[1], c.peers[2]
    assert (one.host, one.port, one.pool_size, one.line) == ("/tmp/p1", 6432, None, "pgb.ini:2")
    assert (two.host, two.port, two.pool_size) == ("10.0.0.2", 6433, 3)
    assert c.peer_pool_size_for(one) == c.default_pool_size
    assert c.peer_pool_size_for(two) == 3
    assert not any("peer" in w for w in c.warnings)


def test_peers_without_peer_id_warns() -> None:
    c = parse_config("[peers]\n2 = host=h\n[pgbouncer]\n", "pgb.ini")
    assert c.peer_id == 0 and list(c.peers) == [2]
    assert any("peer_id" in w and "not forwarded" in w for w in c.warnings)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("0 = host=h", "peer_id out of range"),
        ("16384 = host=h", "peer_id out of range"),
        ("x = host=h", "a peer's name is its peer_id"),
        ("1 = host=h dbname=x", "unknown peer parameter 'dbname'"),
        ("1 = host=h port=0", "port: invalid port"),
        ("1 = host=h port=70000", "port: invalid port"),
        ("1 = host=h pool_size=0", "pool_size: must be >= 1"),
        ("1 = host=h pool_size=-1", "pool_size: must be >= 0"),
        ("1 = host=h pool_size=many", "invalid integer"),
    ],
)
def test_peers_errors(line: str, message: str) -> None:
    with pytest.raises(ConfigError, match=r"pgb\.ini:2: ") as info:
        parse_config(f"[peers]\n{line}\n", "pgb.ini")
    assert message in str(info.value)


@pytest.mark.parametrize("value", ["-1", "16384", "abc"])
def test_peer_id_errors(value: str) -> None:
    with pytest.raises(ConfigError, match="peer_id"):
        parse_config(f"[pgbouncer]\npeer_id = {value}\n", "pgb.ini")


def test_peer_id_changes_only_at_restart() -> None:
    assert not SETTINGS["peer_id"].changeable
    assert SETTINGS["peer_id"].default == 0


# ---------------------------------------------------------------- %include


def test_include_relative_to_including_file(tmp_path: Path) -> None:
    sub = tmp_path / "conf.d"
    sub.mkdir()
    write(sub / "dbs.ini", "[databases]\nincluded = host=inc\n%include more.ini\n")
    write(sub / "more.ini", "deeper = host=deep\n")
    main = write(
        tmp_path / "pgbouncer.ini",
        "[pgbouncer]\nlisten_port = 1\n%include conf.d/dbs.ini\n[pgbouncer]\nlisten_port = 2\n",
    )
    c = load_config(main)
    assert c.databases["included"].host == "inc"
    assert c.databases["deeper"].line == f"{sub / 'more.ini'}:1"
    assert c.listen_port == 2


def test_include_loop_detected(tmp_path: Path) -> None:
    write(tmp_path / "a.ini", "[pgbouncer]\n%include b.ini\n")
    write(tmp_path / "b.ini", "%include a.ini\n")
    with pytest.raises(ConfigError, match=r"b\.ini:1: %include: include loop"):
        load_config(str(tmp_path / "a.ini"))


def test_include_self_loop_from_parse_config(tmp_path: Path) -> None:
    path = write(tmp_path / "self.ini", "%include self.ini\n")
    with pytest.raises(ConfigError, match="include loop"):
        parse_config("%include self.ini\n", path)


def test_include_depth_limited(tmp_path: Path) -> None:
    for i in range(12):
        write(tmp_path / f"f{i}.ini", f"%include f{i + 1}.ini\n")
    write(tmp_path / "f12.ini", "[pgbouncer]\n")
    with pytest.raises(ConfigError, match="nesting"):
        load_config(str(tmp_path / "f0.ini"))


def test_include_missing_file(tmp_path: Path) -> None:
    path = write(tmp_path / "pgbouncer.ini", "[pgbouncer]\n%include nope.ini\n")
    with pytest.raises(ConfigError, match=r"pgbouncer\.ini:2: %include: cannot read"):
        load_config(path)


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(os.path.join(str(tmp_path), "absent.ini"))


# ---------------------------------------------------------------- errors name file:line:key


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[pgbouncer]\n\nlisten_port = abc\n", "pgbouncer.ini:3: listen_port: invalid integer"),
        ("[pgbouncer]\nlog_stats = maybe\n", "pgbouncer.ini:2: log_stats: invalid boolean 'maybe'"),
        ("[pgbouncer]\npool_mode = sometimes\n", "pgbouncer.ini:2: pool_mode: invalid value"),
        ("[pgbouncer]\nauth_type = crypt\n", "pgbouncer.ini:2: auth_type: invalid value"),
        ("[pgbouncer]\nlisten_port = 70000\n", "pgbouncer.ini:2: listen_port: value 70000 out"),
        ("[pgbouncer]\nmax_client_conn = -5\n", "pgbouncer.ini:2: max_client_conn: value -5 out"),
        ("[pgbouncer]\nserver_lifetime = 5min\n", "pgbouncer.ini:2: server_lifetime: invalid time"),
        ("[pgbouncer]\nunix_socket_mode = 0999\n", "pgbouncer.ini:2: unix_socket_mode: invalid"),
        ("[pgbouncer]\n[bogus]\n", "pgbouncer.ini:2: [bogus]: unknown section"),
        ("[databases]\nd = host=x pool_mode=fast\n", "pgbouncer.ini:2: d: pool_mode: invalid"),
        ("[databases]\nd = foo=1\n", "pgbouncer.ini:2: d: unknown connection parameter 'foo'"),
        ("[databases]\nd = host=x password='oops\n", "pgbouncer.ini:2: d: password: unterminated"),
        ("[databases]\nd = host=x port=0\n", "pgbouncer.ini:2: d: port: invalid port"),
        ("[databases]\nd = host=x pool_size=ten\n", "pgbouncer.ini:2: d: invalid integer 'ten'"),
        ("[databases]\nd = port=1 host=\n", "pgbouncer.ini:2: d: host: empty value"),
        ("[databases]\nd = host\n", "pgbouncer.ini:2: d: syntax error"),
        ("[databases]\npgbouncer = host=x\n", "pgbouncer.ini:2: pgbouncer: database name"),
        ("[users]\nu = max_user_connections=x\n", "pgbouncer.ini:2: u: invalid integer 'x'"),
        ("[users]\nu = host=x\n", "pgbouncer.ini:2: u: unknown user parameter 'host'"),
        ("[users]\nu = query_wait_timeout=-1\n", "pgbouncer.ini:2: u: invalid time '-1'"),
        ("[users]\nu = transaction_timeout=1h\n", "pgbouncer.ini:2: u: invalid time '1h'"),
        ("listen_port = 1\n", "pgbouncer.ini:1: listen_port: setting outside of any section"),
        ("[pgbouncer]\njust some words\n", "pgbouncer.ini:2: syntax error"),
        ("[pgbouncer\n", "pgbouncer.ini:1: syntax error in section header"),
    ],
)
def test_errors_name_file_line_and_key(text: str, expected: str) -> None:
    assert expected in error_of(text)


def test_error_in_included_file_names_that_file(tmp_path: Path) -> None:
    write(tmp_path / "inc.ini", "\n\nlisten_port = nope\n")
    path = write(tmp_path / "pgbouncer.ini", "[pgbouncer]\n%include inc.ini\n")
    with pytest.raises(ConfigError, match=r"inc\.ini:3: listen_port: invalid integer 'nope'"):
        load_config(path)


def test_unknown_pgbouncer_key_is_a_warning() -> None:
    c = parse_config("[pgbouncer]\nlisten_port = 6000\nno_such_thing = 1\n", "pgbouncer.ini")
    assert c.listen_port == 6000
    assert "pgbouncer.ini:3: no_such_thing: unknown setting, ignored" in c.warnings
    assert not any("listen_port" in w for w in c.warnings)


def test_deprecated_alias_warns_and_applies() -> None:
    c = parse_config("[pgbouncer]\nservice_name = mybouncer\n", "p.ini")
    assert c.job_name == "mybouncer"
    assert any(w.startswith("p.ini:2: service_name: deprecated") for w in c.warnings)


def test_cross_check_warnings() -> None:
    c = parse_config(
        "[databases]\nd = host=x pool_size=2 min_pool_size=5\n"
        "[pgbouncer]\nauth_type = md5\nmin_pool_size = 30\n",
        "p.ini",
    )
    text = "\n".join(c.warnings)
    assert "p.ini:4: auth_type: md5 needs users from auth_file or auth_user" in text
    assert "p.ini:5: min_pool_size: 30 > default_pool_size 20" in text
    assert "p.ini:2: d: min_pool_size 5 > pool size 2" in text


# ---------------------------------------------------------------- connection strings


def test_quoting_in_connection_strings() -> None:
    c = parse_config(
        "[databases]\nd = host=h password='it''s a \\' test' connect_query = 'SELECT  2'\n"
    )
    assert c.databases["d"].password == "it's a ' test"
    assert c.databases["d"].connect_query == "SELECT  2"


def test_parse_connstr_details() -> None:
    assert parse_connstr("") == []
    assert parse_connstr("  a=1   b = 2\tc= '3 4' ") == [("a", "1"), ("b", "2"), ("c", "3 4")]
    assert parse_connstr(r"p='a\\b\c'") == [("p", "a\\b\\c")]
    with pytest.raises(ValueError, match="empty value"):
        parse_connstr("a=''")
    with pytest.raises(ValueError, match="after quoted value"):
        parse_connstr("a='x'b=2")


@given(
    st.dictionaries(
        st.text(string.ascii_lowercase + "_", min_size=1, max_size=12),
        st.text(string.printable, min_size=1, max_size=40),
        max_size=6,
    )
)
def test_connstr_round_trip(params: dict[str, str]) -> None:
    text = " ".join(f"{k}={quote_connstr_value(v)}" for k, v in params.items())
    assert dict(parse_connstr(text)) == params


# ---------------------------------------------------------------- lookups and precedence


def test_find_database_exact_and_fallback(realistic: Config) -> None:
    assert realistic.find_database("main") is realistic.databases["main"]
    auto = realistic.find_database("somedb")
    assert auto is not None
    assert (auto.name, auto.dbname, auto.host, auto.port) == (
        "somedb",
        "somedb",
        "fallback.example.com",
        6000,
    )


def test_find_database_fallback_keeps_explicit_dbname() -> None:
    c = parse_config("[databases]\n* = host=h dbname=fixed\n")
    entry = c.find_database("anything")
    assert entry is not None and entry.name == "anything" and entry.dbname == "fixed"


def test_find_database_without_fallback() -> None:
    c = parse_config("[databases]\nonly = host=h\n")
    assert c.find_database("only") is not None
    assert c.find_database("other") is None
    assert Config.default().find_database("x") is None


def test_pool_mode_and_size_precedence() -> None:
    c = parse_config(
        "[databases]\nplain = host=h\ntx = host=h pool_mode=transaction pool_size=8\n"
        "[users]\nstmt = pool_mode=statement pool_size=3\nnobody = max_user_connections=1\n"
        "[pgbouncer]\npool_mode = session\ndefault_pool_size = 11\n"
    )
    plain, tx = c.databases["plain"], c.databases["tx"]
    # user entry > database entry > global
    assert c.pool_mode_for(plain, "someone") == "session"
    assert c.pool_mode_for(tx, "someone") == "transaction"
    assert c.pool_mode_for(tx, "stmt") == "statement"
    assert c.pool_mode_for(tx, "nobody") == "transaction"
    assert c.pool_size_for(plain, "someone") == 11
    assert c.pool_size_for(tx, "someone") == 8
    assert c.pool_size_for(tx, "stmt") == 3
    assert c.max_user_connections_for("nobody") == 1
    assert c.max_user_connections_for("someone") == 0


def test_client_connection_limits_precedence() -> None:
    c = parse_config(
        "[databases]\nplain = host=h\nsmall = host=h max_db_client_connections=2\n"
        "[users]\nfew = max_user_client_connections=1\nzero = max_user_client_connections=0\n"
        "[pgbouncer]\nmax_db_client_connections = 7\nmax_user_client_connections = 9\n"
        "pool_idle_timeout = 30\nlogin_notify_message = hello there\n"
    )
    # the entry's own limit when > 0, else the global one
    assert c.max_db_client_connections_for(c.databases["small"]) == 2
    assert c.max_db_client_connections_for(c.databases["plain"]) == 7
    assert c.max_user_client_connections_for("few") == 1
    assert c.max_user_client_connections_for("zero") == 9
    assert c.max_user_client_connections_for("anyone") == 9
    assert c.pool_idle_timeout == 30.0
    assert c.login_notify_message == "hello there"
    defaults = Config.default()
    assert (defaults.pool_idle_timeout, defaults.login_notify_message) == (0.0, "")


# ---------------------------------------------------------------- secrecy and rows


def test_passwords_absent_from_repr(realistic: Config) -> None:
    assert "s3cret" not in repr(realistic)
    assert "s3cret" not in repr(realistic.databases["main"])
    assert "s3cret" not in repr(realistic.find_database("main"))
    assert "s3cret" not in str(list(realistic.databases.values()))


def test_settings_rows_cover_every_setting(realistic: Config) -> None:
    rows = realistic.settings_rows()
    assert [r[0] for r in rows] == sorted(SETTINGS)
    by_key = {r[0]: r for r in rows}
    assert by_key["listen_port"] == ("listen_port", "6543", "6432", False)
    assert by_key["pool_mode"] == ("pool_mode", "session", "session", True)
    assert by_key["log_connections"][1:3] == ("0", "1")
    assert by_key["server_idle_timeout"][1:3] == ("60.5", "600")
    assert by_key["listen_addr"][1] == "*,127.0.0.1,::1"
    assert by_key["unix_socket_mode"][1:3] == ("0700", "0777")


def test_the_admin_console_is_refused_as_auth_dbname() -> None:
    """PgBouncer's words, at startup, RELOAD and SET; an entry's auth_dbname is refused at
    login instead (runtime.py), as PgBouncer does."""
    reserved = 'auth_dbname: cannot use the reserved "pgbouncer" database as an auth_dbname'
    with pytest.raises(ConfigError, match=reserved):
        parse_config("[pgbouncer]\nauth_dbname = pgbouncer\n")
    with pytest.raises(ConfigError, match=reserved):
        Config.default().with_setting("auth_dbname", "pgbouncer")
    assert Config.default().with_setting("auth_dbname", "authdb").auth_dbname == "authdb"
    entry = parse_config("[databases]\nx = host=h auth_dbname=pgbouncer\n").databases["x"]
    assert entry.auth_dbname == "pgbouncer"


def test_which_databases_are_the_admin_console() -> None:
    assert Config.default().is_admin_database("pgbouncer")
    assert Config.default().is_admin_database("pgtarn")
    assert not Config.default().is_admin_database("app")
    assert not parse_config("[databases]\npgtarn = host=h\n").is_admin_database("pgtarn")


def test_with_setting() -> None:
    c = Config.default().with_setting("Default_Pool_Size", "7")
    assert c.default_pool_size == 7
    with pytest.raises(ConfigError, match="SET: default_pool_size: invalid integer"):
        c.with_setting("default_pool_size", "x")
    with pytest.raises(ConfigError, match="unknown setting"):
        c.with_setting("nope", "1")


def test_config_is_frozen_and_hashable(realistic: Config) -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        cast(Any, realistic).listen_port = 1  # (what the types forbid, tried at run time)
    with pytest.raises(TypeError):
        cast(Any, realistic.databases)["x"] = DatabaseEntry(name="x")
    assert hash(realistic) == hash(dataclasses.replace(realistic))


def test_port_list_matches_the_host_list() -> None:
    """libpq's form: one port per host, or one for all; anything else names the problem."""
    c = parse_config("[databases]\nd = host=a,b port=5432,5433\n[pgbouncer]\n")
    db = c.databases["d"]
    assert (db.hosts, db.port, db.ports) == (("a", "b"), 5432, (5432, 5433))
    one = parse_config("[databases]\nd = host=a,b port=6000\n[pgbouncer]\n").databases["d"]
    assert (one.port, one.ports) == (6000, ())
    with pytest.raises(ConfigError, match="3 ports for 2 hosts"):
        parse_config("[databases]\nd = host=a,b port=1,2,3\n[pgbouncer]\n")
    with pytest.raises(ConfigError, match="invalid port"):
        parse_config("[databases]\nd = host=a port=70000\n[pgbouncer]\n")


def test_workers_auto_is_the_cpus_this_process_may_use() -> None:
    import os

    from pgtarn.config.settings import SETTINGS

    assert SETTINGS["workers"].parse("auto") == len(os.sched_getaffinity(0))
    assert SETTINGS["workers"].parse("3") == 3
    with pytest.raises(ValueError):
        SETTINGS["workers"].parse("0")


# ---------------------------------------------------------------- read/write split (pgtarn's own)


def db_line(opts: str, name: str = "d") -> DatabaseEntry:
    return parse_config(f"[databases]\n{name} = host=a,b {opts}\n[pgbouncer]\n").databases[name]


def test_split_keys_default_to_no_split() -> None:
    db = db_line("")
    assert db.read_write_split == "off"
    assert db.max_replica_lag_bytes is None and db.max_replica_lag_seconds is None
    assert db.primary_reads is True and db.read_your_writes is True
    assert db.health_check_period == 1.0
    assert db.reads_only is False
    bare = DatabaseEntry(name="x")
    assert (bare.read_write_split, bare.health_check_period, bare.reads_only) == ("off", 1.0, False)


@pytest.mark.parametrize("value", ["off", "explicit", "auto", "AUTO", "Explicit"])
def test_read_write_split_choices(value: str) -> None:
    assert db_line(f"read_write_split={value}").read_write_split == value.lower()


@pytest.mark.parametrize(
    ("value", "lag_bytes", "lag_seconds"),
    [
        ("0", 0, None),
        ("16777216", 16777216, None),
        ("64kB", 64 * 1024, None),
        ("16MB", 16 * 1024**2, None),
        ("1GB", 1024**3, None),
        ("'16 MB'", 16 * 1024**2, None),  # PostgreSQL allows a space before the unit
        ("5s", None, 5.0),
        ("500ms", None, 0.5),
        ("2min", None, 120.0),
        ("1.5s", None, 1.5),
        ("0s", None, 0.0),
    ],
)
def test_max_replica_lag_bytes_or_time(
    value: str, lag_bytes: int | None, lag_seconds: float | None
) -> None:
    db = db_line(f"read_write_split=auto max_replica_lag={value}")
    assert (db.max_replica_lag_bytes, db.max_replica_lag_seconds) == (lag_bytes, lag_seconds)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("-1", "max_replica_lag: must be >= 0"),
        ("-5s", "max_replica_lag: must be >= 0"),
        ("10kb", "max_replica_lag: invalid unit 'kb' (units are case-sensitive, as in PostgreSQL"),
        ("10mb", "max_replica_lag: invalid unit 'mb'"),
        ("5sec", "max_replica_lag: invalid unit 'sec'"),
        ("5h", "max_replica_lag: invalid unit 'h'"),
        ("1.5MB", "max_replica_lag: bytes must be a whole number"),
        ("1.5", "max_replica_lag: bytes must be a whole number"),
        ("lots", "max_replica_lag: invalid value 'lots'"),
        ("1e999s", "max_replica_lag: invalid value '1e999s'"),
    ],
)
def test_max_replica_lag_errors_name_file_line_and_key(value: str, message: str) -> None:
    text = f"[databases]\n\nd = host=a,b max_replica_lag={value}\n"
    assert f"pgbouncer.ini:3: d: {message}" in error_of(text)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("on", True),
        ("off", False),
        ("true", True),
        ("false", False),
        ("yes", True),
        ("no", False),
        ("1", True),
        ("0", False),
        ("ON", True),
    ],
)
def test_split_booleans(value: str, expected: bool) -> None:
    db = db_line(f"primary_reads={value} read_your_writes={value}")
    assert db.primary_reads is expected and db.read_your_writes is expected


@pytest.mark.parametrize(
    ("value", "seconds"),
    [("2", 2.0), ("0.25", 0.25), ("250ms", 0.25), ("3s", 3.0), ("1min", 60.0)],
)
def test_health_check_period_seconds_or_units(value: str, seconds: float) -> None:
    assert db_line(f"health_check_period={value}").health_check_period == seconds


@pytest.mark.parametrize(
    ("opts", "message"),
    [
        (
            "read_write_split=sometimes",
            "read_write_split: invalid value 'sometimes'; expected off|explicit|auto",
        ),
        ("primary_reads=maybe", "primary_reads: invalid boolean 'maybe'"),
        ("read_your_writes=2x", "read_your_writes: invalid boolean '2x'"),
        ("health_check_period=0", "health_check_period: must be > 0"),
        ("health_check_period=0ms", "health_check_period: must be > 0"),
        ("health_check_period=-1", "health_check_period: must be > 0"),
        ("health_check_period=1MB", "health_check_period: invalid unit 'MB'"),
        ("health_check_period=5S", "health_check_period: invalid unit 'S'"),
        ("health_check_period=soon", "health_check_period: invalid value 'soon'"),
    ],
)
def test_split_key_errors_name_file_line_and_key(opts: str, message: str) -> None:
    assert f"pgbouncer.ini:2: d: {message}" in error_of(f"[databases]\nd = host=a {opts}\n")


def test_split_on_a_single_host_is_accepted_and_off_keeps_the_others() -> None:
    """A replica may be added later; with the split off the other keys are kept, unused."""
    c = parse_config(
        "[databases]\none = host=a read_write_split=auto\n"
        "off = host=a,b max_replica_lag=1MB primary_reads=off read_your_writes=0 "
        "health_check_period=5\n[pgbouncer]\n"
    )
    assert c.databases["one"].read_write_split == "auto"
    off = c.databases["off"]
    assert off.read_write_split == "off" and off.max_replica_lag_bytes == 1024**2
    assert (off.primary_reads, off.read_your_writes, off.health_check_period) == (False, False, 5)
    assert not any("one" in w or "off" in w for w in c.warnings)


def test_split_keys_do_not_change_server_identity() -> None:
    plain = db_line("")
    split = db_line(
        "read_write_split=auto max_replica_lag=5s primary_reads=off "
        "read_your_writes=off health_check_period=250ms"
    )
    assert split != plain
    assert split.server_identity == plain.server_identity
    assert dataclasses.replace(plain, reads_only=True).server_identity == plain.server_identity


SPLIT = """\
[databases]
app = host=a,b dbname=appdb read_write_split=explicit max_replica_lag=1MB
plain = host=a,b
auto = host=a read_write_split=auto
own = host=a,b read_write_split=auto
own_ro = host=c dbname=elsewhere
{fallback}
[pgbouncer]
"""


@pytest.mark.parametrize("fallback", ["", "* = host=fallback"])
def test_ro_alias_of_a_split_entry(fallback: str) -> None:
    c = parse_config(SPLIT.format(fallback=fallback))
    ro = c.find_database("app_ro")
    assert ro is not None
    app = c.databases["app"]
    assert (ro.name, ro.dbname, ro.reads_only) == ("app_ro", "appdb", True)
    assert ro.hosts == app.hosts and ro.max_replica_lag_bytes == 1024**2
    assert ro == dataclasses.replace(app, name="app_ro", reads_only=True)
    assert c.find_database("app_ro") is ro  # made once per Config, not at every login
    assert c.find_database("app") is app and not app.reads_only
    auto = c.find_database("auto_ro")  # one host: accepted, a replica may come later
    assert auto is not None and auto.reads_only and auto.dbname == "auto"
    assert "app_ro" not in c.databases


def test_ro_alias_absent_when_split_off() -> None:
    c = parse_config(SPLIT.format(fallback=""))
    assert c.find_database("plain_ro") is None
    assert c.find_database("nosuch_ro") is None
    with_fallback = parse_config(SPLIT.format(fallback="* = host=fallback"))
    plain_ro = with_fallback.find_database("plain_ro")
    assert plain_ro is not None and not plain_ro.reads_only
    assert (plain_ro.host, plain_ro.dbname) == ("fallback", "plain_ro")


def test_explicit_ro_entry_wins_over_the_alias() -> None:
    c = parse_config(SPLIT.format(fallback="* = host=fallback"))
    own_ro = c.find_database("own_ro")
    assert own_ro is c.databases["own_ro"]
    assert (own_ro.host, own_ro.dbname, own_ro.reads_only) == ("c", "elsewhere", False)


def test_no_alias_from_the_fallback_entry() -> None:
    c = parse_config("[databases]\n* = host=a,b read_write_split=auto\n[pgbouncer]\n")
    star_ro = c.find_database("*_ro")
    assert star_ro is not None and not star_ro.reads_only and star_ro.dbname == "*_ro"
    x_ro = c.find_database("x_ro")
    assert x_ro is not None and not x_ro.reads_only and x_ro.dbname == "x_ro"


def test_ro_alias_follows_the_reloaded_config() -> None:
    before = parse_config(SPLIT.format(fallback=""))
    after = parse_config(SPLIT.format(fallback="").replace("lag=1MB", "lag=5s"))
    ro = after.find_database("app_ro")
    assert ro is not None and ro.max_replica_lag_seconds == 5.0 and ro.max_replica_lag_bytes is None
    assert before.find_database("app_ro") != ro
    off = parse_config(SPLIT.format(fallback="").replace("read_write_split=explicit", ""))
    assert off.find_database("app_ro") is None


def test_a_misspelt_setting_warns_at_startup_with_a_suggestion() -> None:
    c = parse_config("[pgbouncer]\nmax_client_con = 10\n", "pgbouncer.ini")
    assert (
        "pgbouncer.ini:2: max_client_con: unknown setting, ignored"
        " (did you mean max_client_conn?)" in c.warnings
    )


def test_a_setting_pgtarn_does_not_act_on_is_a_warning_when_changed() -> None:
    c = parse_config(
        "[pgbouncer]\nsbuf_loopcnt = 9\npkt_buf = 4096\ndisable_pqexec = 1\n", "pgbouncer.ini"
    )
    assert (
        "pgbouncer.ini:2: sbuf_loopcnt: not applied: pgtarn reads each socket until it is"
        " empty" in c.warnings
    )
    assert any(w.startswith("pgbouncer.ini:4: disable_pqexec: not applied") for w in c.warnings)
    assert not any("pkt_buf" in w for w in c.warnings)  # its default: nothing to say


def test_a_small_pkt_buf_is_accepted_as_pgbouncer_accepts_it() -> None:
    """PgBouncer's own tests shrink pkt_buf to 75 bytes; pgtarn has no such buffer."""
    c = parse_config("[pgbouncer]\npkt_buf = 75\n", "pgbouncer.ini")
    assert c.pkt_buf == 75
    assert any(w.startswith("pgbouncer.ini:2: pkt_buf: not applied") for w in c.warnings)


def test_a_conffile_set_is_a_warning_since_reload_reads_the_started_file() -> None:
    c = parse_config("[pgbouncer]\nconffile = /etc/other.ini\n", "pgbouncer.ini")
    assert c.conffile == "/etc/other.ini"
    assert any(w.startswith("pgbouncer.ini:2: conffile: not applied") for w in c.warnings)
