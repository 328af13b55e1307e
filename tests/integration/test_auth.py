"""Client authentication per auth_type and server login per method, over TCP and unix socket."""

from __future__ import annotations

import asyncio
import os
import re
import struct
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import psycopg
import pytest

from pgtarn.auth.md5 import md5_secret
from tests.support import PgtarnProcess, TempCluster, userlist_line

from .conftest import ROLE_PASSWORDS, PgtarnFactory
from .drivers import aconnect
from .pgstat import wait_until
from .rawpg import RawClient, error_fields
from .test_admin import admin, pool_row


def query_user(dsn: str) -> str:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("select current_user").fetchone()
        assert row is not None
        return str(row[0])


def login_error(
    proc: PgtarnProcess, user: str, password: str | None, dbname: str = "app"
) -> tuple[str, str]:
    """(SQLSTATE, message) of a failed login, seen by asyncpg."""

    async def attempt() -> tuple[str, str]:
        try:
            conn = await aconnect(proc, user, password, dbname)
        except asyncpg.PostgresError as exc:
            return str(exc.sqlstate), str(exc)
        await conn.close()
        raise AssertionError(f"login of {user} unexpectedly succeeded")

    return asyncio.run(attempt())


def unix_dsn(proc: PgtarnProcess, user: str, password: str | None, dbname: str = "app") -> str:
    dsn = f"host={proc.socket_dir} port={proc.port} dbname={dbname} user={user}"
    return dsn + (f" password={password}" if password is not None else "")


def auth_request_code(proc: PgtarnProcess, user: str) -> int:
    """The Authentication request pgtarn answers a startup packet with."""
    raw = RawClient(proc.host, proc.port)
    try:
        raw.startup(user=user, database="app")
        msg_type, body = raw.read_message()
        assert msg_type == "R"
        return int(struct.unpack("!I", body[:4])[0])
    finally:
        raw.close()


@pytest.mark.parametrize("auth_type", ["scram-sha-256", "md5", "plain"])
def test_password_auth_types_tcp_and_unix(
    pgtarn_factory: PgtarnFactory, pg_roles: dict[str, str], auth_type: str
) -> None:
    proc = pgtarn_factory(settings={"auth_type": auth_type})
    assert query_user(proc.dsn("app", pg_roles["app"])) == "app"
    assert query_user(unix_dsn(proc, "app", pg_roles["app"])) == "app"
    expected_code = {"scram-sha-256": 10, "md5": 5, "plain": 3}[auth_type]
    assert auth_request_code(proc, "app") == expected_code


@pytest.mark.parametrize("auth_type", ["scram-sha-256", "md5", "plain"])
def test_wrong_password_and_unknown_user_look_the_same(
    pgtarn_factory: PgtarnFactory, pg_roles: dict[str, str], auth_type: str
) -> None:
    proc = pgtarn_factory(settings={"auth_type": auth_type})
    errors = []
    for user, password in (("app", "wrong"), ("nobody", "wrong")):
        sqlstate, message = login_error(proc, user, password)
        assert sqlstate == "28P01"
        errors.append(message.replace(user, "USER"))
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(proc.dsn(user, password))
    assert errors[0] == errors[1]
    # the pooler keeps serving after failed logins
    assert query_user(proc.dsn("app", pg_roles["app"])) == "app"


def test_md5_auth_type_uses_scram_for_a_scram_secret(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster, pg_roles: dict[str, str]
) -> None:
    verifier = pg_cluster.scram_verifier("app")
    proc = pgtarn_factory(settings={"auth_type": "md5"}, userlist={"app": verifier})
    assert auth_request_code(proc, "app") == 10
    assert query_user(proc.dsn("app", pg_roles["app"])) == "app"


def test_scram_passthrough_with_only_a_verifier_stored(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster, pg_roles: dict[str, str]
) -> None:
    """No plaintext anywhere: the server login reuses the ClientKey from the client's proof."""
    verifier = pg_cluster.scram_verifier("app")
    proc = pgtarn_factory(userlist={"app": verifier})
    for _ in range(3):
        assert query_user(proc.dsn("app", pg_roles["app"])) == "app"
    assert query_user(unix_dsn(proc, "app", pg_roles["app"])) == "app"
    assert login_error(proc, "app", "wrong")[0] == "28P01"


