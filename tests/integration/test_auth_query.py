"""auth_query: secrets looked up in PostgreSQL as auth_user; nothing stored in auth_file."""

from __future__ import annotations

import itertools
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import psycopg
import pytest

from pgtarn.proto import build
from tests.support import PgtarnProcess, TempCluster

from .certs import Pki
from .conftest import PgtarnFactory
from .drivers import connect
from .pgstat import wait_until
from .test_admin import admin, show
from .test_auth import login_error
from .test_reload import reload
from .test_timeouts import query, raw_login

pytestmark = pytest.mark.integration

AUTH_USER, AUTH_PASSWORD = "pgtarn_auth", "auth_pass"
_names = itertools.count(1)


@pytest.fixture(scope="module")
def auth_role(pg_cluster: TempCluster) -> str:
    """A superuser pgtarn looks secrets up as (pg_authid needs one; see the function below)."""
    exists = pg_cluster.psql(f"SELECT 1 FROM pg_roles WHERE rolname = '{AUTH_USER}'").strip()
    if not exists:
        pg_cluster.create_role(AUTH_USER, AUTH_PASSWORD, superuser=True)
    return AUTH_USER


class MakeRole(Protocol):
    """The role fixture: make(password, *options, name=None) -> the new role's name."""

    def __call__(self, password: str, *options: str, name: str | None = None) -> str: ...


@pytest.fixture
def role(pg_cluster: TempCluster) -> Iterator[MakeRole]:
    """make(password, *options) -> a new role's name; dropped at the end of the test."""
    made: list[str] = []

    def make(password: str, *options: str, name: str | None = None) -> str:
        name = name or f"aq_user_{next(_names)}"
        pg_cluster.create_role(name, password)
        if options:
            pg_cluster.psql(f'ALTER ROLE "{name}" ' + " ".join(options))  # app: PUBLIC may connect
        made.append(name)
        return name

    yield make
    for name in made:
        pg_cluster.psql(f'DROP ROLE IF EXISTS "{name.replace(chr(34), chr(34) * 2)}"')


@pytest.fixture
def proc(pgtarn_factory: PgtarnFactory, auth_role: str) -> PgtarnProcess:
    """pgtarn whose auth_file holds only auth_user's password."""
    return pgtarn_factory(
        settings={"auth_user": auth_role}, userlist={AUTH_USER: AUTH_PASSWORD, "app": "app_pass"}
    )


def logs_in(proc: PgtarnProcess, user: str, password: str | None, **kw: Any) -> bool:
    with connect(proc, user, password, **kw) as conn:
        return conn.execute("select current_user").fetchone() == (user,)


@pytest.mark.parametrize("auth_type", ["scram-sha-256", "md5", "plain"])
def test_scram_and_md5_secrets_found_by_the_default_query(
    pgtarn_factory: PgtarnFactory, auth_role: str, pg_cluster: TempCluster, auth_type: str
) -> None:
    proc = pgtarn_factory(
        settings={"auth_user": auth_role, "auth_type": auth_type},
        userlist={AUTH_USER: AUTH_PASSWORD},
    )
    # scram_user: a SCRAM verifier, passed through to PostgreSQL; md5_user: an md5 hash
    assert logs_in(proc, "scram_user", "scram_pass")
    if auth_type != "scram-sha-256":  # an md5 hash cannot answer a SCRAM challenge
        assert logs_in(proc, "md5_user", "md5_pass")
    assert login_error(proc, "scram_user", "wrong")[0] == "28P01"


def test_expired_and_nologin_roles_are_refused(proc: PgtarnProcess, role: MakeRole) -> None:
    fine = role("fine_pass")
    expired = role("old_pass", "VALID UNTIL '2000-01-01'")
    nologin = role("no_pass", "NOLOGIN")
    assert logs_in(proc, fine, "fine_pass")
    assert login_error(proc, expired, "old_pass")[0] == "28P01"  # its secret is NULL
    assert login_error(proc, nologin, "no_pass") == ("28000", "no such user")  # no row


@pytest.mark.parametrize("name", ["x' OR '1'='1", "a\\'; SELECT pg_sleep(30); --", "o'brien"])
def test_hostile_user_names_are_only_ever_parameters(
    proc: PgtarnProcess, role: MakeRole, name: str
) -> None:
    assert login_error(proc, name, "anything")[1] == "no such user"  # refused, no error
    made = role("quote_pass", name=name)  # and a role really named so logs in
    assert logs_in(proc, made, "quote_pass")


