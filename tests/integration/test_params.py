"""ParameterStatus tracking: one client's SET never leaks into another's transaction."""

from __future__ import annotations

import asyncio

import asyncpg
import psycopg
import pytest

from tests.support import TempCluster

from .conftest import PgtarnFactory
from .drivers import aconnect, connect, scalar
from .rawpg import RawClient, error_fields


def show(conn: psycopg.Connection, name: str) -> str:
    row = conn.execute(f"show {name}").fetchone()
    assert row is not None
    return str(row[0])


def test_set_timezone_and_application_name_stay_with_their_client(
    pgtarn_factory: PgtarnFactory,
) -> None:
    proc = pgtarn_factory(settings={"default_pool_size": 1})
    with connect(proc, autocommit=True) as a, connect(proc, autocommit=True) as b:
        pid = a.execute("select pg_backend_pid()").fetchone()
        assert b.execute("select pg_backend_pid()").fetchone() == pid  # one shared server
        default_tz = show(b, "timezone")
        a.execute("set timezone = 'Asia/Tokyo'")
        a.execute("set application_name = 'client-a'")
        b.execute("set DateStyle = 'SQL, DMY'")
        for _ in range(3):
            assert show(a, "timezone") == "Asia/Tokyo"
            assert show(b, "timezone") == default_tz
            assert show(a, "application_name") == "client-a"
            assert show(b, "application_name") == ""
            assert show(a, "datestyle") == "ISO, MDY"
            assert show(b, "datestyle") == "SQL, DMY"
        # the client-side view (ParameterStatus) follows too
        assert a.info.parameter_status("TimeZone") == "Asia/Tokyo"
        assert a.info.parameter_status("application_name") == "client-a"
        assert b.info.parameter_status("DateStyle") == "SQL, DMY"


def test_startup_parameters_are_applied_per_client(pgtarn_factory: PgtarnFactory) -> None:
    proc = pgtarn_factory(settings={"default_pool_size": 1})
    with (
        connect(proc, autocommit=True, application_name="first", options=None) as a,
        connect(proc, autocommit=True, application_name="second") as b,
    ):
        assert a.info.parameter_status("application_name") == "first"
        for _ in range(2):
            assert show(a, "application_name") == "first"
            assert show(b, "application_name") == "second"


def test_asyncpg_client_encoding_and_server_settings(pgtarn_factory: PgtarnFactory) -> None:
    proc = pgtarn_factory(settings={"default_pool_size": 1})

    async def scenario() -> tuple[str, str, str]:
        a = await aconnect(proc, server_settings={"application_name": "apg", "TimeZone": "UTC"})
        b = await aconnect(proc, server_settings={"TimeZone": "America/New_York"})
        tz_a = await a.fetchval("show timezone")
        tz_b = await b.fetchval("show timezone")
        enc = await a.fetchval("show client_encoding")
        await a.close()
        await b.close()
        return tz_a, tz_b, enc

    assert asyncio.run(scenario()) == ("UTC", "America/New_York", "UTF8")


def test_other_startup_parameters_are_session_settings(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster
) -> None:
    """A startup parameter pgtarn does not track (pgJDBC's extra_float_digits, asyncpg's
    server_settings) is a session setting, carried from server to server as SET is; where the
    session is not tracked (session mode), it is refused with PgBouncer's words."""
    base = f"host={pg_cluster.host} port={pg_cluster.port} dbname=app"
    proc = pgtarn_factory(
        databases={"app": base, "session_app": f"{base} pool_mode=session"},
        settings={"default_pool_size": 1},
    )

    async def scenario() -> list[str]:
        a = await aconnect(proc, server_settings={"extra_float_digits": "2"})
        b = await aconnect(proc)  # shares the only server between a's transactions
        seen = []
        for _ in range(3):
            seen.append(await a.fetchval("show extra_float_digits"))
            seen.append(await b.fetchval("show extra_float_digits"))
        await a.close()
        await b.close()
        return seen

    assert asyncio.run(scenario()) == ["2", "1"] * 3

    async def session_mode() -> None:
        conn = await aconnect(
            proc, dbname="session_app", server_settings={"extra_float_digits": "2"}
        )
        await conn.close()

    with pytest.raises(Exception, match="unsupported startup parameter: extra_float_digits"):
        asyncio.run(session_mode())
    with pytest.raises(psycopg.OperationalError, match="unsupported startup parameter"):
        connect(proc, options="-c work_mem=8MB", dbname="session_app")


def test_ignore_startup_parameters(pgtarn_factory: PgtarnFactory) -> None:
    proc = pgtarn_factory(settings={"ignore_startup_parameters": "extra_float_digits, options"})
    with connect(proc, autocommit=True, options="-c work_mem=8MB") as conn:
        assert conn.execute("select 1").fetchone() == (1,)


