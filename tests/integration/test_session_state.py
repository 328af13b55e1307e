"""Session state in transaction mode: one client's SETs, locks, temp tables, cursors and roles
stay with that client (tracked and replayed, or the client pinned to its server)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from tests.support import PgtarnProcess, TempCluster, free_port

from .conftest import ROLE_PASSWORDS, PgtarnFactory
from .drivers import aconnect, connect
from .pgstat import make_table, superuser_connect, wait_for
from .test_admin import admin, show
from .test_metrics import scrape, value

Conn = psycopg.Connection[Any]

RELEASE_WAIT = 5
"""query_wait_timeout (seconds) where a test checks that a pin was released: a client that
would wait for a server still pinned gets an error instead of hanging the test."""


def unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


def show_setting(conn: Conn, name: str) -> str:
    row = conn.execute(f"show {name}").fetchone()
    assert row is not None
    return str(row[0])


def backend_pid(conn: Conn) -> int:
    row = conn.execute("select pg_backend_pid()").fetchone()
    assert row is not None
    return int(row[0])


def defaults(pg_dsn: str, *names: str) -> dict[str, str]:
    """The settings' values in a fresh session straight to the cluster (no pooler)."""
    with psycopg.connect(pg_dsn, autocommit=True) as direct:
        return {name: show_setting(direct, name) for name in names}


def shared_pair(proc: PgtarnProcess, **kw: Any) -> tuple[Conn, Conn]:
    """Clients A and B (autocommit) of a pool of one server; checked to share it."""
    a = connect(proc, autocommit=True, **kw)
    b = connect(proc, autocommit=True)
    assert backend_pid(a) == backend_pid(b)
    return a, b


def advisory_locks(cluster: TempCluster, key: int) -> int:
    """How many advisory locks on this (small, non-negative) bigint key the cluster holds."""
    with superuser_connect(cluster) as su:
        row = su.execute(
            "select count(*) from pg_locks where locktype = 'advisory'"
            " and classid = 0 and objid = %s and objsubid = 1",
            (key,),
        ).fetchone()
    assert row is not None
    return int(row[0])


def assert_server_free(proc: PgtarnProcess, pid: int) -> None:
    """Two new clients hold a server each at once (pool of 2), one of them server pid: that
    server is back in the pool."""
    first = connect(proc)
    second = connect(proc)
    try:
        pids = {backend_pid(first), backend_pid(second)}  # both inside a transaction
        assert len(pids) == 2 and pid in pids, (pid, pids)
    finally:
        first.close()
        second.close()


def client_row(proc: PgtarnProcess, database: str = "app") -> dict[str, Any]:
    """The one SHOW CLIENTS row of this database (the admin console's own is elsewhere)."""
    with admin(proc) as console:
        rows = [r for r in show(console, "CLIENTS") if r["database"] == database]
    assert len(rows) == 1, rows
    row = rows[0]
    assert "pinned" in row and "tracked_settings" in row, f"SHOW CLIENTS columns: {list(row)}"
    return row


@pytest.fixture(scope="module")
def member_role(pg_cluster: TempCluster) -> str:
    """A NOLOGIN role that app is a member of (app may SET ROLE to it)."""
    role = unique("h17_member")
    pg_cluster.psql(f"CREATE ROLE {role} NOLOGIN;\nGRANT {role} TO app;\n")
    return role


@pytest.fixture(scope="module")
def superuser_login(pg_cluster: TempCluster) -> tuple[str, str]:
    """A superuser role with a password (LOAD of a library outside $libdir/plugins needs it)."""
    role, password = unique("h17_super"), "super_pass"
    pg_cluster.create_role(role, password, superuser=True)
    return role, password


@pytest.fixture
def tenant_schema(pg_cluster: TempCluster) -> Iterator[tuple[str, str]]:
    """(schema, table): schema.table holds 'tenant', public.table holds 'public'."""
    schema, table = unique("tenant"), unique("secrets")
    pg_cluster.psql(
        f"CREATE SCHEMA {schema};\nGRANT USAGE ON SCHEMA {schema} TO PUBLIC;\n"
        f"CREATE TABLE {schema}.{table} (v text);\n"
        f"INSERT INTO {schema}.{table} VALUES ('tenant');\n"
        f"CREATE TABLE public.{table} (v text);\n"
        f"INSERT INTO public.{table} VALUES ('public');\n"
        f"GRANT SELECT ON {schema}.{table}, public.{table} TO PUBLIC;\n",
        dbname="app",
    )
    yield schema, table
    pg_cluster.psql(f"DROP SCHEMA {schema} CASCADE;\nDROP TABLE public.{table};\n", dbname="app")