def test_search_path_of_the_client_never_reaches_the_query(
    pgtarn_factory: PgtarnFactory, auth_role: str, pg_cluster: TempCluster
) -> None:
    # what CVE-2025-12819 did: a function in another schema shadows now() in the query
    pg_cluster.psql(
        "CREATE SCHEMA IF NOT EXISTS evil;\n"
        "CREATE TABLE IF NOT EXISTS public.evil_ran (who text);\n"
        "GRANT ALL ON public.evil_ran TO PUBLIC;\n"
        "CREATE OR REPLACE FUNCTION evil.now() RETURNS timestamptz LANGUAGE plpgsql AS $$\n"
        "BEGIN INSERT INTO public.evil_ran VALUES (current_user); RETURN pg_catalog.now(); END\n"
        "$$;\n"
        "GRANT USAGE ON SCHEMA evil TO PUBLIC;\n",
        dbname="app",
    )
    try:
        for settings in (
            {"ignore_startup_parameters": "options"},
            {"track_extra_parameters": "search_path"},
        ):
            proc = pgtarn_factory(
                settings={"auth_user": auth_role, **settings}, userlist={AUTH_USER: AUTH_PASSWORD}
            )
            assert logs_in(
                proc, "scram_user", "scram_pass", options="-c search_path=evil,pg_catalog"
            )
        ran = pg_cluster.psql("SELECT count(*) FROM public.evil_ran", dbname="app").strip()
        assert ran == "0"
    finally:
        pg_cluster.psql("DROP SCHEMA evil CASCADE;\nDROP TABLE public.evil_ran;\n", dbname="app")


def test_a_changed_password_is_looked_up_again(
    proc: PgtarnProcess, role: MakeRole, pg_cluster: TempCluster
) -> None:
    name = role("first_pass")
    assert logs_in(proc, name, "first_pass")  # now cached
    pg_cluster.psql(f"ALTER ROLE {name} PASSWORD 'second_pass'")
    # the cached secret fails the new password once and is dropped: the next try asks again
    assert login_error(proc, name, "second_pass")[0] == "28P01"
    assert logs_in(proc, name, "second_pass")
    assert login_error(proc, name, "first_pass")[0] == "28P01"


def test_per_database_auth_user_query_and_dbname(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster, role: MakeRole
) -> None:
    # a SECURITY DEFINER function, so auth_user needs no superuser rights (app runs it)
    pg_cluster.psql(
        "CREATE OR REPLACE FUNCTION public.user_secret(p_user text, OUT usename name,\n"
        "  OUT passwd text) RETURNS record LANGUAGE sql SECURITY DEFINER\n"
        "  SET search_path = pg_catalog, pg_temp AS $$\n"
        "  SELECT rolname, rolpassword::text FROM pg_authid WHERE rolname = p_user\n"
        "    AND rolcanlogin $$;\n"
        "REVOKE ALL ON FUNCTION public.user_secret(text) FROM PUBLIC;\n"
        "GRANT EXECUTE ON FUNCTION public.user_secret(text) TO app;\n",
        dbname="postgres",
    )
    name = role("custom_pass")
    base = f"host={pg_cluster.host} port={pg_cluster.port}"
    proc = pgtarn_factory(
        databases={
            "app": f"{base} dbname=app",
            "custom": f"{base} dbname=app auth_user=app auth_dbname=lookups"
            " auth_query='SELECT usename, passwd FROM public.user_secret($1)'",
            "lookups": f"{base} dbname=postgres",
        },
        userlist={"app": "app_pass"},
    )  # no global auth_user: app has no lookups
    assert logs_in(proc, name, "custom_pass", dbname="custom")
    assert login_error(proc, name, "custom_pass", dbname="app")[0] == "28P01"