def test_track_extra_parameters(pgtarn_factory: PgtarnFactory) -> None:
    proc = pgtarn_factory(
        settings={"default_pool_size": 1, "track_extra_parameters": "IntervalStyle"}
    )
    with connect(proc, autocommit=True) as a, connect(proc, autocommit=True) as b:
        a.execute("set IntervalStyle = 'iso_8601'")
        assert show(b, "intervalstyle") == "postgres"
        assert show(a, "intervalstyle") == "iso_8601"


#: Startup values PostgreSQL reports in another form (and some it keeps as given).
ENCODINGS = ["utf8", "unicode", "latin1", "ISO-8859-5", "win1252", "sql_ascii", "Windows-1251"]
STARTUP_VALUES = [
    ("DateStyle", "iso, mdy"),
    ("DateStyle", "german"),
    ("DateStyle", "sql"),
    ("DateStyle", "ymd"),
    ("DateStyle", "Postgres, dmy"),
    ("DateStyle", "euro"),
    ("TimeZone", "europe/paris"),
    ("TimeZone", "UTC"),
    ("IntervalStyle", "ISO_8601"),
    ("standard_conforming_strings", "yes"),
]


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_client_encoding_is_reported_as_postgresql_reports_it(
    pgtarn_factory: PgtarnFactory, pg_dsn: str, encoding: str
) -> None:
    """The welcome's ParameterStatus is PostgreSQL's canonical form (utf8 -> UTF8), before
    any query, and after queries on a shared server too."""
    with psycopg.connect(pg_dsn, client_encoding=encoding) as direct:
        expected = direct.info.parameter_status("client_encoding")
    assert expected is not None
    proc = pgtarn_factory(settings={"default_pool_size": 1})
    for _ in range(2):
        with connect(proc, autocommit=True, client_encoding=encoding) as conn:
            assert conn.info.parameter_status("client_encoding") == expected
            shown = scalar(conn.execute("show client_encoding"))  # bytes in SQL_ASCII
            assert (shown.decode() if isinstance(shown, bytes) else shown) == expected
            assert conn.info.parameter_status("client_encoding") == expected


@pytest.mark.parametrize(("name", "value"), STARTUP_VALUES)
def test_startup_values_as_postgresql_says(
    pgtarn_factory: PgtarnFactory,
    pg_cluster: TempCluster,
    pg_roles: dict[str, str],
    name: str,
    value: str,
) -> None:
    """The same for the other tracked parameters, sent as startup parameters (asyncpg).
    TimeZone's spelling comes from PostgreSQL's time zone files: the first client to use a
    spelling is told PostgreSQL's as its first query runs, the next ones at welcome."""

    async def reported(host: str, port: int) -> tuple[str, str, str]:
        conn = await asyncpg.connect(
            host=host,
            port=port,
            user="app",
            password=pg_roles["app"],
            database="app",
            ssl=False,
            statement_cache_size=0,
            server_settings={name: value},
        )
        try:
            welcome = getattr(conn.get_settings(), name)
            shown = await conn.fetchval(f"show {name}")
            return welcome, shown, getattr(conn.get_settings(), name)
        finally:
            await conn.close()

    expected = asyncio.run(reported(pg_cluster.host, pg_cluster.port))
    assert expected[0] == expected[2]
    proc = pgtarn_factory(settings={"default_pool_size": 1})
    first = asyncio.run(reported(proc.host, proc.port))
    if name == "TimeZone":
        assert first[1:] == expected[1:]
    else:
        assert first == expected
    assert asyncio.run(reported(proc.host, proc.port)) == expected


def test_options_with_tracked_parameters(pgtarn_factory: PgtarnFactory) -> None:
    """-c name=value and --name=value pairs with backslash escapes, as PgBouncer reads them;
    tracked ones are welcomed in PostgreSQL's form and stay with their client."""
    proc = pgtarn_factory(settings={"default_pool_size": 1})
    options = r"  -c TimeZone=Europe/Paris  -cdatestyle=german,\ ymd --application-name=my\ app"
    with connect(proc, autocommit=True, options=options) as a, connect(proc, autocommit=True) as b:
        assert a.info.parameter_status("TimeZone") == "Europe/Paris"
        assert a.info.parameter_status("DateStyle") == "German, YMD"
        assert a.info.parameter_status("application_name") == "my app"
        for _ in range(2):
            assert show(a, "timezone") == "Europe/Paris"
            assert show(a, "datestyle") == "German, YMD"
            assert show(a, "application_name") == "my app"
            assert show(b, "datestyle") == "ISO, MDY" and show(b, "application_name") == ""
    # a parameter given outside options wins, as in PostgreSQL
    with connect(
        proc, autocommit=True, options="-c application_name=inner", application_name="outer"
    ) as conn:
        assert show(conn, "application_name") == "outer"