# -- 1. the leaks of plain transaction pooling ---------------------------------------------


def test_statement_timeout_does_not_reach_another_client(pgtarn_factory: PgtarnFactory) -> None:
    """A's SET statement_timeout applies to A's statements only, never to B's on the same server."""
    proc = pgtarn_factory(settings={"default_pool_size": 1})
    a, b = shared_pair(proc)
    with a, b:
        a.execute("set statement_timeout = '200ms'")
        assert b.execute("select pg_sleep(0.5)").fetchone() is not None
        assert show_setting(a, "statement_timeout") == "200ms"
        with pytest.raises(psycopg.errors.QueryCanceled):
            a.execute("select pg_sleep(0.5)")


def test_search_path_does_not_reach_another_client(
    pgtarn_factory: PgtarnFactory, pg_dsn: str, tenant_schema: tuple[str, str]
) -> None:
    """A's SET search_path sends A's unqualified reads to A's schema and leaves B's on public."""
    schema, table = tenant_schema
    default = defaults(pg_dsn, "search_path")["search_path"]
    proc = pgtarn_factory(settings={"default_pool_size": 1})
    a, b = shared_pair(proc)
    with a, b:
        a.execute(f"set search_path = {schema}")
        for _ in range(2):
            assert show_setting(b, "search_path") == default
            assert b.execute(f"select v from {table}").fetchall() == [("public",)]
            assert show_setting(a, "search_path") == schema
            assert a.execute(f"select v from {table}").fetchall() == [("tenant",)]


def test_advisory_lock_keeps_its_server_and_goes_with_the_client(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster
) -> None:
    """A session advisory lock pins A to its server: B never shares the lock, whichever server it
    gets, and the lock is gone once A disconnects."""
    proc = pgtarn_factory(settings={"default_pool_size": 2})
    a = connect(proc, autocommit=True)
    b = connect(proc, autocommit=True)
    try:
        a_pid = backend_pid(a)
        a.execute("select pg_advisory_lock(43)")
        for _ in range(6):
            row = b.execute("select pg_try_advisory_lock(43), pg_backend_pid()").fetchone()
            assert row is not None
            got, b_pid = row
            assert got is False, f"B (server {b_pid}) took A's lock (A's server {a_pid})"
            assert backend_pid(a) == a_pid
    finally:
        b.close()
        a.close()
    assert wait_for(lambda: advisory_locks(pg_cluster, 43) == 0, timeout=5), (
        "the advisory lock outlived its client"
    )


def test_temp_table_is_not_seen_by_another_client(pgtarn_factory: PgtarnFactory) -> None:
    """A's temp table stays on A's server: A keeps reading it, B's read of it is undefined_table."""
    proc = pgtarn_factory(settings={"default_pool_size": 2})
    a = connect(proc, autocommit=True)
    b = connect(proc, autocommit=True)
    with a, b:
        a.execute("create temp table h17_scratch (v int)")
        a.execute("insert into h17_scratch values (7)")
        for _ in range(3):
            with pytest.raises(psycopg.errors.UndefinedTable):
                b.execute("select v from h17_scratch")
            assert a.execute("select v from h17_scratch").fetchall() == [(7,)]


def test_default_transaction_read_only_does_not_reach_another_client(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster
) -> None:
    """A's SET default_transaction_read_only = on makes A's writes fail, not B's."""
    table = make_table(pg_cluster, "h17_ro_")
    proc = pgtarn_factory(settings={"default_pool_size": 1})
    a, b = shared_pair(proc)
    with a, b:
        a.execute("set default_transaction_read_only = on")
        b.execute(f"insert into {table} values (1)")
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
            a.execute(f"insert into {table} values (2)")
        b.execute(f"insert into {table} values (3)")
        assert b.execute(f"select v from {table} order by v").fetchall() == [(1,), (3,)]


# -- 2. transaction semantics ---------------------------------------------------------------


