"""ParameterStatus tracking: one client's SET never leaks into another's transaction."""

from __future__ import annotations

import asyncio

import asyncpg
import psycopg
import pytest

from .drivers import aconnect, connect
from .rawpg import RawClient, error_fields


def show(conn: psycopg.Connection, name: str) -> str:  # type: ignore[type-arg]
    row = conn.execute(f"show {name}").fetchone()
    assert row is not None
    return str(row[0])


def test_set_timezone_and_application_name_stay_with_their_client(pgtarn_factory):  # type: ignore[no-untyped-def]
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


def test_startup_parameters_are_applied_per_client(pgtarn_factory):  # type: ignore[no-untyped-def]
    proc = pgtarn_factory(settings={"default_pool_size": 1})
    with connect(proc, autocommit=True, application_name="first",
                 options=None) as a, connect(proc, autocommit=True,
                                             application_name="second") as b:
        assert a.info.parameter_status("application_name") == "first"
        for _ in range(2):
            assert show(a, "application_name") == "first"
            assert show(b, "application_name") == "second"


def test_asyncpg_client_encoding_and_server_settings(pgtarn_factory):  # type: ignore[no-untyped-def]
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


def test_unsupported_startup_parameter(pgtarn_factory):  # type: ignore[no-untyped-def]
    proc = pgtarn_factory()
    raw = RawClient(proc.host, proc.port)
    try:
        raw.startup(user="app", database="app", extra_float_digits="2")
        msg_type, body = raw.read_message()
        assert msg_type == "E"
        fields = error_fields(body)
        assert fields["C"] == "08P01"
        assert fields["M"] == "unsupported startup parameter: extra_float_digits"
    finally:
        raw.close()
    with pytest.raises(psycopg.OperationalError, match="unsupported startup parameter"):
        connect(proc, options="-c work_mem=8MB")


def test_ignore_startup_parameters(pgtarn_factory):  # type: ignore[no-untyped-def]
    proc = pgtarn_factory(settings={"ignore_startup_parameters": "extra_float_digits, options"})
    with connect(proc, autocommit=True, options="-c work_mem=8MB") as conn:
        assert conn.execute("select 1").fetchone() == (1,)


def test_track_extra_parameters(pgtarn_factory):  # type: ignore[no-untyped-def]
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
    ("DateStyle", "iso, mdy"), ("DateStyle", "german"), ("DateStyle", "sql"),
    ("DateStyle", "ymd"), ("DateStyle", "Postgres, dmy"), ("DateStyle", "euro"),
    ("TimeZone", "europe/paris"), ("TimeZone", "UTC"),
    ("IntervalStyle", "ISO_8601"), ("standard_conforming_strings", "yes"),
]


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_client_encoding_is_reported_as_postgresql_reports_it(pgtarn_factory, pg_dsn, encoding):  # type: ignore[no-untyped-def]
    """The welcome's ParameterStatus is PostgreSQL's canonical form (utf8 -> UTF8), before
    any query, and after queries on a shared server too."""
    with psycopg.connect(pg_dsn, client_encoding=encoding) as direct:
        expected = direct.info.parameter_status("client_encoding")
    assert expected is not None
    proc = pgtarn_factory(settings={"default_pool_size": 1})
    for _ in range(2):
        with connect(proc, autocommit=True, client_encoding=encoding) as conn:
            assert conn.info.parameter_status("client_encoding") == expected
            shown = conn.execute("show client_encoding").fetchone()[0]  # bytes in SQL_ASCII
            assert (shown.decode() if isinstance(shown, bytes) else shown) == expected
            assert conn.info.parameter_status("client_encoding") == expected


@pytest.mark.parametrize(("name", "value"), STARTUP_VALUES)
def test_startup_values_as_postgresql_says(pgtarn_factory, pg_cluster, pg_roles, name, value):  # type: ignore[no-untyped-def]
    """The same for the other tracked parameters, sent as startup parameters (asyncpg).
    TimeZone's spelling comes from PostgreSQL's time zone files: the first client to use a
    spelling is told PostgreSQL's as its first query runs, the next ones at welcome."""
    async def reported(host: str, port: int) -> tuple[str, str, str]:
        conn = await asyncpg.connect(host=host, port=port, user="app", password=pg_roles["app"],
                                     database="app", ssl=False, statement_cache_size=0,
                                     server_settings={name: value})
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
