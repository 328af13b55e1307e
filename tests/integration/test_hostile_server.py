"""A server that misbehaves is closed and its client gets an error; nobody else notices."""

from __future__ import annotations

import psycopg
import pytest

from pgtarn.proto import build
from pgtarn.proto.server_login import ServerAuth
from tests.support import PgtarnProcess, TempCluster

from .conftest import PgtarnFactory
from .drivers import connect
from .fakepg import FakePostgres
from .pgstat import wait_until
from .rawpg import RawClient, error_fields
from .test_admin import admin, show
from .test_timeouts import raw_login

pytestmark = pytest.mark.integration

SCRIPTS = [
    "error_no_sqlstate",
    "error_empty",
    "scram_bad_nonce",
    "scram_huge_iterations",
    "garbage_login",
    "stall",
    "garbage_result",
    "cut_mid_row",
    "error_no_sqlstate_result",
    "fine",
]


@pytest.fixture
def hostile(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster, fake_pg: FakePostgres
) -> PgtarnProcess:
    databases = {name: fake_pg.connstr(name) for name in SCRIPTS}
    databases["app"] = f"host={pg_cluster.host} port={pg_cluster.port} dbname=app"
    return pgtarn_factory(
        databases=databases,
        settings={"query_timeout": 0.5, "server_connect_timeout": 2, "server_login_retry": 0.1},
    )


def failure(proc: PgtarnProcess, dbname: str, sql: str = "select 1") -> psycopg.Error:
    with pytest.raises(psycopg.Error) as info:
        with connect(proc, dbname=dbname, autocommit=True) as conn:
            conn.execute(sql)
    return info.value


def login_error(proc: PgtarnProcess, dbname: str) -> dict[str, str]:
    """The ErrorResponse fields that end a raw login to dbname (which must fail)."""
    raw = RawClient(proc.host, proc.port)
    login = ServerAuth("app", "app_pass")
    raw.send(build.startup_message({"user": "app", "database": dbname}))
    try:
        while True:
            msg_type, body = raw.read_message()
            if msg_type == "E":
                return error_fields(body)
            reply = login.feed(ord(msg_type), body)
            assert not login.done, "logged in"
            if reply:
                raw.send(reply)
    finally:
        raw.close()


LOGIN_FAILURES = {
    "error_no_sqlstate": "no code here",
    "error_empty": "server error without message",
    "scram_bad_nonce": "nonce",
    "scram_huge_iterations": "iteration count",
    "garbage_login": "invalid message length",
}


@pytest.mark.parametrize("script", list(LOGIN_FAILURES))
def test_bad_server_login_fails_the_client_cleanly(
    hostile: PgtarnProcess, fake_pg: FakePostgres, script: str
) -> None:
    with connect(hostile, autocommit=True) as bystander:
        fields = login_error(hostile, script)
        assert fields["S"] == "FATAL" and len(fields["C"]) == 5, fields
        assert LOGIN_FAILURES[script] in fields["M"], fields
        assert bystander.execute("select 1").fetchone() == (1,)
    assert fake_pg.seen.get(script)
    with admin(hostile) as console:  # no server of that database kept
        assert not [r for r in show(console, "SERVERS") if r["database"] == script]


def test_a_stalled_result_is_ended_by_query_timeout_its_server_closed(
    hostile: PgtarnProcess, fake_pg: FakePostgres
) -> None:
    with connect(hostile, autocommit=True) as bystander:
        with connect(hostile, dbname="stall", autocommit=True) as conn:
            with pytest.raises(psycopg.OperationalError) as info:
                conn.execute("select 1")
            assert info.value.sqlstate == "08P01" and "query timeout" in str(info.value)
            assert conn.closed
        assert bystander.execute("select 1").fetchone() == (1,)
    # a cancel for its backend too, so that a query would not run on unattended
    wait_until(lambda: fake_pg.cancels == 1, what="the cancel sent")
    with admin(hostile) as console:
        assert not [r for r in show(console, "SERVERS") if r["database"] == "stall"]


def test_garbage_in_a_result_closes_that_server_and_its_client(hostile: PgtarnProcess) -> None:
    with connect(hostile, autocommit=True) as bystander:
        with connect(hostile, dbname="garbage_result", autocommit=True) as conn:
            with pytest.raises(psycopg.OperationalError) as info:
                conn.execute("select 1")
            # 08006 when pgtarn could stop at a message boundary, else just the close
            assert info.value.sqlstate in ("08006", None)
            assert conn.closed
        assert bystander.execute("select 1").fetchone() == (1,)
    assert "invalid message length" in hostile.log_text()
    with admin(hostile) as console:
        assert not [r for r in show(console, "SERVERS") if r["database"] == "garbage_result"]


def test_an_error_without_sqlstate_mid_session_is_relayed(hostile: PgtarnProcess) -> None:
    with connect(hostile, dbname="error_no_sqlstate_result", autocommit=True) as conn:
        with pytest.raises(psycopg.Error, match="no code here") as info:
            conn.execute("select 1")
        assert info.value.sqlstate is None  # as the server sent it: nothing invented
        assert not conn.closed
    with connect(hostile, dbname="fine", autocommit=True) as conn:
        assert conn.execute("select 1").fetchone() == ("ok",)


def test_a_server_lost_mid_message_closes_its_client_without_corrupting_the_stream(
    hostile: PgtarnProcess,
) -> None:
    raw = raw_login(hostile, dbname="cut_mid_row")
    raw.send(build.query("select 1"))
    assert raw.read_message()[0] == "T"
    received = b""
    while chunk := raw.sock.recv(65536):
        received += chunk
    raw.close()
    # exactly the part of the DataRow the server sent: no ErrorResponse spliced into it
    assert received == build.data_row(["x" * 1000])[:200]
    assert "server connection crashed" in hostile.log_text()