def test_set_follows_commit_rollback_and_savepoints(
    pgtarn_factory: PgtarnFactory, pg_dsn: str
) -> None:
    """A's SETs last as PostgreSQL says (commit keeps, rollback and rollback-to-savepoint undo,
    SET LOCAL ends with its transaction) and B on the same server never sees them."""
    names = ("work_mem", "lock_timeout", "maintenance_work_mem")
    base = defaults(pg_dsn, *names)
    proc = pgtarn_factory(settings={"default_pool_size": 1})
    a, b = shared_pair(proc)
    expected = dict(base)

    def check() -> None:
        assert {n: show_setting(b, n) for n in names} == base
        assert {n: show_setting(a, n) for n in names} == expected

    with a, b:
        for statements, changes in (
            (["begin", "set work_mem = '1111kB'", "commit"], {"work_mem": "1111kB"}),
            (["begin", "set work_mem = '2222kB'", "rollback"], {}),
            (
                [
                    "begin",
                    "savepoint s1",
                    "set lock_timeout = '3s'",
                    "release savepoint s1",
                    "commit",
                ],
                {"lock_timeout": "3s"},
            ),
            (
                [
                    "begin",
                    "set lock_timeout = '4s'",
                    "savepoint s2",
                    "set lock_timeout = '5s'",
                    "set maintenance_work_mem = '77MB'",
                    "rollback to savepoint s2",
                    "commit",
                ],
                {"lock_timeout": "4s"},
            ),
            (
                [
                    "begin",
                    "savepoint s3",
                    "set work_mem = '3333kB'",
                    "rollback to s3",
                    "set maintenance_work_mem = '66MB'",
                    "commit",
                ],
                {"maintenance_work_mem": "66MB"},
            ),
            (
                [
                    "begin",
                    "set local work_mem = '9MB'",
                    "set session lock_timeout = '6s'",
                    "commit",
                ],
                {"lock_timeout": "6s"},
            ),
        ):
            for statement in statements:
                a.execute(statement)
            expected.update(changes)
            check()
        # a failed transaction's SETs are undone, even when it ends with COMMIT
        a.execute("begin")
        a.execute("set work_mem = '5555kB'")
        with pytest.raises(psycopg.errors.DivisionByZero):
            a.execute("select 1/0")
        a.execute("commit")
        check()


# -- 3. RESET and DISCARD -------------------------------------------------------------------


def test_reset_and_discard_bring_back_the_defaults(
    pgtarn_factory: PgtarnFactory, pg_dsn: str
) -> None:
    """RESET name, RESET ALL and DISCARD ALL by A give A the defaults and leave B's SET alone."""
    names = ("work_mem", "lock_timeout")
    base = defaults(pg_dsn, *names)
    proc = pgtarn_factory(settings={"default_pool_size": 1})
    a, b = shared_pair(proc)
    with a, b:
        a.execute("set work_mem = '1111kB'")
        a.execute("set lock_timeout = '3s'")
        b.execute("set work_mem = '2222kB'")

        a.execute("reset work_mem")
        assert show_setting(a, "work_mem") == base["work_mem"]
        assert show_setting(a, "lock_timeout") == "3s"
        assert show_setting(b, "work_mem") == "2222kB"
        assert show_setting(a, "work_mem") == base["work_mem"]

        a.execute("reset all")
        assert {n: show_setting(a, n) for n in names} == base
        assert show_setting(b, "work_mem") == "2222kB"
        assert {n: show_setting(a, n) for n in names} == base

        a.execute("set work_mem = '3333kB'")
        a.execute("set lock_timeout = '4s'")
        assert show_setting(b, "lock_timeout") == base["lock_timeout"]
        a.execute("discard all")
        assert {n: show_setting(a, n) for n in names} == base
        assert show_setting(b, "work_mem") == "2222kB"
        assert {n: show_setting(a, n) for n in names} == base


# -- 4. set_config --------------------------------------------------------------------------


def test_set_config_session_is_tracked_and_local_is_not(
    pgtarn_factory: PgtarnFactory, pg_dsn: str
) -> None:
    """set_config(name, value, false) stays with A like a SET; set_config(..., true) in a
    transaction ends with it."""
    base = defaults(pg_dsn, "statement_timeout", "lock_timeout")
    proc = pgtarn_factory(settings={"default_pool_size": 1})
    a, b = shared_pair(proc)
    with a, b:
        a.execute("select set_config('statement_timeout', '1s', false)")
        assert show_setting(b, "statement_timeout") == base["statement_timeout"]
        assert show_setting(a, "statement_timeout") == "1s"

        a.execute("begin")
        a.execute("select set_config('lock_timeout', '2s', true)")
        assert show_setting(a, "lock_timeout") == "2s"
        a.execute("commit")
        assert show_setting(b, "lock_timeout") == base["lock_timeout"]
        assert show_setting(a, "lock_timeout") == base["lock_timeout"]
        assert show_setting(b, "statement_timeout") == base["statement_timeout"]
        assert show_setting(a, "statement_timeout") == "1s"