def test_md5_secret_in_auth_file(pgtarn_factory: PgtarnFactory, pg_roles: dict[str, str]) -> None:
    secret = md5_secret(pg_roles["md5_user"], "md5_user")
    proc = pgtarn_factory(settings={"auth_type": "md5"}, userlist={"md5_user": secret})
    # client md5 against the stored hash, then server md5 login with the same hash
    assert query_user(proc.dsn("md5_user", pg_roles["md5_user"])) == "md5_user"


def test_trust_needs_a_known_user(pgtarn_factory: PgtarnFactory, pg_roles: dict[str, str]) -> None:
    proc = pgtarn_factory(settings={"auth_type": "trust"})
    assert query_user(proc.dsn("app", None)) == "app"
    assert query_user(unix_dsn(proc, "app", None)) == "app"
    assert login_error(proc, "nobody", None)[0] == "28000"


def test_any_uses_the_forced_user_of_the_database(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster, pg_roles: dict[str, str]
) -> None:
    base = f"host={pg_cluster.host} port={pg_cluster.port} dbname=app"
    proc = pgtarn_factory(
        settings={"auth_type": "any"},
        databases={"app": f"{base} user=app password={pg_roles['app']}"},
        userlist={},
    )
    assert query_user(proc.dsn("whoever", None)) == "app"
    assert query_user(unix_dsn(proc, "someone_else", None)) == "app"


@pytest.mark.parametrize("role", ["scram_user", "md5_user", "password_user", "trust_user"])
def test_server_login_methods(
    pgtarn_factory: PgtarnFactory, pg_roles: dict[str, str], role: str
) -> None:
    """pg_hba gives each role its method: SCRAM, md5, cleartext password, trust."""
    proc = pgtarn_factory()
    assert query_user(proc.dsn(role, pg_roles[role])) == role


def test_server_password_from_database_entry(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster, pg_roles: dict[str, str]
) -> None:
    base = f"host={pg_cluster.host} port={pg_cluster.port} dbname=app"
    proc = pgtarn_factory(
        databases={"forced": f"{base} user=scram_user password={pg_roles['scram_user']}"},
    )
    assert query_user(proc.dsn("app", pg_roles["app"], dbname="forced")) == "scram_user"


def test_server_login_failure_reaches_the_client(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster, pg_roles: dict[str, str]
) -> None:
    base = f"host={pg_cluster.host} port={pg_cluster.port} dbname=app"
    proc = pgtarn_factory(databases={"bad": f"{base} user=scram_user password=nope", "app": base})
    assert login_error(proc, "app", pg_roles["app"], dbname="bad")[0] == "28P01"
    assert query_user(proc.dsn("app", pg_roles["app"])) == "app"


def test_unknown_database(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster, pg_roles: dict[str, str]
) -> None:
    base = f"host={pg_cluster.host} port={pg_cluster.port}"
    proc = pgtarn_factory(databases={"app": f"{base} dbname=app"})
    assert login_error(proc, "app", pg_roles["app"], dbname="nosuchdb")[0] == "3D000"


@pytest.mark.parametrize("auth_type", ["md5", "scram-sha-256"])
def test_an_unknown_database_is_told_after_the_password_exchange(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster, pg_roles: dict[str, str], auth_type: str
) -> None:
    """As PgBouncer: which databases exist is told to authenticated clients only. A user
    auth_file does not name is not looked up for it (nothing to look up in), so it fails as
    a wrong password."""
    base = f"host={pg_cluster.host} port={pg_cluster.port}"
    proc = pgtarn_factory(
        databases={"app": f"{base} dbname=app"},
        settings={"auth_type": auth_type, "auth_user": "app"},
    )
    words = "SASL" if auth_type == "scram-sha-256" else "password"
    failed = ("28P01", f"{words} authentication failed")
    assert login_error(proc, "app", "wrong", dbname="nosuchdb") == failed
    assert login_error(proc, "nobody", "wrong", dbname="nosuchdb") == failed
    assert login_error(proc, "app", pg_roles["app"], dbname="nosuchdb") == (
        "3D000",
        "no such database: nosuchdb",
    )
    assert "login failed: db=nosuchdb user=app" in proc.log_text()