def test_a_lookup_that_cannot_log_in_fails_clearly_and_others_are_served(
    pgtarn_factory: PgtarnFactory, auth_role: str
) -> None:
    proc = pgtarn_factory(
        settings={"auth_user": auth_role},
        userlist={AUTH_USER: "not the password", "app": "app_pass"},
    )
    sqlstate, message = login_error(proc, "scram_user", "scram_pass")
    # PostgreSQL's refusal of auth_user, passed on as it is (as PgBouncer does)
    assert (sqlstate, message) == (
        "28P01",
        f'password authentication failed for user "{AUTH_USER}"',
    )
    assert (
        f'server login failed: FATAL password authentication failed for user "{AUTH_USER}"'
    ) in proc.log_text()
    raw = raw_login(proc)  # users of auth_file are not looked up
    assert query(raw, "select 1") == b"I"
    raw.send(build.TERMINATE)
    raw.close()


def test_a_lookup_in_a_database_postgresql_does_not_have_gets_its_refusal(
    proc: PgtarnProcess,
) -> None:
    """The "*" entry makes any database name one of pgtarn's: the lookup's login to it is
    refused by PostgreSQL, and the client gets that refusal as it is (not "could not look
    up the user"), as with PgBouncer."""
    refusal = 'database "no_such_db_aq" does not exist'
    assert login_error(proc, "scram_user", "scram_pass", dbname="no_such_db_aq") == (
        "3D000",
        refusal,
    )
    client_closed = rf"C-\d+: no_such_db_aq/scram_user@\S+ closing because: {refusal}"
    wait_until(
        lambda: re.search(client_closed, proc.log_text()) is not None,
        what="the client's close logged",
    )
    assert f"server login failed: FATAL {refusal}" in proc.log_text()


def test_auth_query_over_tls_with_channel_binding(
    pgtarn_factory: PgtarnFactory, pg_tls_cluster: TempCluster, pki: Pki
) -> None:
    pg_tls_cluster.psql(
        f"DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = "
        f"'{AUTH_USER}') THEN CREATE ROLE {AUTH_USER} LOGIN SUPERUSER PASSWORD "
        f"'{AUTH_PASSWORD}'; END IF; END $$"
    )
    proc = pgtarn_factory(
        databases={"app": f"host={pg_tls_cluster.host} port={pg_tls_cluster.port} dbname=app"},
        settings={
            "auth_user": AUTH_USER,
            "server_tls_sslmode": "verify-full",
            "server_tls_ca_file": pki.ca,
            "server_channel_binding": "require",
        },
        userlist={AUTH_USER: AUTH_PASSWORD},
    )
    with connect(proc, "tls_only", "tls_only_pass") as conn:  # hostssl-only in PostgreSQL
        assert conn.execute("select current_user").fetchone() == ("tls_only",)
    with pytest.raises(psycopg.OperationalError):
        connect(proc, "tls_only", "wrong").close()


def test_new_servers_after_a_reload_still_log_in(proc: PgtarnProcess) -> None:
    # both clients logged in (through auth_query) before the RELOAD and never again
    with (
        connect(proc, "scram_user", "scram_pass") as holder,
        connect(proc, "scram_user", "scram_pass", autocommit=True) as other,
    ):
        holder.execute("select 1")  # holds the pool's server in its transaction
        reload(proc)
        assert other.execute("select 2").fetchone() == (2,)  # a second server logs in
        holder.commit()


def test_a_reload_lets_a_lookup_under_way_finish(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster, auth_role: str
) -> None:
    # a query slow enough for the RELOAD to come while the client waits for its answer
    pg_cluster.psql(
        "CREATE OR REPLACE FUNCTION public.slow_secret(p_user text, OUT usename name,\n"
        "  OUT passwd text) RETURNS record LANGUAGE sql AS $$\n"
        "  SELECT rolname, rolpassword::text FROM pg_catalog.pg_authid, pg_catalog.pg_sleep(1)\n"
        "  WHERE rolname = p_user $$;\n",
        dbname="app",
    )
    proc = pgtarn_factory(
        settings={
            "auth_user": auth_role,
            "auth_query": "SELECT usename, passwd FROM public.slow_secret($1)",
        },
        userlist={AUTH_USER: AUTH_PASSWORD},
    )
    outcome: list[object] = []

    def log_in() -> None:
        try:
            outcome.append(logs_in(proc, "scram_user", "scram_pass"))
        except psycopg.Error as exc:
            outcome.append(exc)

    waiter = threading.Thread(target=log_in)
    waiter.start()
    wait_until(lambda: "login attempt" in proc.log_text(), what="login under way")
    reload(proc)
    waiter.join(30)
    assert outcome == [True]