# -- 5. every way a SET can arrive ------------------------------------------------------------


def test_set_in_a_multi_statement_query(pgtarn_factory: PgtarnFactory, pg_dsn: str) -> None:
    """Two SETs in one simple Query are both tracked; SETs of a multi-statement Query that fails
    are undone with its implicit transaction."""
    base = defaults(pg_dsn, "work_mem", "lock_timeout")
    proc = pgtarn_factory(settings={"default_pool_size": 1})
    a, b = shared_pair(proc)
    with a, b:
        # no parameters: psycopg sends the string as one simple Query
        a.execute("set work_mem = '1234kB'; set lock_timeout = '3s'")
        assert {n: show_setting(b, n) for n in base} == base
        assert show_setting(a, "work_mem") == "1234kB"
        assert show_setting(a, "lock_timeout") == "3s"

        with pytest.raises(psycopg.errors.DivisionByZero):
            a.execute("set work_mem = '777kB'; select 1/0")
        assert show_setting(a, "work_mem") == "1234kB"
        assert {n: show_setting(b, n) for n in base} == base


def test_set_through_the_extended_protocol_psycopg(
    pgtarn_factory: PgtarnFactory, pg_dsn: str
) -> None:
    """SET and set_config sent as Parse/Bind/Execute (psycopg prepare_threshold=0) are tracked."""
    base = defaults(pg_dsn, "work_mem", "lock_timeout")
    proc = pgtarn_factory(settings={"default_pool_size": 1})
    a, b = shared_pair(proc, prepare_threshold=0)
    with a, b:
        a.execute("set work_mem = '1500kB'")
        a.execute("select set_config('lock_timeout', '2s', false)")
        assert {n: show_setting(b, n) for n in base} == base
        assert show_setting(a, "work_mem") == "1500kB"
        assert show_setting(a, "lock_timeout") == "2s"
        assert {n: show_setting(b, n) for n in base} == base


def test_set_through_the_extended_protocol_asyncpg(
    pgtarn_factory: PgtarnFactory, pg_dsn: str
) -> None:
    """asyncpg's fetch (Parse/Bind/Execute) of a SET and of set_config is tracked."""
    base = defaults(pg_dsn, "statement_timeout", "lock_timeout")
    proc = pgtarn_factory(settings={"default_pool_size": 1})

    async def scenario() -> tuple[dict[str, str], dict[str, str]]:
        a = await aconnect(proc)
        b = await aconnect(proc)
        try:
            assert await a.fetchval("select pg_backend_pid()") == await b.fetchval(
                "select pg_backend_pid()"
            )
            await a.fetch("SET statement_timeout = '1500ms'")
            await a.fetch("select set_config('lock_timeout', '3s', false)")
            seen_b = {n: await b.fetchval(f"show {n}") for n in base}
            seen_a = {n: await a.fetchval(f"show {n}") for n in base}
            return seen_a, seen_b
        finally:
            await a.close()
            await b.close()

    seen_a, seen_b = asyncio.run(scenario())
    assert seen_b == base
    assert seen_a == {"statement_timeout": "1500ms", "lock_timeout": "3s"}


def test_other_set_forms_are_tracked(pgtarn_factory: PgtarnFactory, pg_dsn: str) -> None:
    """SET SCHEMA, SET SESSION CHARACTERISTICS, SET XML OPTION, SET SESSION and SET ... TO DEFAULT
    stay with A."""
    names = ("search_path", "default_transaction_isolation", "xmloption", "work_mem")
    base = defaults(pg_dsn, *names)
    proc = pgtarn_factory(settings={"default_pool_size": 1})
    a, b = shared_pair(proc)
    with a, b:
        b.execute("set work_mem = '2MB'")
        a.execute("set schema 'pg_catalog'")
        a.execute("set session characteristics as transaction isolation level repeatable read")
        a.execute("set xml option document")
        a.execute("set session work_mem = '3MB'")
        assert {n: show_setting(a, n) for n in names} == {
            "search_path": "pg_catalog",
            "default_transaction_isolation": "repeatable read",
            "xmloption": "document",
            "work_mem": "3MB",
        }
        assert {n: show_setting(b, n) for n in names} == {**base, "work_mem": "2MB"}
        a.execute("set work_mem to default")
        b.execute("set work_mem = default")
        assert show_setting(a, "work_mem") == base["work_mem"]
        assert {n: show_setting(b, n) for n in names} == base


# -- 6, 7. pins that end ----------------------------------------------------------------------