def test_postgresqls_login_refusal_is_the_close_reason_in_its_own_words(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster, pg_roles: dict[str, str]
) -> None:
    """As PgBouncer: PostgreSQL's message is what the client gets and the close reason of
    the server and the client, word for word; the WARNING says "server login failed: FATAL"
    before it."""
    base = f"host={pg_cluster.host} port={pg_cluster.port}"
    proc = pgtarn_factory(databases={"gone": f"{base} dbname=no_such_db_here"})
    refusal = 'database "no_such_db_here" does not exist'
    assert login_error(proc, "app", pg_roles["app"], dbname="gone") == ("3D000", refusal)
    client_closed = rf"C-\d+: gone/app@127\.0\.0\.1:\d+ closing because: {refusal}"
    wait_until(
        lambda: re.search(client_closed, proc.log_text()) is not None,
        what="the client's close logged",
    )
    text = proc.log_text()
    assert re.search(
        rf"WARNING S-\d+: gone/app@127\.0\.0\.1:\d+ server login failed: "
        rf"FATAL {refusal}",
        text,
    ), text
    assert re.search(rf"S-\d+: gone/app@127\.0\.0\.1:\d+ closing because: {refusal}", text)
    assert "closing because: server login failed" not in text


def test_a_secret_that_cannot_answer_the_servers_method_is_a_wrong_password_type(
    pgtarn_factory: PgtarnFactory, pg_roles: dict[str, str]
) -> None:
    """PostgreSQL asks scram_user for SCRAM; auth_file holds an md5 hash, which cannot
    answer it: PgBouncer's words, "server login failed: wrong password type", then why."""
    secret = md5_secret(pg_roles["scram_user"], "scram_user")
    proc = pgtarn_factory(settings={"auth_type": "md5"}, userlist={"scram_user": secret})
    sqlstate, message = login_error(proc, "scram_user", pg_roles["scram_user"])
    assert sqlstate == "28P01"
    assert message.startswith("server login failed: wrong password type: no usable password")


def test_ssl_request_is_answered_n_then_login_works(
    pgtarn_factory: PgtarnFactory, pg_roles: dict[str, str]
) -> None:
    proc = pgtarn_factory()
    raw = RawClient(proc.host, proc.port)
    try:
        raw.send(struct.pack("!II", 8, 80877103))
        assert raw.recv_exact(1) == b"N"
        raw.send(struct.pack("!II", 8, 80877104))
        assert raw.recv_exact(1) == b"N"
        raw.startup(user="app", database="app")
        assert raw.read_message()[0] == "R"
    finally:
        raw.close()
    # libpq with sslmode=prefer falls back to plaintext
    assert query_user(proc.dsn("app", pg_roles["app"], sslmode="prefer")) == "app"
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(proc.dsn("app", pg_roles["app"], sslmode="require"))


def test_unix_socket_file_and_mode(pgtarn_factory: PgtarnFactory) -> None:
    proc = pgtarn_factory(settings={"unix_socket_mode": "0700"})
    path = os.path.join(proc.socket_dir, f".s.PGSQL.{proc.port}")
    assert os.stat(path).st_mode & 0o777 == 0o700
    raw = RawClient.unix(path)
    try:
        raw.startup(user="app", database="app")
        assert raw.read_message()[0] == "R"
    finally:
        raw.close()


def test_bad_startup_packets_get_clear_errors(
    pgtarn_factory: PgtarnFactory, pg_roles: dict[str, str]
) -> None:
    proc = pgtarn_factory()
    cases = [
        (struct.pack("!II", 8, (2 << 16)), "0A000"),  # protocol 2.0, as PostgreSQL answers it
        (struct.pack("!II", 9, 196608) + b"x", "08P01"),  # unterminated parameters
    ]
    for packet, sqlstate in cases:
        raw = RawClient(proc.host, proc.port)
        try:
            raw.send(packet)
            msg_type, body = raw.read_message()
            assert msg_type == "E"
            assert error_fields(body)["C"] == sqlstate
        finally:
            raw.close()
    raw = RawClient(proc.host, proc.port)
    try:
        raw.send(struct.pack("!II", 0x7FFFFFFF, 196608))  # absurd length
        msg_type, body = raw.read_message()
        assert msg_type == "E" and error_fields(body)["C"] == "08P01"
    finally:
        raw.close()
    assert query_user(proc.dsn("app", pg_roles["app"])) == "app"