def test_trust_admits_a_role_without_a_password_and_refuses_an_unknown_one(
    pgtarn_factory: PgtarnFactory, auth_role: str
) -> None:
    """auth_type = trust, as PgBouncer: a role auth_query returns is let in even when its
    password is NULL (nothing to check under trust); one it does not return is "no such
    user"."""
    proc = pgtarn_factory(
        settings={
            "auth_type": "trust",
            "auth_user": auth_role,
            # every role it finds, without its password (trust_user: trust in pg_hba)
            "auth_query": "SELECT rolname, NULL::text FROM pg_roles WHERE rolname = $1",
        },
        userlist={AUTH_USER: AUTH_PASSWORD},
    )
    assert logs_in(proc, "trust_user", None)
    assert login_error(proc, "nobody_at_all", None) == ("28000", "no such user")


@pytest.mark.parametrize("auth_type", ["md5", "scram-sha-256", "plain"])
def test_a_role_found_without_a_password_fails_every_password(
    pgtarn_factory: PgtarnFactory, auth_role: str, auth_type: str
) -> None:
    # the default query returns NULL for a role past its VALID UNTIL
    proc = pgtarn_factory(
        settings={
            "auth_type": auth_type,
            "auth_user": auth_role,
            "auth_query": "SELECT rolname, NULL::text FROM pg_roles WHERE rolname = $1",
        },
        userlist={AUTH_USER: AUTH_PASSWORD},
    )
    words = "SASL" if auth_type == "scram-sha-256" else "password"
    for password in ("trust_pass", "", "md5"):
        assert login_error(proc, "trust_user", password) == (
            "28P01",
            f"{words} authentication failed",
        )


def test_an_unknown_role_is_no_such_user_for_a_password_method(
    proc: PgtarnProcess, pg_cluster: TempCluster, auth_role: str
) -> None:
    """PgBouncer's answer when auth_query finds no role: "no such user", before any
    password is asked for (docs/migrating.md, Messages)."""
    assert login_error(proc, "nobody_at_all", "anything") == ("28000", "no such user")
    assert "login failed: db=app user=nobody_at_all" in proc.log_text()


def test_auth_dbname_disabled_or_not_configured_refuses_the_login(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster, auth_role: str
) -> None:
    base = f"host={pg_cluster.host} port={pg_cluster.port}"
    proc = pgtarn_factory(
        databases={
            "app": f"{base} dbname=app auth_dbname=lookups",
            "lookups": f"{base} dbname=postgres",
            "lost": f"{base} dbname=app auth_dbname=nowhere",
        },
        settings={"auth_user": auth_role},
        userlist={AUTH_USER: AUTH_PASSWORD, "app": "app_pass"},
    )
    assert logs_in(proc, "scram_user", "scram_pass")
    with admin(proc) as console:
        console.execute("DISABLE lookups")
        assert login_error(proc, "scram_user", "scram_pass") == (
            "08P01",
            'authentication database "lookups" is disabled',
        )
        console.execute("ENABLE lookups")
    assert logs_in(proc, "scram_user", "scram_pass")
    assert login_error(proc, "scram_user", "scram_pass", dbname="lost") == (
        "08006",
        "bouncer config error",
    )
    assert 'authentication database "nowhere" is not configured' in proc.log_text()


def test_the_admin_console_is_no_auth_dbname(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster, auth_role: str
) -> None:
    """auth_dbname = pgbouncer is refused in the configuration (PgBouncer's words); a
    database entry that names it refuses its logins as a configuration error."""
    base = f"host={pg_cluster.host} port={pg_cluster.port}"
    proc = pgtarn_factory(
        databases={"app": f"{base} dbname=app", "odd": f"{base} dbname=app auth_dbname=pgbouncer"},
        settings={"auth_user": auth_role},
        userlist={AUTH_USER: AUTH_PASSWORD, "app": "app_pass"},
    )
    reserved = 'cannot use the reserved "pgbouncer" database as an auth_dbname'
    assert login_error(proc, "scram_user", "scram_pass", dbname="odd") == (
        "08006",
        "bouncer config error",
    )
    assert reserved in proc.log_text()
    with admin(proc) as console:
        with pytest.raises(psycopg.Error, match="reserved"):
            console.execute("SET auth_dbname = 'pgbouncer'")
        text = Path(proc.ini_path).read_text(encoding="utf-8")
        Path(proc.ini_path).write_text(
            text.replace("[pgbouncer]\n", "[pgbouncer]\nauth_dbname = pgbouncer\n")
        )
        with pytest.raises(psycopg.Error, match="RELOAD failed"):
            console.execute("RELOAD")
        failed = [
            line
            for line in proc.log_text().splitlines()
            if "reload failed, keeping the old configuration" in line
        ]
        assert failed and failed[-1].endswith(f"auth_dbname: {reserved}")
        config = {r["key"]: r["value"] for r in show(console, "CONFIG")}
        assert config["auth_dbname"] == ""