def test_set_role_pins_and_reset_role_releases(
    pgtarn_factory: PgtarnFactory, member_role: str
) -> None:
    """While A is SET ROLE, B never runs as that role; after RESET ROLE A's server is free."""
    proc = pgtarn_factory(settings={"default_pool_size": 2, "query_wait_timeout": RELEASE_WAIT})
    a = connect(proc, autocommit=True)
    b = connect(proc, autocommit=True)
    with a, b:
        a.execute(f"set role {member_role}")
        a_pid = backend_pid(a)
        for _ in range(6):
            assert b.execute("select current_user").fetchone() == ("app",)
            assert a.execute("select current_user, pg_backend_pid()").fetchone() == (
                member_role,
                a_pid,
            )
        a.execute("reset role")
        assert a.execute("select current_user").fetchone() == ("app",)
        assert_server_free(proc, a_pid)
        assert b.execute("select current_user").fetchone() == ("app",)


def test_hold_cursor_lives_across_transactions_and_close_releases(
    pgtarn_factory: PgtarnFactory,
) -> None:
    """A WITH HOLD cursor is FETCHed in later transactions on A's server, B never sees it, and
    CLOSE gives the server back."""
    proc = pgtarn_factory(settings={"default_pool_size": 2, "query_wait_timeout": RELEASE_WAIT})
    a = connect(proc, autocommit=True)
    b = connect(proc, autocommit=True)
    with a, b:
        a.execute("begin")
        a.execute("declare h17_cur cursor with hold for select g from generate_series(1, 9) g")
        a.execute("commit")
        a_pid = backend_pid(a)
        for first in (1, 4, 7):
            assert b.execute("select count(*) from pg_cursors").fetchone() == (0,)
            assert a.execute("fetch 3 from h17_cur").fetchall() == [
                (first,),
                (first + 1,),
                (first + 2,),
            ]
        a.execute("close h17_cur")
        assert_server_free(proc, a_pid)
        with pytest.raises(psycopg.errors.InvalidCursorName):
            a.execute("fetch 1 from h17_cur")


# -- 8. what SHOW CLIENTS, the metrics and the log say ----------------------------------------


PIN_CASES: dict[str, list[str]] = {
    "advisory_lock": ["select pg_advisory_lock(44)"],
    "temp_object": ["create temp table h17_pinned (v int)"],
    "hold_cursor": ["begin", "declare h17_pin_cur cursor with hold for select 1", "commit"],
    "role": ["set role {role}"],
    "load": ["load 'auto_explain'"],
    "seed": ["set seed to 0.5"],
    # (a LISTEN alone is answered by pgtarn's listener connection, and pins nothing; one
    # in a Query with other statements runs on the server)
    "listen": ["listen h17_channel; select 1"],
    "untracked": ["select set_config('work_mem', current_setting('work_mem'), false)"],
}


@pytest.mark.parametrize("reason", sorted(PIN_CASES))
def test_pin_reason_is_shown(
    pgtarn_factory: PgtarnFactory,
    pg_cluster: TempCluster,
    member_role: str,
    superuser_login: tuple[str, str],
    reason: str,
) -> None:
    """Each pin reason shows in SHOW CLIENTS' pinned column, in pgtarn_clients_pinned and
    pgtarn_client_pins_total{reason}, and in one log line."""
    user, password = "app", "app_pass"
    userlist = None
    if reason == "load":
        with superuser_connect(pg_cluster) as su:
            try:
                su.execute("load 'auto_explain'")
            except psycopg.Error as exc:
                pytest.skip(f"auto_explain cannot be loaded in this PostgreSQL: {exc}")
        user, password = superuser_login
        userlist = {**ROLE_PASSWORDS, user: password}
    port = free_port()
    proc = pgtarn_factory(
        settings={"default_pool_size": 1, "metrics_port": port}, userlist=userlist
    )
    with connect(proc, user=user, password=password, autocommit=True) as a:
        for statement in PIN_CASES[reason]:
            a.execute(statement.format(role=member_role))
        row = client_row(proc)
        assert row["pinned"] == reason
        if reason not in ("role", "seed", "untracked"):  # these touch a setting of that name
            assert row["tracked_settings"] == ""
        samples = scrape(port)
        assert value(samples, "pgtarn_clients_pinned", database="app", user=user) == 1
        assert (
            value(samples, "pgtarn_client_pins_total", database="app", user=user, reason=reason)
            == 1
        )
        assert wait_for(
            lambda: any(
                "pinned to its server" in line and reason in line
                for line in proc.log_text().splitlines()
            ),
            timeout=5,
        ), proc.log_text()