def test_options_with_other_settings_in_transaction_mode(pgtarn_factory: PgtarnFactory) -> None:
    """Settings that are not tracked parameters are the client's session settings from the
    start: SET on every server it gets, and what RESET returns to."""
    proc = pgtarn_factory(settings={"default_pool_size": 1})
    with (
        connect(proc, autocommit=True, options=r"-c work_mem=8MB -c search_path=a\,\ public") as a,
        connect(proc, autocommit=True) as b,
    ):
        for _ in range(2):
            assert show(a, "work_mem") == "8MB"
            assert show(a, "search_path") == "a, public"
            assert show(b, "work_mem") == "4MB"
        a.execute("set work_mem = '16MB'")
        assert show(b, "work_mem") == "4MB"
        assert show(a, "work_mem") == "16MB"
        a.execute("reset work_mem")
        assert show(b, "work_mem") == "4MB"
        assert show(a, "work_mem") == "8MB"
        a.execute("set work_mem = '16MB'")
        a.execute("reset all")
        assert show(a, "work_mem") == "8MB" and show(a, "search_path") == "a, public"


def test_options_with_other_settings_in_statement_mode(pgtarn_factory: PgtarnFactory) -> None:
    """PgBouncer refuses `-c enable_seqscan=false` in statement mode; pgtarn keeps it as the
    client's session setting: each statement, on whichever server, runs with it, and no
    other client ever does (simple and extended protocol, psycopg and asyncpg)."""
    proc = pgtarn_factory(settings={"pool_mode": "statement", "default_pool_size": 2})

    async def shown(conn: asyncpg.Connection) -> list[str]:
        return [await conn.fetchval("show enable_seqscan") for _ in range(6)]

    async def main() -> tuple[list[str], list[str]]:
        a = await aconnect(proc, server_settings={"options": "-c enable_seqscan=false"})
        b = await aconnect(proc)
        try:
            both = await asyncio.gather(shown(a), shown(b))
            return both[0], both[1]
        finally:
            await a.close()
            await b.close()

    with (
        connect(proc, autocommit=True, options="-c enable_seqscan=false") as a,
        connect(proc, autocommit=True) as b,
    ):
        for prepare in (False, True, None):
            for _ in range(3):
                assert a.execute("show enable_seqscan", prepare=prepare).fetchone() == ("off",)
                assert b.execute("show enable_seqscan", prepare=prepare).fetchone() == ("on",)
    assert asyncio.run(main()) == (["off"] * 6, ["on"] * 6)


def test_options_refused_as_pgbouncer_refuses_them(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster
) -> None:
    base = f"host={pg_cluster.host} port={pg_cluster.port} dbname=app"
    proc = pgtarn_factory(databases={"app": base, "session_app": f"{base} pool_mode=session"})
    only = "unsupported options startup parameter: only '-c config=val' and '--config=val' are"
    for options in ("-d", "-c timezone", "-c =x", "work_mem=1MB"):
        raw = RawClient(proc.host, proc.port)
        try:
            raw.startup(user="app", database="app", options=options)
            msg_type, body = raw.read_message()
            assert msg_type == "E"
            assert error_fields(body)["C"] == "08P01"
            assert error_fields(body)["M"].startswith(only)
        finally:
            raw.close()
    # nothing carries a setting from server to server in session mode
    with pytest.raises(
        psycopg.OperationalError, match="unsupported startup parameter in options: work_mem"
    ):
        connect(proc, options="-c work_mem=8MB", dbname="session_app")
    with connect(proc, options="-c TimeZone=UTC", dbname="session_app") as conn:
        assert show(conn, "timezone") == "UTC"


def test_options_in_ignore_startup_parameters(pgtarn_factory: PgtarnFactory) -> None:
    """Listed there, options' other settings are dropped; tracked ones still apply."""
    proc = pgtarn_factory(settings={"ignore_startup_parameters": "options"})
    with connect(
        proc, autocommit=True, options="-c enable_seqscan=off -c TimeZone=Asia/Tokyo"
    ) as conn:
        assert show(conn, "enable_seqscan") == "on"
        assert show(conn, "timezone") == "Asia/Tokyo"
    proc = pgtarn_factory(settings={"ignore_startup_parameters": "enable_seqscan"})
    with connect(proc, autocommit=True, options="-c enable_seqscan=off -c work_mem=5MB") as conn:
        assert show(conn, "enable_seqscan") == "on"
        assert show(conn, "work_mem") == "5MB"
