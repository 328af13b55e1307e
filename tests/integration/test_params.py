"""ParameterStatus tracking: one client's SET never leaks into another's transaction."""

from __future__ import annotations

import asyncio

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
