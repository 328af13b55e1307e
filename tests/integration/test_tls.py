"""TLS towards clients: each client_tls_sslmode, client certificates, cert auth, direct TLS."""

from __future__ import annotations

import contextlib
import re
import socket
import ssl
import subprocess
import threading
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgtarn.auth.endpoint import certificate_hash
from pgtarn.auth.scram import ScramClient
from pgtarn.proto import build
from pgtarn.proto.server_login import ServerAuth
from tests.support import PgtarnProcess, TempCluster

from .certs import Pki
from .conftest import PgtarnFactory
from .drivers import connect
from .fakepg import FakePostgres
from .faultproxy import FaultProxy
from .pgstat import wait_until
from .rawpg import RawClient
from .test_admin import admin, show
from .test_auth import login_error
from .test_reload import edit_ini, reload
from .test_timeouts import final_error, query, raw_login

pytestmark = pytest.mark.integration


def tls_settings(pki: Pki, mode: str, **more: object) -> dict[str, object]:
    return {
        "client_tls_sslmode": mode,
        "client_tls_cert_file": pki.server.cert,
        "client_tls_key_file": pki.server.key,
        **more,
    }


def tls_in_use(conn: psycopg.Connection[Any]) -> bool:
    return bool(conn.pgconn.ssl_in_use)


def client_cert(pki: Pki, name: str) -> dict[str, str]:
    issued = pki.clients[name]
    return {"sslcert": issued.cert, "sslkey": issued.key}


def client_context(pki: Pki, name: str | None) -> ssl.SSLContext:
    """A TLS client context trusting the test CA, with the client certificate of name."""
    context = ssl.create_default_context(cafile=pki.ca)
    if name is not None:
        context.load_cert_chain(pki.clients[name].cert, pki.clients[name].key)
    return context


def refused(proc: PgtarnProcess, **kw: Any) -> psycopg.OperationalError:
    with pytest.raises(psycopg.OperationalError) as info:
        connect(proc, **kw).close()
    return info.value


@pytest.mark.parametrize("mode", ["allow", "prefer"])
def test_allow_and_prefer_serve_tls_and_plaintext_clients(
    pgtarn_factory: PgtarnFactory, pki: Pki, mode: str
) -> None:
    proc = pgtarn_factory(settings=tls_settings(pki, mode))
    with connect(proc, sslmode="require") as secure, connect(proc, sslmode="disable") as plain:
        assert tls_in_use(secure) and not tls_in_use(plain)
        assert secure.execute("select 1").fetchone() == (1,)
        assert plain.execute("select 2").fetchone() == (2,)
        with admin(proc) as console:
            tls = {r["port"]: r["tls"] for r in show(console, "CLIENTS") if r["user"] == "app"}
        # the console connection (libpq's default sslmode, prefer) is encrypted too
        assert sorted(bool(v) for v in tls.values()) == [False, True, True]
        assert any(v.startswith("TLSv1.3/") for v in tls.values())


def test_disable_answers_no_to_tls(pgtarn_factory: PgtarnFactory, pki: Pki) -> None:
    proc = pgtarn_factory(settings=tls_settings(pki, "disable"))
    assert "server does not support SSL" in str(refused(proc, sslmode="require"))
    with connect(proc, sslmode="prefer") as conn:
        assert not tls_in_use(conn)


def test_require_refuses_plaintext_tcp_but_not_unix_sockets(
    pgtarn_factory: PgtarnFactory, pki: Pki
) -> None:
    proc = pgtarn_factory(settings=tls_settings(pki, "require"))
    assert "SSL required" in str(refused(proc, sslmode="disable"))
    raw = RawClient(proc.host, proc.port)
    raw.startup(user="app", database="app")
    assert final_error(raw) == {"S": "FATAL", "V": "FATAL", "C": "28000", "M": "SSL required"}
    with connect(proc, sslmode="require") as conn:
        assert tls_in_use(conn) and conn.execute("select 1").fetchone() == (1,)
    local = psycopg.connect(
        host=proc.socket_dir, port=proc.port, user="app", password="app_pass", dbname="app"
    )
    with local:
        assert local.execute("select 3").fetchone() == (3,)


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
def test_clients_verify_pgtarn_certificate(
    pgtarn_factory: PgtarnFactory, pki: Pki, host: str
) -> None:
    proc = pgtarn_factory(settings=tls_settings(pki, "require"))
    dsn = proc.dsn("app", "app_pass").replace("host=127.0.0.1", f"host={host}")
    with psycopg.connect(dsn, sslmode="verify-full", sslrootcert=pki.ca) as conn:
        assert tls_in_use(conn)
    with pytest.raises(psycopg.OperationalError) as info:
        psycopg.connect(dsn, sslmode="verify-ca", sslrootcert=pki.other_ca).close()
    assert "certificate verify failed" in str(info.value)


