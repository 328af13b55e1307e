"""The harness's TempCluster as the pg_cluster fixture makes it: roles, auth methods, psql."""

from __future__ import annotations

import asyncio

import asyncpg
import psycopg
import pytest

from pgtarn.proto.build import quote_ident
from tests.support import ClusterError, TempCluster

# role, password, the auth method pg_hba.conf must make the server ask for
LOGINS = [
    ("scram_user", "scram_pass", "scram-sha-256"),
    ("md5_user", "md5_pass", "md5"),
    ("password_user", "password_pass", "password"),
    ("trust_user", None, "none"),
    ("app", "app_pass", "scram-sha-256"),
]


def _require_auth(method: str) -> dict[str, str]:
    """libpq >= 16 can insist on the auth method the server uses; older ones can't."""
    if psycopg.pq.version() >= 160000:
        return {"require_auth": method}
    return {}


@pytest.mark.parametrize(("user", "password", "method"), LOGINS)
def test_role_logs_in_with_its_method(
    pg_cluster: TempCluster, user: str, password: str | None, method: str
) -> None:
    dsn = pg_cluster.dsn(user, password, dbname="app", **_require_auth(method))
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute("select current_user").fetchone() == (user,)


def test_stored_passwords(pg_cluster: TempCluster) -> None:
    assert pg_cluster.scram_verifier("scram_user").startswith("SCRAM-SHA-256$4096:")
    assert pg_cluster.scram_verifier("app").startswith("SCRAM-SHA-256$")
    assert pg_cluster.stored_password("md5_user").startswith("md5")
    with pytest.raises(ClusterError):
        pg_cluster.scram_verifier("md5_user")


def test_items_table(pg_dsn: str) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        rows = conn.execute("select id, name from items order by id").fetchall()
        owner = conn.execute("select tableowner from pg_tables where tablename = 'items'")
        assert owner.fetchone() == ("app",)
    assert len(rows) == 3
    assert [r[0] for r in rows] == [1, 2, 3]


def test_every_role_can_read_items(pg_cluster: TempCluster) -> None:
    dsn = pg_cluster.dsn("scram_user", "scram_pass", dbname="app")
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute("select count(*) from items").fetchone() == (3,)


@pytest.mark.parametrize("user", ["scram_user", "md5_user", "password_user"])
def test_wrong_password_is_28P01(pg_cluster: TempCluster, user: str) -> None:
    async def connect() -> None:
        conn = await asyncpg.connect(
            host=pg_cluster.host,
            port=pg_cluster.port,
            user=user,
            password="wrong",
            database="app",
        )
        await conn.close()

    with pytest.raises(asyncpg.PostgresError) as info:
        asyncio.run(connect())
    assert info.value.sqlstate == "28P01"

    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(pg_cluster.dsn(user, "wrong", dbname="app"))


def test_psql_returns_output(pg_cluster: TempCluster) -> None:
    assert pg_cluster.psql("select 1;\nselect 'a' || 'b';\n") == "1\nab\n"
    assert pg_cluster.psql("select count(*) from items", dbname="app").strip() == "3"


def test_psql_raises_on_bad_sql(pg_cluster: TempCluster) -> None:
    with pytest.raises(ClusterError, match="no_such_table"):
        pg_cluster.psql("select * from no_such_table")
    with pytest.raises(ClusterError):
        pg_cluster.psql("select 1;\nthis is not sql;\n")


def test_cluster_layout(pg_cluster: TempCluster) -> None:
    assert pg_cluster.host == "127.0.0.1"
    assert pg_cluster.running
    assert pg_cluster.data_dir.startswith(pg_cluster.socket_dir)
    assert pg_cluster.psql("show max_connections").strip() == "300"
    assert pg_cluster.psql("show fsync").strip() == "off"
    sockdir = pg_cluster.psql("show unix_socket_directories").strip()
    assert sockdir == pg_cluster.socket_dir


def test_create_role_quotes_the_password(pg_cluster: TempCluster) -> None:
    # the package's quote_literal writes E'...' when there is a backslash: a\b stays a\b
    name, password = 'we"ird role', "it's a\\b"
    pg_cluster.create_role(name, password)
    try:
        dsn = pg_cluster.dsn(name, password, dbname="app")
        with psycopg.connect(dsn, autocommit=True) as conn:
            assert conn.execute("select current_user").fetchone() == (name,)
        with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
            psycopg.connect(pg_cluster.dsn(name, "it's a\\\\b", dbname="app"))
    finally:
        pg_cluster.psql(f"DROP ROLE {quote_ident(name)}")