def test_admin_console_logins_are_looked_up_through_the_global_auth_dbname(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster, auth_role: str
) -> None:
    """A user of stats_users that auth_file does not name logs in to the admin console with
    the secret auth_query finds in auth_dbname; without an auth_dbname there is nowhere to
    look (the console is no database of PostgreSQL's): a configuration error."""
    base = f"host={pg_cluster.host} port={pg_cluster.port}"
    databases = {"app": f"{base} dbname=app", "lookups": f"{base} dbname=postgres"}
    settings: dict[str, object] = {
        "auth_user": auth_role,
        "stats_users": "md5_user",
        "auth_type": "md5",
    }
    proc = pgtarn_factory(
        databases=databases,
        settings={**settings, "auth_dbname": "lookups"},
        userlist={AUTH_USER: AUTH_PASSWORD, "app": "app_pass"},
    )
    with admin(proc, "md5_user", "md5_pass") as console:
        assert show(console, "VERSION")
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        admin(proc, "md5_user", "wrong").close()
    proc = pgtarn_factory(
        databases=databases,
        settings=settings,
        userlist={AUTH_USER: AUTH_PASSWORD, "app": "app_pass"},
    )
    with pytest.raises(psycopg.OperationalError, match="bouncer config error"):
        admin(proc, "md5_user", "md5_pass").close()
    assert 'cannot use the reserved "pgbouncer" database as an auth_dbname' in proc.log_text()


def test_a_failing_auth_query_is_a_configuration_error(
    pgtarn_factory: PgtarnFactory, auth_role: str
) -> None:
    """As PgBouncer: the client is told "bouncer config error", the log has PostgreSQL's
    error; another login asks again (the connection stays usable)."""
    proc = pgtarn_factory(
        settings={
            "auth_user": auth_role,
            "auth_query": "SELECT usename, passwd FROM no_such_table WHERE usename = $1",
        },
        userlist={AUTH_USER: AUTH_PASSWORD},
    )
    for _ in range(2):
        assert login_error(proc, "scram_user", "scram_pass") == ("08006", "bouncer config error")
    assert 'relation "no_such_table" does not exist' in proc.log_text()
    proc = pgtarn_factory(
        settings={
            "auth_user": auth_role,
            "auth_query": "SELECT passwd FROM pg_shadow WHERE usename = $1",
        },
        userlist={AUTH_USER: AUTH_PASSWORD},
    )
    assert login_error(proc, "scram_user", "scram_pass") == ("08006", "bouncer config error")
    assert "auth_query must return two columns" in proc.log_text()


def test_the_lookup_runs_with_the_roles_own_search_path(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster, auth_role: str
) -> None:
    """The lookup connection takes auth_user's and the database's own settings, as a
    connection of that role would (PgBouncer's): a query may call a function of public
    unqualified. (The client's settings never reach it: see the test above.)"""
    pg_cluster.psql(
        "CREATE OR REPLACE FUNCTION public.aq_secret(p_user text, OUT usename name,\n"
        "  OUT passwd text) RETURNS SETOF record LANGUAGE sql AS $$\n"
        "  SELECT rolname, rolpassword::text FROM pg_catalog.pg_authid\n"
        "  WHERE rolname = p_user $$;\n",
        dbname="app",
    )
    try:
        proc = pgtarn_factory(
            settings={
                "auth_user": auth_role,
                "auth_query": "SELECT * FROM aq_secret($1)",
                "track_extra_parameters": "search_path",
            },
            userlist={AUTH_USER: AUTH_PASSWORD},
        )
        assert logs_in(proc, "scram_user", "scram_pass", options="-c search_path=pg_catalog")
    finally:
        pg_cluster.psql("DROP FUNCTION public.aq_secret(text)", dbname="app")