def test_verify_ca_needs_a_client_certificate_from_the_ca(
    pgtarn_factory: PgtarnFactory, pki: Pki
) -> None:
    proc = pgtarn_factory(settings=tls_settings(pki, "verify-ca", client_tls_ca_file=pki.ca))
    refused(proc, sslmode="require")  # no certificate: the handshake fails
    refused(proc, sslmode="require", sslcert=pki.stranger.cert, sslkey=pki.stranger.key)
    with connect(proc, sslmode="require", **client_cert(pki, "app")) as conn:
        assert conn.execute("select 1").fetchone() == (1,)
    # verify-ca: any certificate of the CA will do, whatever its name
    with connect(
        proc, "scram_user", "scram_pass", sslmode="require", **client_cert(pki, "app")
    ) as conn:
        assert conn.execute("select 1").fetchone() == (1,)
    assert "TLS failed" in proc.log_text()


def test_verify_full_needs_the_certificate_of_the_user(
    pgtarn_factory: PgtarnFactory, pki: Pki
) -> None:
    proc = pgtarn_factory(settings=tls_settings(pki, "verify-full", client_tls_ca_file=pki.ca))
    with connect(proc, sslmode="require", **client_cert(pki, "app")) as conn:
        assert conn.execute("select 1").fetchone() == (1,)
    error = refused(
        proc, user="scram_user", password="scram_pass", sslmode="require", **client_cert(pki, "app")
    )
    assert "certificate authentication failed" in str(error)
    raw = RawClient(proc.host, proc.port)
    raw.start_tls(client_context(pki, "app"))
    raw.startup(user="scram_user", database="app")
    assert final_error(raw)["C"] == "28000"


def test_auth_type_cert_logs_in_the_user_named_by_the_certificate(
    pgtarn_factory: PgtarnFactory, pki: Pki
) -> None:
    proc = pgtarn_factory(
        settings=tls_settings(pki, "require", client_tls_ca_file=pki.ca, auth_type="cert")
    )
    with connect(proc, password=None, sslmode="require", **client_cert(pki, "app")) as conn:
        assert conn.execute("select current_user").fetchone() == ("app",)
    error = refused(
        proc, user="scram_user", password=None, sslmode="require", **client_cert(pki, "app")
    )
    assert "certificate authentication failed" in str(error)
    error = refused(proc, password=None, sslmode="require")  # no certificate at all
    assert "requires a valid client certificate" in str(error)
    raw = RawClient(proc.host, proc.port)
    raw.start_tls(client_context(pki, None))
    raw.startup(user="app", database="app")
    assert final_error(raw)["C"] == "28000"