def test_tracked_settings_lists_names(pgtarn_factory: PgtarnFactory) -> None:
    """SHOW CLIENTS' tracked_settings lists the client's tracked names, sorted and lower case,
    without values; SET LOCAL adds none and tracking pins nothing."""
    proc = pgtarn_factory(settings={"default_pool_size": 1})
    with connect(proc, autocommit=True) as a:
        a.execute("set Work_Mem = '2MB'")
        a.execute("SET search_path TO public")
        a.execute("select set_config('lock_timeout', '1s', false)")
        a.execute("begin")
        a.execute("set local statement_timeout = '1s'")
        a.execute("commit")
        row = client_row(proc)
        assert row["tracked_settings"] == "lock_timeout,search_path,work_mem"
        assert row["pinned"] == ""


def test_pins_combine_and_end_one_by_one(pgtarn_factory: PgtarnFactory) -> None:
    """Two reasons at once show sorted; unlocking and UNLISTEN * end them and the gauge drops."""
    port = free_port()
    proc = pgtarn_factory(
        settings={"default_pool_size": 2, "metrics_port": port, "query_wait_timeout": RELEASE_WAIT}
    )
    labels = {"database": "app", "user": "app"}
    with connect(proc, autocommit=True) as a:
        a_pid = backend_pid(a)
        a.execute("listen h17_multi; select 1")  # on the server: pins
        a.execute("select pg_advisory_lock(45)")
        assert client_row(proc)["pinned"] == "advisory_lock,listen"
        samples = scrape(port)
        assert value(samples, "pgtarn_clients_pinned", **labels) == 1
        for reason in ("advisory_lock", "listen"):
            assert value(samples, "pgtarn_client_pins_total", reason=reason, **labels) == 1
        a.execute("select pg_advisory_unlock(45)")
        assert client_row(proc)["pinned"] == "listen"
        a.execute("unlisten *")
        assert client_row(proc)["pinned"] == ""
        assert value(scrape(port), "pgtarn_clients_pinned", **labels) == 0
        assert_server_free(proc, a_pid)


# -- 9. the switches ------------------------------------------------------------------------


def test_pin_session_state_off_refuses_what_would_pin(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster
) -> None:
    """With pin_session_state = 0 an advisory lock is refused with 0A000 naming the setting,
    before it runs, and the client goes on."""
    proc = pgtarn_factory(settings={"default_pool_size": 1, "pin_session_state": 0})
    a, b = shared_pair(proc)
    with a, b:
        with pytest.raises(psycopg.errors.FeatureNotSupported) as caught:
            a.execute("select pg_advisory_lock(1)")
        assert caught.value.sqlstate == "0A000"
        assert "pin_session_state" in str(caught.value)
        assert "advisory_lock" in str(caught.value)
        assert advisory_locks(pg_cluster, 1) == 0
        assert a.execute("select 1").fetchone() == (1,)
        assert b.execute("select 2").fetchone() == (2,)


def test_track_session_state_off_keeps_the_old_leak(pgtarn_factory: PgtarnFactory) -> None:
    """With track_session_state = 0 A's statement_timeout reaches B again (the switch works)."""
    proc = pgtarn_factory(settings={"default_pool_size": 1, "track_session_state": 0})
    a, b = shared_pair(proc)
    with a, b:
        a.execute("set statement_timeout = '200ms'")
        with pytest.raises(psycopg.errors.QueryCanceled):
            b.execute("select pg_sleep(0.5)")


# -- 10. a client that leaves ---------------------------------------------------------------


def test_client_leaving_inside_a_transaction_leaves_no_setting(
    pgtarn_factory: PgtarnFactory, pg_dsn: str
) -> None:
    """A client that SETs, then disconnects inside a transaction, leaves neither its committed
    nor its in-transaction settings to the next client of its server."""
    names = ("work_mem", "lock_timeout")
    base = defaults(pg_dsn, *names)
    proc = pgtarn_factory(settings={"default_pool_size": 1})
    a = connect(proc, autocommit=True)
    a_pid = backend_pid(a)
    a.execute("set work_mem = '3333kB'")
    a.execute("begin")
    a.execute("set lock_timeout = '7s'")
    a.close()
    with connect(proc, autocommit=True) as b:
        assert backend_pid(b) == a_pid, "the next client must get A's server for this to test"
        assert {n: show_setting(b, n) for n in names} == base