#: PgBouncer's longest password; its PasswordMessage (length field) is 65,536 bytes.
LONGEST_PASSWORD = 65531


@pytest.mark.parametrize("auth_type", ["plain", "md5", "scram-sha-256"])
def test_a_password_of_pgbouncers_longest_length_logs_in(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster, auth_type: str
) -> None:
    """A 65,531-byte password, set on a PostgreSQL role and in the auth_file, works with each
    auth_type (plain: the client sends it in a PasswordMessage of 64 KiB); the server login
    is SCRAM with the same password. A longer login message is still refused."""
    role = f"long_pw_{auth_type.replace('-', '_')}"
    password = ("p4ssw0rd-" * (LONGEST_PASSWORD // 9 + 1))[:LONGEST_PASSWORD]
    pg_cluster.create_role(role, password)
    try:
        proc = pgtarn_factory(settings={"auth_type": auth_type}, userlist={role: password})
        with psycopg.connect(proc.dsn(role, None), password=password, autocommit=True) as conn:
            assert conn.execute("select current_user").fetchone() == (role,)
        if auth_type == "plain":
            sqlstate, _message = login_error(proc, role, password[:-1] + "X")
            assert sqlstate == "28P01"
            raw = RawClient(proc.host, proc.port)
            try:
                raw.startup(user=role, database="app")
                assert raw.read_message()[0] == "R"
                too_long = b"x" * (LONGEST_PASSWORD + 1) + b"\0"  # a length field of 65,537
                raw.send(b"p" + struct.pack("!I", 4 + len(too_long)) + too_long)
                msg_type, body = raw.read_message()
                assert msg_type == "E" and error_fields(body)["C"] == "08P01"
            finally:
                raw.close()
    finally:
        pg_cluster.psql(f'DROP ROLE IF EXISTS "{role}"')


def test_login_refusals_in_pgbouncers_words(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster, pg_roles: dict[str, str]
) -> None:
    """PgBouncer's wording (which names no user); PostgreSQL's SQLSTATEs."""
    for auth_type, words in (("plain", "password"), ("md5", "password"), ("scram-sha-256", "SASL")):
        proc = pgtarn_factory(settings={"auth_type": auth_type})
        for user in ("app", "nobody"):
            assert login_error(proc, user, "wrong") == ("28P01", f"{words} authentication failed")
            assert f"login failed: db=app user={user}" in proc.log_text()
    proc = pgtarn_factory(settings={"auth_type": "trust"})
    assert login_error(proc, "nobody", None) == ("28000", '"trust" authentication failed')
    base = f"host={pg_cluster.host} port={pg_cluster.port}"
    proc = pgtarn_factory(databases={"app": f"{base} dbname=app"})
    assert login_error(proc, "app", pg_roles["app"], dbname="nosuchdb") == (
        "3D000",
        "no such database: nosuchdb",
    )
    # auth_dbname that is not a database: the client is told PgBouncer's words, the log why
    proc = pgtarn_factory(
        databases={"app": f"{base} dbname=app auth_dbname=missing"},
        settings={"auth_user": "app"},
        userlist={"app": pg_roles["app"]},
    )
    assert login_error(proc, "scram_user", pg_roles["scram_user"])[1] == "bouncer config error"
    assert 'authentication database "missing" is not configured' in proc.log_text()


#: A role whose password a test changes in PostgreSQL behind pgtarn's back.
PW_ROLE = "pw_change"


@pytest.fixture
def pw_role(pg_cluster: TempCluster) -> Iterator[str]:
    pg_cluster.create_role(PW_ROLE, "old_pw")
    try:
        yield PW_ROLE
    finally:
        pg_cluster.psql(
            f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{PW_ROLE}'"
        )
        pg_cluster.psql(f'DROP ROLE IF EXISTS "{PW_ROLE}"')


def test_server_password_changed_in_postgresql_reaches_waiting_clients(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster, pw_role: str
) -> None:
    """PgBouncer's test_change_server_password_reconnect: the role's password changes in
    PostgreSQL while its only server is held in a transaction; RECONNECT makes that server
    useless to others, and a larger pool_size makes pgtarn open a new one for the clients
    waiting. Its login fails: each waiting client gets PostgreSQL's 28P01 and message at
    once (not after query_wait_timeout, nor retried forever), and so does a client that
    comes later. Once the auth_file holds the new password and is reloaded, clients are
    served again."""
    userlist = {**ROLE_PASSWORDS, pw_role: "old_pw"}
    proc = pgtarn_factory(
        settings={"default_pool_size": 1, "query_wait_timeout": 120}, userlist=userlist
    )

    async def scenario() -> list[object]:
        first = await aconnect(proc, user=pw_role, password="old_pw")
        assert await first.fetchval("select 1") == 1
        await first.close()
        pg_cluster.psql(f"ALTER ROLE {pw_role} PASSWORD 'new_pw'")
        holder = await aconnect(proc, user=pw_role, password="old_pw")
        await holder.execute("BEGIN")
        assert await holder.fetchval("select 1") == 1  # its server is still logged in
        waiters = [
            await psycopg.AsyncConnection.connect(proc.dsn(pw_role, "old_pw"), autocommit=True)
            for _ in range(3)
        ]
        queries = [asyncio.ensure_future(w.execute("select 2")) for w in waiters]
        try:
            with admin(proc) as console:
                for _ in range(200):  # (the loop must run for the queries to be sent)
                    if pool_row(console, "app", pw_role)["cl_waiting"] == 3:
                        break
                    await asyncio.sleep(0.05)
                assert pool_row(console, "app", pw_role)["cl_waiting"] == 3
                console.execute("RECONNECT")
                console.execute("SET default_pool_size = 2")
            # bounded far below query_wait_timeout: a hang fails here
            done, _pending = await asyncio.wait(queries, timeout=30)
            return [
                q.exception() or q.result() if q in done else TimeoutError("still waiting")
                for q in queries
            ]
        finally:
            for query in queries:
                query.cancel()
            await asyncio.gather(*queries, return_exceptions=True)
            await holder.execute("COMMIT")
            await holder.close()
            for waiter in waiters:
                await waiter.close()

    results = asyncio.run(scenario())
    for result in results:
        assert isinstance(result, psycopg.Error), results
        assert result.diag.severity == "FATAL"
        assert (result.sqlstate, result.diag.message_primary) == (
            "28P01",
            f'password authentication failed for user "{pw_role}"',
        )
    # the server and its three clients closed for PostgreSQL's reason, in its words; the
    # WARNING (logged once per failed login) says "server login failed: FATAL" before them
    refusal = f'password authentication failed for user "{pw_role}"'

    def closed() -> set[str]:
        return set(re.findall(rf"\b([CS]-\d+): \S+ closing because: {refusal}", proc.log_text()))

    wait_until(
        lambda: len([name for name in closed() if name[0] == "C"]) == 3,
        what="the three clients' closes logged",
    )
    log = proc.log_text()
    assert len([name for name in closed() if name[0] == "S"]) == 1, log
    assert f"server login failed: FATAL {refusal}" in log
    assert "closing because: server login failed" not in log

    # a client that comes later is refused too (by a new attempt, or the cached error)
    with (
        pytest.raises(psycopg.OperationalError) as info,
        psycopg.connect(proc.dsn(pw_role, "old_pw"), autocommit=True) as late,
    ):
        late.execute("select 3")
    assert info.value.sqlstate == "28P01"
    assert f'password authentication failed for user "{pw_role}"' in str(info.value)

    # the auth_file learns the new password: clients (with it) are served again
    path = Path(proc.ini_path).parent / "userlist.txt"
    path.write_text(
        "".join(userlist_line(u, p) for u, p in {**userlist, pw_role: "new_pw"}.items()),
        encoding="utf-8",
    )
    with admin(proc) as console:
        console.execute("RELOAD")
    assert query_user(proc.dsn(pw_role, "new_pw")) == pw_role