@pytest.mark.parametrize(
    ("sslmode", "encrypted"),
    [
        ("disable", False),
        ("allow", False),
        ("prefer", True),
        ("require", True),
        ("verify-ca", True),
        ("verify-full", True),
    ],
)
def test_psql_in_each_sslmode(
    pgtarn_factory: PgtarnFactory, pki: Pki, sslmode: str, encrypted: bool
) -> None:
    proc = pgtarn_factory(settings=tls_settings(pki, "prefer"))
    out = subprocess.run(
        [
            "psql",
            "-X",
            "-c",
            "\\conninfo",
            "-c",
            "select 'served'",
            proc.dsn("app", "app_pass", sslmode=sslmode, sslrootcert=pki.ca),
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert "served" in out.stdout
    assert ("SSL connection (protocol: TLSv1.3" in out.stdout) is encrypted, out.stdout


def direct(proc: PgtarnProcess, pki: Pki, alpn: list[str] | None) -> RawClient:
    context = ssl.create_default_context(cafile=pki.ca)
    if alpn is not None:
        context.set_alpn_protocols(alpn)
    return RawClient.direct_tls(proc.host, proc.port, context)


def test_direct_tls_with_alpn_logs_in(pgtarn_factory: PgtarnFactory, pki: Pki) -> None:
    proc = pgtarn_factory(settings=tls_settings(pki, "require"))
    with connect(proc, sslmode="require", sslnegotiation="direct") as conn:
        assert tls_in_use(conn) and conn.execute("select 1").fetchone() == (1,)
    raw = direct(proc, pki, ["postgresql"])
    login = ServerAuth("app", "app_pass")
    # the startup packet right behind the handshake: nothing read early is lost
    raw.send(build.startup_message({"user": "app", "database": "app"}))
    while not login.done:
        reply = login.feed(*(lambda m: (ord(m[0]), m[1]))(raw.read_message()))
        if reply:
            raw.send(reply)
    assert query(raw, "select 1") == b"I"
    raw.close()
    raw = direct(proc, pki, None)  # no ALPN: refused, as PostgreSQL 17 does
    fields = final_error(raw)
    assert fields["C"] == "08P01" and "ALPN" in fields["M"]


def test_direct_tls_is_closed_when_tls_is_off(pgtarn_factory: PgtarnFactory) -> None:
    proc = pgtarn_factory()
    with pytest.raises(psycopg.OperationalError):
        connect(proc, sslmode="require", sslnegotiation="direct").close()
    with connect(proc) as conn:
        assert conn.execute("select 1").fetchone() == (1,)
    assert "direct TLS connection, but client TLS is disabled" in proc.log_text()


def drain(sock: socket.socket) -> None:
    """Read until pgtarn closes the connection (which it must)."""
    sock.settimeout(10)
    with contextlib.suppress(ConnectionResetError):
        while sock.recv(65536):
            pass


def test_broken_handshakes_leave_everyone_else_served(
    pgtarn_factory: PgtarnFactory, pki: Pki
) -> None:
    proc = pgtarn_factory(settings=tls_settings(pki, "prefer"))
    with connect(proc, sslmode="require") as steady:
        for garbage in (b"\x16\x03\x01\x00\x05hello", b"\x00" * 100, b"\x16" + b"\xff" * 4000):
            with socket.create_connection((proc.host, proc.port), timeout=10) as sock:
                sock.sendall(build.SSL_REQUEST)
                assert sock.recv(1) == b"S"
                sock.sendall(garbage)
                drain(sock)
        with socket.create_connection((proc.host, proc.port), timeout=10) as sock:
            # a whole record, but a ServerHello sent to a server: direct TLS that fails
            sock.sendall(b"\x16\x03\x01\x00\x04\x02\x00\x00\x00")
            drain(sock)
        assert steady.execute("select 1").fetchone() == (1,)
        with admin(proc) as console:
            assert [r["user"] for r in show(console, "CLIENTS")] == ["app", "app"]  # none left
    assert proc.log_text().count("TLS failed") >= 4


# --- towards PostgreSQL -------------------------------------------------------------------


#: auth_file for the TLS cluster's roles.
TLS_USERLIST = {"app": "app_pass", "scram_user": "scram_pass", "tls_only": "tls_only_pass"}


def tls_database(
    cluster: TempCluster, host: str | None = None, port: int | None = None, **more: str
) -> dict[str, str]:
    """[databases] with app on the TLS cluster."""
    extra = "".join(f" {key}={value}" for key, value in more.items())
    return {"app": f"host={host or cluster.host} port={port or cluster.port} dbname=app{extra}"}


def backend_ssl(conn: psycopg.Connection[Any]) -> bool:
    """Whether the PostgreSQL backend serving conn (through pgtarn) is on TLS."""
    row = conn.execute("select ssl from pg_stat_ssl where pid = pg_backend_pid()").fetchone()
    assert row is not None
    return bool(row[0])


@pytest.mark.parametrize("mode", ["allow", "prefer", "require", "verify-ca", "verify-full"])
def test_server_tls_modes_against_a_tls_postgresql(
    pgtarn_factory: PgtarnFactory, pg_tls_cluster: TempCluster, pki: Pki, mode: str
) -> None:
    proc = pgtarn_factory(
        databases=tls_database(pg_tls_cluster),
        userlist=TLS_USERLIST,
        settings={"server_tls_sslmode": mode, "server_tls_ca_file": pki.ca},
    )
    with connect(proc) as conn:
        assert backend_ssl(conn)
        with admin(proc) as console:
            servers = [r for r in show(console, "SERVERS") if r["database"] == "app"]
        assert servers and all(r["tls"].startswith("TLSv1.3/") for r in servers)
    # a role PostgreSQL lets in over TLS only
    with connect(proc, "tls_only", "tls_only_pass") as conn:
        assert conn.execute("select current_user").fetchone() == ("tls_only",)


def test_server_tls_off_meets_postgresql_hostssl_rules(
    pgtarn_factory: PgtarnFactory, pg_tls_cluster: TempCluster
) -> None:
    proc = pgtarn_factory(
        databases=tls_database(pg_tls_cluster),
        userlist=TLS_USERLIST,
        settings={"server_tls_sslmode": "disable"},
    )
    with connect(proc) as conn:
        assert not backend_ssl(conn)
    with pytest.raises(psycopg.OperationalError) as info:
        connect(proc, "tls_only", "tls_only_pass").close()
    assert "no encryption" in str(info.value) or "rejects connection" in str(info.value)


#: A TLS failure towards PostgreSQL is retried while clients wait, as PgBouncer does: they
#: end at query_wait_timeout, told the last error (short here, not to wait 120 s).
TLS_WAIT = {"query_wait_timeout": 1}


def tls_wait_error(proc: PgtarnProcess) -> str:
    """The message that ends a client's login while the pool's TLS logins fail."""
    sqlstate, message = login_error(proc, "app", "app_pass")
    assert sqlstate == "08P01", message
    assert message.startswith(
        "query_wait_timeout: no server connection became free in 1 s (last error: "
    ), message
    return message


def test_require_against_a_plaintext_postgresql_is_retried_while_clients_wait(
    pgtarn_factory: PgtarnFactory,
) -> None:
    proc = pgtarn_factory(settings={"server_tls_sslmode": "require", **TLS_WAIT})
    assert "server does not support TLS" in tls_wait_error(proc)


def test_verify_ca_refuses_a_certificate_of_another_ca(
    pgtarn_factory: PgtarnFactory, pg_tls_cluster: TempCluster, pki: Pki
) -> None:
    proc = pgtarn_factory(
        databases=tls_database(pg_tls_cluster),
        settings={
            "server_tls_sslmode": "verify-ca",
            "server_tls_ca_file": pki.other_ca,
            **TLS_WAIT,
        },
    )
    assert "certificate verify failed" in tls_wait_error(proc)
    assert re.search(
        r"S-\d+: \S+ closing because: could not connect to server: TLS: .*"
        "certificate verify failed",
        proc.log_text(),
    )


def test_a_waiting_client_is_served_once_the_servers_certificate_is_accepted(
    pgtarn_factory: PgtarnFactory, pg_tls_cluster: TempCluster, pki: Pki
) -> None:
    """The client waits through the failing TLS logins (PgBouncer's test_server_ssl_verify)
    and is served by the first one after SET server_tls_ca_file names the right CA."""
    proc = pgtarn_factory(
        databases=tls_database(pg_tls_cluster),
        settings={"server_tls_sslmode": "verify-ca", "server_tls_ca_file": pki.other_ca},
    )
    logged_in: list[RawClient] = []
    waiter = threading.Thread(target=lambda: logged_in.append(raw_login(proc)))
    waiter.start()  # its login waits for the first server's welcome
    try:
        wait_until(
            lambda: "certificate verify failed" in proc.log_text(), what="a TLS login refused"
        )
        assert waiter.is_alive()  # still waiting, not refused
        with admin(proc) as console:
            console.execute(f"SET server_tls_ca_file = '{pki.ca}'")
    finally:
        waiter.join(30)
    assert query(logged_in[0], "select 1") == b"I"
    logged_in[0].close()


def test_verify_full_checks_the_host_name(
    pgtarn_factory: PgtarnFactory, pg_tls_cluster: TempCluster, pki: Pki
) -> None:
    # 127.0.0.2 reaches the same PostgreSQL, but its certificate is not for that address
    with FaultProxy(pg_tls_cluster.host, pg_tls_cluster.port, listen_host="127.0.0.2") as proxy:
        for mode, works in (("verify-ca", True), ("verify-full", False)):
            proc = pgtarn_factory(
                databases=tls_database(pg_tls_cluster, proxy.host, proxy.port),
                settings={"server_tls_sslmode": mode, "server_tls_ca_file": pki.ca, **TLS_WAIT},
            )
            if works:
                raw = raw_login(proc)
                assert query(raw, "select 1") == b"I"
                raw.close()
                continue
            assert "IP address mismatch" in tls_wait_error(proc)


def test_server_certificate_login_without_a_password(
    pgtarn_factory: PgtarnFactory, pg_tls_cluster: TempCluster, pki: Pki
) -> None:
    # pgtarn presents cert_user's certificate; PostgreSQL's rule for it is "cert"
    issued = pki.clients["cert_user"]
    proc = pgtarn_factory(
        databases=tls_database(pg_tls_cluster),
        settings={
            "server_tls_sslmode": "verify-full",
            "server_tls_ca_file": pki.ca,
            "server_tls_cert_file": issued.cert,
            "server_tls_key_file": issued.key,
            "auth_type": "trust",
        },
        userlist={"cert_user": "", "app": "app_pass"},
    )
    with connect(proc, "cert_user", None) as conn:
        assert conn.execute("select current_user").fetchone() == ("cert_user",)


def test_data_injected_before_the_handshake_is_refused(
    pgtarn_factory: PgtarnFactory, fake_pg: FakePostgres
) -> None:
    fake_pg.tls_answer = b"SZ\x00\x00\x00\x05I"  # 'S', then plaintext posing as a reply
    proc = pgtarn_factory(
        databases={"app": fake_pg.connstr("app")}, settings={"server_tls_sslmode": "require"}
    )
    sqlstate, message = login_error(proc, "app", "app_pass")
    assert sqlstate == "08P01" and "unencrypted data after accepting TLS" in message


# --- SCRAM-SHA-256-PLUS -------------------------------------------------------------------


def test_clients_requiring_channel_binding_log_in(
    pgtarn_factory: PgtarnFactory, pki: Pki, pg_cluster: TempCluster
) -> None:
    # a plaintext secret and, through SCRAM passthrough, a stored verifier
    proc = pgtarn_factory(
        settings=tls_settings(pki, "require"),
        userlist={"app": "app_pass", "scram_user": pg_cluster.scram_verifier("scram_user")},
    )
    for user, password in (("app", "app_pass"), ("scram_user", "scram_pass")):
        with connect(proc, user, password, sslmode="require", channel_binding="require") as conn:
            assert conn.execute("select current_user").fetchone() == (user,)
    # libpq itself refuses channel_binding=require without TLS
    with pytest.raises(psycopg.OperationalError):
        connect(proc, sslmode="disable", channel_binding="require").close()


def sasl_plus_login(proc: PgtarnProcess, pki: Pki, binding: bytes) -> dict[str, str]:
    """A SCRAM-SHA-256-PLUS login whose proof is bound to binding; the final error."""
    raw = RawClient(proc.host, proc.port)
    raw.start_tls(client_context(pki, None))
    raw.startup(user="app", database="app")
    kind, body = raw.read_message()
    assert kind == "R" and b"SCRAM-SHA-256-PLUS\x00" in body  # offered over TLS
    scram = ScramClient("app_pass", channel_binding=binding)
    raw.send(build.sasl_initial_response("SCRAM-SHA-256-PLUS", scram.client_first()))
    kind, body = raw.read_message()
    assert kind == "R"
    raw.send(build.sasl_response(scram.handle_server_first(body[4:])))
    return final_error(raw)


def test_a_proof_bound_to_another_channel_is_refused(
    pgtarn_factory: PgtarnFactory, pki: Pki
) -> None:
    # what a client behind a TLS-terminating man in the middle would send: the binding of the
    # certificate it was shown, not pgtarn's
    proc = pgtarn_factory(settings=tls_settings(pki, "require"))
    with open(pki.wrong_host.cert) as f:
        other = certificate_hash(ssl.PEM_cert_to_DER_cert(f.read()))
    assert other is not None
    fields = sasl_plus_login(proc, pki, other)
    assert fields["C"] == "08P01" and "channel binding check failed" in fields["M"]


@pytest.mark.parametrize("mode", ["prefer", "require"])
def test_channel_binding_towards_postgresql(
    pgtarn_factory: PgtarnFactory, pg_tls_cluster: TempCluster, pki: Pki, mode: str
) -> None:
    # plaintext secret, and passthrough with only the verifier: both bind to PostgreSQL's TLS
    proc = pgtarn_factory(
        databases=tls_database(pg_tls_cluster),
        userlist={"app": "app_pass", "scram_user": pg_tls_cluster.scram_verifier("scram_user")},
        settings={
            **tls_settings(pki, "require"),
            "server_tls_sslmode": "verify-full",
            "server_tls_ca_file": pki.ca,
            "server_channel_binding": mode,
        },
    )
    for user, password in (("app", "app_pass"), ("scram_user", "scram_pass")):
        with connect(proc, user, password, sslmode="require", channel_binding="require") as conn:
            assert conn.execute("select current_user").fetchone() == (user,)
            assert backend_ssl(conn)


@pytest.mark.parametrize("server_tls", ["disable", "require"])
def test_server_channel_binding_require_refuses_an_unbound_server(
    pgtarn_factory: PgtarnFactory, pg_tls_cluster: TempCluster, server_tls: str
) -> None:
    proc = pgtarn_factory(
        databases=tls_database(pg_tls_cluster),
        userlist=TLS_USERLIST,
        settings={
            "server_tls_sslmode": server_tls,
            "server_channel_binding": "require",
            **TLS_WAIT,
        },
    )
    if server_tls == "require":  # TLS, so PostgreSQL offers -PLUS: fine
        with connect(proc) as conn:
            assert conn.execute("select 1").fetchone() == (1,)
        return
    assert "channel binding is required" in tls_wait_error(proc)


def test_client_tls_protocols_and_ciphers(pgtarn_factory: PgtarnFactory, pki: Pki) -> None:
    def protocols_in_use(proc: PgtarnProcess) -> set[str]:
        with admin(proc, sslmode="require") as console:
            return {r["tls"].split("/")[0] for r in show(console, "CLIENTS")}

    proc = pgtarn_factory(
        settings=tls_settings(
            pki, "require", client_tls_protocols="tlsv1.3", client_tls_ciphers="secure"
        )
    )
    with connect(proc, sslmode="require"):
        assert protocols_in_use(proc) == {"TLSv1.3"}
    assert "SSL" in str(refused(proc, sslmode="require", ssl_max_protocol_version="TLSv1.2"))
    proc = pgtarn_factory(settings=tls_settings(pki, "require", client_tls_protocols="tlsv1.2"))
    with connect(proc, sslmode="require"):
        assert protocols_in_use(proc) == {"TLSv1.2"}


def test_reload_with_new_server_tls_settings_replaces_servers(
    pgtarn_factory: PgtarnFactory, pg_tls_cluster: TempCluster
) -> None:
    proc = pgtarn_factory(
        databases=tls_database(pg_tls_cluster),
        userlist=TLS_USERLIST,
        settings={"server_tls_sslmode": "disable"},
    )
    with connect(proc, autocommit=True) as conn:
        assert not backend_ssl(conn)  # an idle server without TLS is left behind
        reload(proc, edit_ini(proc, "server_tls_sslmode = disable", "server_tls_sslmode = require"))
        assert backend_ssl(conn)  # its next transaction gets a server made under the new ones
    # the idle one was closed with PgBouncer's words for it
    assert "closing because: database configuration changed" in proc.log_text()


def console_notices(console: psycopg.Connection[Any]) -> list[str]:
    notices: list[str] = []
    console.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
    return notices


def test_a_set_tls_key_waits_for_its_certificate(pgtarn_factory: PgtarnFactory, pki: Pki) -> None:
    """As PgBouncer: SET of a key before its certificate is taken with a NOTICE; the running
    TLS serves until the pair loads, then the new one does."""
    proc = pgtarn_factory(settings=tls_settings(pki, "require"))
    verify_full = {"sslmode": "verify-full", "sslrootcert": pki.ca}
    with admin(proc) as console:
        notices = console_notices(console)
        cur = console.execute(f"SET client_tls_key_file = '{pki.wrong_host.key}'")
        assert (cur.statusmessage or "").startswith("SET client_tls_key_file=")
        assert notices == ["TLS settings could not be applied, still using old configuration"]
        config = {r["key"]: r["value"] for r in show(console, "CONFIG")}
        assert config["client_tls_key_file"] == pki.wrong_host.key
        with connect(proc, **verify_full) as conn:  # still the certificate for 127.0.0.1
            assert tls_in_use(conn)
        console.execute(f"SET client_tls_cert_file = '{pki.wrong_host.cert}'")
        assert len(notices) == 1  # the pair loads
        assert "does not match host name" in str(refused(proc, **verify_full))  # the other host
        with connect(proc, sslmode="verify-ca", sslrootcert=pki.ca) as conn:
            assert tls_in_use(conn)
    assert "ERROR TLS setup failed: client_tls_cert_file: cannot load" in proc.log_text()


def test_a_set_of_other_tls_settings_that_cannot_be_loaded_is_refused(
    pgtarn_factory: PgtarnFactory, pki: Pki
) -> None:
    proc = pgtarn_factory(settings=tls_settings(pki, "require"))
    with admin(proc) as console:
        # verify-full needs a CA file: nothing the next SET of a file would complete
        with pytest.raises(psycopg.errors.ProtocolViolation, match="SET failed"):
            console.execute("SET client_tls_sslmode = 'verify-full'")
        assert {r["key"]: r["value"] for r in show(console, "CONFIG")}[
            "client_tls_sslmode"
        ] == "require"


def test_a_reload_with_a_missing_tls_file_logs_tls_setup_failed(
    pgtarn_factory: PgtarnFactory, pki: Pki, tmp_path: Path
) -> None:
    proc = pgtarn_factory(settings=tls_settings(pki, "require"))
    missing = str(tmp_path / "missing.crt")
    reload(proc, edit_ini(proc, pki.server.cert, missing), marker="reload failed")
    log = proc.log_text()
    assert "ERROR TLS setup failed: client_tls_cert_file: cannot load" in log
    assert "No such file or directory" in log
    with connect(proc, sslmode="require") as conn:  # the old configuration is kept
        assert tls_in_use(conn)


def test_client_tls13_ciphers_choose_the_suite(pgtarn_factory: PgtarnFactory, pki: Pki) -> None:
    def suites_in_use(proc: PgtarnProcess) -> set[str]:
        with admin(proc, sslmode="require") as console:
            return {r["tls"] for r in show(console, "CLIENTS") if r["database"] == "app"}

    chacha, aes = "TLS_CHACHA20_POLY1305_SHA256", "TLS_AES_256_GCM_SHA384"
    proc = pgtarn_factory(
        settings=tls_settings(
            pki, "require", client_tls_protocols="tlsv1.3", client_tls13_ciphers=chacha
        )
    )
    with connect(proc, sslmode="require"):
        assert suites_in_use(proc) == {f"TLSv1.3/{chacha}"}
    assert f"tls=TLSv1.3/{chacha}" in proc.log_text()  # the login line, as PgBouncer's
    with admin(proc) as console:
        notices = console_notices(console)
        console.execute(f"SET client_tls13_ciphers = '{aes}'")
        with connect(proc, sslmode="require"):
            assert suites_in_use(proc) == {f"TLSv1.3/{aes}"}
        # as PgBouncer: taken with a NOTICE, the suites in force stay
        console.execute("SET client_tls13_ciphers = 'unknown'")
        assert notices == ["TLS settings could not be applied, still using old configuration"]
        with connect(proc, sslmode="require"):
            assert suites_in_use(proc) == {f"TLSv1.3/{aes}"}
    assert (
        "TLS setup failed: client_tls13_ciphers: failed to set the TLSv1.3 cipher "
        "suites: unknown" in proc.log_text()
    )
